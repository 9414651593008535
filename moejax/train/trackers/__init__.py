"""Metric writers ("loggers") behind one small interface, chosen by ``train.loggers``.

A writer receives each logged step's record, ``{"step": ..., name: value}`` with plain values
(floats, ints, strings, nested lists), and keeps what it can show:

- ``jsonl``: the whole record, one JSON line in ``WORKDIR/metrics.jsonl`` (always on);
- ``tensorboard``: scalars and expert-load histograms, event files in ``WORKDIR`` (tensorboardX);
- ``wandb``: scalars and expert-load histograms, to a Weights & Biases run;
- ``mlflow``: scalars, to an MLflow run.

Every writer gets the same scalars (:func:`scalars`: the record's finite numbers) and, where it
shows histograms, the same ones (:func:`histograms`). A writer of an optional package is
imported only when chosen, and :func:`check_installed` says before anything is compiled that a
chosen one is missing. W&B and MLflow runs are named by one id per workdir (:mod:`.run_id`), so a
resumed run continues the same run.

A new writer is one module with ``open_writer(settings) -> Writer`` and one line in
:data:`WRITERS` (and its name in ``moejax.config.LOGGERS``).
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import math
import os
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from moejax import config as config_lib
from moejax.errors import ConfigError

# name -> (module of this package, the package it needs, or "" for none beyond the base install)
WRITERS: dict[str, tuple[str, str]] = {
    "jsonl": ("jsonl", ""),
    "tensorboard": ("tensorboard", "tensorboardX"),
    "wandb": ("wandb_writer", "wandb"),
    "mlflow": ("mlflow_writer", "mlflow"),
}
# The per-expert loads a record holds ([layer][expert] lists), shown as histograms.
HISTOGRAM_KEYS = ("expert_load", "expert_load_global")
INSTALL = 'pip install "moejax[track]"'


class Writer(Protocol):
    """Where logged records go."""

    def write(self, step: int, record: dict[str, Any]) -> None:
        """Keeps one logged step's record (plain values; ``record["step"] == step``)."""

    def close(self, error: BaseException | None = None) -> None:
        """Flushes and ends; ``error``: what stopped the run, or None when it ended normally."""


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """What a writer needs to know about the run (from ``train.*`` and the workdir)."""

    workdir: str
    project: str
    run_name: str
    tags: tuple[str, ...]
    run_id: str  # the W&B/MLflow run to log to (see .run_id)
    mlflow_uri: str
    config: dict[str, Any]  # the resolved config, as config.json holds it


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """The record's scalars every writer gets: its finite numbers, ``step`` left out."""
    return {key: value for key, value in record.items()
            if isinstance(value, (int, float)) and key != "step" and math.isfinite(value)}


def histograms(record: dict[str, Any]) -> dict[str, np.ndarray]:
    """``{"expert_load/layer_<i>": loads [E], "expert_load_global/layer_<i>": ...}``: each MoE
    layer's load per expert (the share of routed assignments each expert took, this step and over
    the recent window), for the writers that show histograms: a histogram over the expert index
    whose bucket ``e`` holds expert ``e``'s load."""
    out = {}
    for key in HISTOGRAM_KEYS:
        for layer, loads in enumerate(record.get(key) or ()):
            out[f"{key}/layer_{layer}"] = np.asarray(loads, np.float64)
    return out


def chosen(loggers: str) -> tuple[str, ...]:
    """The writer names of ``train.loggers`` (checked by ``moejax.config``), in order, each once."""
    return tuple(dict.fromkeys(config_lib.split_list(loggers)))


def check_installed(loggers: str) -> None:
    """A ``ConfigError`` naming the logger and the install command if a chosen writer's package
    is missing (checked without importing it)."""
    for name in chosen(loggers):
        if name not in WRITERS:
            raise ConfigError(f"config key 'train.loggers' has value {loggers!r}: {name!r} is not a logger; "
                              f"allowed: {' | '.join(WRITERS)}.")
        package = WRITERS[name][1]
        if package and importlib.util.find_spec(package) is None:
            raise ConfigError(
                f"config key 'train.loggers' has value {loggers!r}: the {name} logger needs the "
                f"{package} package, which is not installed. Install the trackers with {INSTALL}, "
                f"or leave {name} out of train.loggers."
            )


def settings_from_config(cfg, workdir: str) -> RunSettings:
    """The writers' settings from ``cfg.train`` and ``workdir``; the run id from :mod:`.run_id`."""
    from moejax.train.trackers.run_id import resolve_run_id

    t = cfg.train
    needs_id = bool({"wandb", "mlflow"} & set(chosen(t.loggers)))
    return RunSettings(
        workdir=workdir, project=t.project,
        run_name=t.run_name or os.path.basename(os.path.abspath(workdir)),
        tags=config_lib.split_list(t.tags),
        run_id=resolve_run_id(t.run_id, workdir) if needs_id else t.run_id,
        mlflow_uri=t.mlflow_uri, config=config_lib.to_dict(cfg),
    )


def open_writers(names: Sequence[str], settings: RunSettings) -> list[Writer]:
    """The writers ``names``, opened in order; if one fails to open, those already open are
    closed with its error."""
    check_installed(",".join(names))
    writers: list[Writer] = []
    try:
        for name in names:
            module = importlib.import_module(f"{__name__}.{WRITERS[name][0]}")
            writers.append(module.open_writer(settings))
    except BaseException as error:
        for writer in writers:
            writer.close(error)
        raise
    return writers
