"""The ``wandb`` writer: scalars and expert-load histograms to a Weights & Biases run.

The run is ``train.project`` / ``train.run_id`` (see :mod:`.run_id`), named ``train.run_name``,
tagged ``train.tags``, with the resolved config as its config; a resumed run continues it
(``resume="allow"``). Its files go under ``WORKDIR/wandb/`` (or ``$WANDB_DIR``). W&B's own
environment applies: ``WANDB_MODE=offline`` keeps the run on disk (``wandb sync`` uploads it later:
the segments of a resumed run sync into the one run, as they share its id). The loop's step is
logged as ``step`` and is every chart's x axis, so the steps a resume redoes are kept rather
than dropped as out of order.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from moejax.errors import ConfigError
from moejax.train.trackers import RunSettings, histograms, scalars


class WandbWriter:
    def __init__(self, settings: RunSettings):
        import wandb

        self.wandb = wandb
        try:
            self.run = wandb.init(
                project=settings.project, name=settings.run_name, tags=list(settings.tags), id=settings.run_id,
                resume="allow", config=settings.config, dir=os.environ.get("WANDB_DIR") or settings.workdir,
                settings=wandb.Settings(console="off"),  # the loop's own stdout is not copied to W&B
            )
        except Exception as e:  # e.g. no API key for online mode
            raise ConfigError(
                f"train.loggers: the wandb logger could not start W&B run {settings.run_id!r} of project "
                f"{settings.project!r}: {e}. Log in (wandb login), or set WANDB_MODE=offline to keep the "
                "run on disk and upload it later with wandb sync."
            ) from None
        self.run.define_metric("step")
        self.run.define_metric("*", step_metric="step")

    def write(self, step: int, record: dict[str, Any]) -> None:
        values: dict[str, Any] = {"step": step, **scalars(record)}
        for key, loads in histograms(record).items():
            values[key] = self.wandb.Histogram(np_histogram=(loads, np.arange(len(loads) + 1)))
        self.run.log(values)

    def close(self, error: BaseException | None = None) -> None:
        self.run.finish(exit_code=0 if error is None else 1)


def open_writer(settings: RunSettings) -> WandbWriter:
    return WandbWriter(settings)
