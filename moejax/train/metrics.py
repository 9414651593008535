"""Where metrics go: a progress bar and lines on stdout, WORKDIR/metrics.jsonl, TensorBoard."""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
import tqdm
from tensorboardX import SummaryWriter


def routing_summary(load_le: np.ndarray) -> dict[str, float]:
    """MaxVio (max load / mean load - 1) per MoE layer and its maximum over layers."""
    max_vio_l = load_le.max(axis=-1) * load_le.shape[-1] - 1.0
    out = {f"max_vio/layer_{i}": float(v) for i, v in enumerate(max_vio_l)}
    out["max_vio"] = float(max_vio_l.max())
    return out


class MetricsLogger:
    """One JSON object per logged step in metrics.jsonl (appended on resume) and TensorBoard scalars.

    Scalars go everywhere; lists (per-layer expert loads, drop rates) go to metrics.jsonl only.
    Only process 0 writes.
    """

    def __init__(self, workdir: str, *, total_steps: int, start_step: int, enabled: bool = True):
        self.enabled = enabled
        if not enabled:
            return
        self.jsonl = open(os.path.join(workdir, "metrics.jsonl"), "a")
        self.tb = SummaryWriter(workdir)
        self.bar = tqdm.tqdm(total=total_steps, initial=start_step, unit="step", dynamic_ncols=True)

    def advance(self, steps: int = 1, **postfix: float) -> None:
        if self.enabled:
            self.bar.update(steps)
            if postfix:
                self.bar.set_postfix({k: f"{v:.4g}" for k, v in postfix.items()}, refresh=False)

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        if not self.enabled:
            return
        record = {"step": step, **{k: _plain(v) for k, v in metrics.items()}}
        self.jsonl.write(json.dumps(record) + "\n")
        self.jsonl.flush()
        for key, value in record.items():
            if isinstance(value, (int, float)) and key != "step" and value is not None:
                self.tb.add_scalar(key, value, step)
        self.tb.flush()
        shown = [f"{k}={_fmt(v)}" for k, v in record.items() if isinstance(v, (int, float, str)) and "/" not in k]
        self.bar.write(" ".join(shown))

    def close(self) -> None:
        if self.enabled:
            self.bar.close()
            self.jsonl.close()
            self.tb.close()


def _plain(value: Any) -> Any:
    if isinstance(value, (str, type(None))):
        return value
    array = np.asarray(value)
    return array.item() if array.ndim == 0 else array.tolist()


def _fmt(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def truncate_metrics(workdir: str, step: int) -> None:
    """Drops metrics.jsonl records after ``step`` (atomically), so a resumed run reads as one curve."""
    path = os.path.join(workdir, "metrics.jsonl")
    if not os.path.exists(path):
        return

    def keep(line: str) -> bool:
        try:
            return json.loads(line)["step"] <= step
        except (json.JSONDecodeError, KeyError):  # a line cut short by a kill
            return False

    with open(path) as f:
        lines = [line for line in f if keep(line)]
    with open(path + ".tmp", "w") as f:
        f.writelines(lines)
    os.replace(path + ".tmp", path)
