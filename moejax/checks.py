"""Every check of a config before anything is compiled, composed from the packages that own them.

Each check lives with what it knows about, and this module calls them in this order, after
``moejax.derive.derive_from_dataset`` has filled in what the dataset decides (the vocabulary size,
a prepared dataset's own mixture) when the user did not choose it:

1. ``moejax.config.check_values``: the schema (unknown keys, types, choices) and the generic
   per-key checks; it resolves the mesh shape;
2. ``moejax.model.balancing.check_config``: the balancing objectives build for this model;
3. ``moejax.model.l3.check_config``: L3 positions, table sizes, the allocation file; and
   ``moejax.model.grouped_matmul.check_config``: the chosen grouped matmul's library is installed;
4. ``checkpoint.init_from`` (here): it exists, unless the run resumes its own checkpoints;
5. ``moejax.data.from_config.check_data_config``: the dataset, the mixture or schedule against
   its domains, the vocabulary against its tokenizer.

:func:`validate` runs the first three: everything that needs no dataset (the sweep's planning,
where the runs' data may not exist yet; a Hugging Face import; benchmarks and compile checks).
:func:`check_config` runs all of them: training calls it before building anything, and so does
every run a sweep or MergeMix launches.

Layering: ``moejax.errors`` and ``moejax.schema`` (the typed model configs) import nothing from
moejax, and ``moejax.config`` only those two leaves and ``moejax.configs`` (the built-in config
files, which ``config.load`` finds by name); ``sharding``,
``model`` and ``data`` build on them (the model imports nothing from data or train); this module
composes their checks and sits above them, below ``train``, ``eval`` and ``interop`` (training
and the Hugging Face import call it, as do the sweep's planning and the experiments). A check that
spans packages is added here, not pulled down into ``moejax.config``.
"""

from __future__ import annotations

import os
from typing import Any

import jax

from moejax import config as config_lib
from moejax import paths
from moejax.data.dataset import DatasetInfo
from moejax.data.from_config import check_data_config
from moejax.derive import derive_from_dataset
from moejax.errors import ConfigError
from moejax.model import balancing, grouped_matmul, l3


def validate(cfg, num_devices: int, *, changed: Any = (), notes: bool = True) -> dict[str, int]:
    """The config's checks that need no dataset; returns the resolved mesh shape. Raises ConfigError.

    ``changed``: the keys the command line set. When two keys conflict, the message is about the
    one the user changed (and names the other), not about a default they never touched.
    ``notes``: print notes about training (a shortened warmup); off for commands that only read
    a trained model.
    """
    mesh_shape = config_lib.check_values(cfg, num_devices, changed=changed, notes=notes)
    balancing.check_config(cfg)
    l3.check_config(cfg.model, mesh_shape)
    grouped_matmul.check_config(cfg.model, mesh_shape)
    return mesh_shape


def check_config(cfg, changed: Any = (), workdir: str | None = None) -> tuple[dict[str, int], DatasetInfo]:
    """Everything that can be checked before compiling, on this process's devices; returns the
    resolved mesh shape and what the dataset is (its domains and tokenizer).

    ``changed``: the keys the command line set (messages about two conflicting keys name those).
    ``workdir``: the run's directory; a run that resumes from checkpoints of its own does not read
    ``checkpoint.init_from``, so its existence is checked only for a fresh start."""
    derive_from_dataset(cfg, changed)  # vocab size, a prepared dataset's own mixture: not asked for
    mesh_shape = validate(cfg, jax.device_count(), changed=changed)
    init_from = cfg.checkpoint.init_from
    checkpoints = os.path.join(workdir, "checkpoints") if workdir else ""
    resumes = bool(workdir) and os.path.isdir(checkpoints) and bool(os.listdir(checkpoints))
    if init_from and not resumes and not os.path.isdir(init_from):
        raise ConfigError(f"config key 'checkpoint.init_from' has value {init_from!r}; allowed: '' or a directory "
                          f"that exists (a workdir, its checkpoints/ or one step's directory). Check the "
                          f"path{paths.relative_to_note(init_from)}.")
    data_info, _ = check_data_config(cfg)  # dataset, mixture/schedule domains and weights, vocab vs tokenizer
    return mesh_shape, data_info
