"""The ``tensorboard`` writer: scalars and expert-load histograms as event files in the workdir.

Written with tensorboardX (in the base install); the viewer is the ``tensorboard`` package (the
``track`` extra): ``tensorboard --logdir WORKDIR``.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from moejax.train.trackers import histograms, scalars


class TensorBoardWriter:
    def __init__(self, workdir: str):
        self.summary = summary_writer()(workdir)

    def write(self, step: int, record: dict[str, Any]) -> None:
        for key, value in scalars(record).items():
            self.summary.add_scalar(key, value, step)
        for key, loads in histograms(record).items():
            self._expert_histogram(key, loads, step)
        self.summary.flush()

    def _expert_histogram(self, tag: str, loads: np.ndarray, step: int) -> None:
        """Bucket ``e`` (from ``e`` to ``e + 1`` on the x axis) holds expert ``e``'s load."""
        centres = np.arange(len(loads)) + 0.5
        self.summary.add_histogram_raw(
            tag, min=0.0, max=float(len(loads)), num=float(loads.sum()), sum=float(centres @ loads),
            sum_squares=float((centres**2) @ loads), bucket_limits=[float(e) for e in range(1, len(loads) + 1)],
            bucket_counts=[float(x) for x in loads], global_step=step,
        )

    def close(self, error: BaseException | None = None) -> None:
        self.summary.close()


def open_writer(settings) -> TensorBoardWriter:
    return TensorBoardWriter(settings.workdir)


def summary_writer():
    """tensorboardX's ``SummaryWriter``, imported without torch.

    tensorboardX imports torch whenever it is installed (only to accept torch tensors; it is in
    the hf extra for the PyTorch peer benchmark). The loop logs Python floats, so torch is
    hidden while tensorboardX loads: importing torch is most of tensorboardX's import time, so every
    training process, sweep run and test subprocess starts seconds sooner (measured in
    experiments/benchmarks/LOG.md, section 2, change 7). A process that has already imported torch
    keeps it.
    """
    if "torch" in sys.modules:
        from tensorboardX import SummaryWriter

        return SummaryWriter
    sys.modules["torch"] = None  # type: ignore[assignment]  # makes ``import torch`` raise ImportError
    try:
        from tensorboardX import SummaryWriter
    finally:
        del sys.modules["torch"]
    return SummaryWriter
