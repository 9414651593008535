"""Where metrics go: a progress bar, a line per logged step (logged at INFO: on stdout from the
command line, hidden by --quiet), and the writers of train.loggers (moejax/train/trackers/:
WORKDIR/metrics.jsonl, TensorBoard, W&B, MLflow); and the routing-health metrics themselves."""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import tqdm

from moejax.train import trackers

log = logging.getLogger(__name__)


# Routing health. "Global" routing metrics use the expert loads averaged over about the last
# HEALTH_WINDOW_STEPS steps (an exponential moving average, normalised for its start), computed on
# device every step, so they see every step, not only the logged ones, and survive a resume.
HEALTH_WINDOW_STEPS = 100


def init_routing_health(num_layers: int, num_experts: int) -> dict[str, jax.Array]:
    if not num_layers:  # a dense model: nothing to track (and orbax cannot save empty arrays)
        return {}
    return {"load_ema_le": jnp.zeros((num_layers, num_experts), jnp.float32), "ema_weight": jnp.zeros((), jnp.float32)}


def update_routing_health(health: dict[str, jax.Array], load_le: jax.Array) -> dict[str, jax.Array]:
    """Folds one step's expert loads [L, E] into the moving average."""
    if not health:
        return {}
    rate = 1.0 / HEALTH_WINDOW_STEPS
    return {
        "load_ema_le": (1.0 - rate) * health["load_ema_le"] + rate * load_le.astype(jnp.float32),
        "ema_weight": (1.0 - rate) * health["ema_weight"] + rate,
    }


def global_load(health: dict[str, jax.Array]) -> jax.Array:
    """Expert loads [L, E] over the recent window: the moving average over the weight it has."""
    if not health:
        return jnp.zeros((0, 0), jnp.float32)
    return health["load_ema_le"] / jnp.maximum(health["ema_weight"], jnp.finfo(jnp.float32).tiny)


def max_vio(load_le: np.ndarray) -> np.ndarray:
    """MaxVio per layer: max_e load_e / mean_e load_e - 1 (0 when perfectly balanced)."""
    return load_le.max(axis=-1) / load_le.mean(axis=-1) - 1.0


def gini(load_le: np.ndarray) -> np.ndarray:
    """Gini coefficient of the loads per layer: 0 when equal, 1 - 1/E when one expert takes all.

    G = sum_i sum_j |x_i - x_j| / (2 E sum_i x_i), computed from the sorted loads.
    """
    x = np.sort(load_le, axis=-1)
    e = x.shape[-1]
    rank = np.arange(1, e + 1)
    return 2.0 * np.sum(rank * x, axis=-1) / (e * np.sum(x, axis=-1)) - (e + 1.0) / e


def routing_summary(metrics: dict[str, Any]) -> dict[str, Any]:
    """Routing-health fields of one logged step (host-side, from the train step's metrics).

    Per MoE layer (``<name>/layer_<i>``) and summarised over layers: ``max_vio`` (this batch, max
    over layers), ``max_vio_global`` (recent window, max), ``gini`` and ``gini_global`` (mean),
    ``router_entropy`` (mean per-token routing entropy, nats; mean), each objective's metrics
    (e.g. ``loss_free/bias_norm``; max), ``balance_loss/<objective>``; and the lists
    ``expert_load`` [L][E], ``drop_rate`` [L] and, with ``ep_balance="llep"``, ``llep_engaged`` [L].
    """
    if "load_le" not in metrics or np.asarray(metrics["load_le"]).shape[0] == 0:
        return {}
    load_le = np.asarray(metrics["load_le"], np.float64)
    out: dict[str, Any] = {"expert_load": load_le, "drop_rate": np.asarray(metrics["drop_rate_l"])}
    if "llep_engaged_l" in metrics:  # ep_balance="llep": per layer, 1.0 where it spilled (averaged over micro-batches)
        out["llep_engaged"] = np.asarray(metrics["llep_engaged_l"])
    per_layer = {"max_vio": (max_vio(load_le), np.max), "gini": (gini(load_le), np.mean)}
    if "load_global_le" in metrics:
        load_global_le = np.asarray(metrics["load_global_le"], np.float64)
        out["expert_load_global"] = load_global_le
        per_layer["max_vio_global"] = (max_vio(load_global_le), np.max)
        per_layer["gini_global"] = (gini(load_global_le), np.mean)
    if "entropy_l" in metrics:
        per_layer["router_entropy"] = (np.asarray(metrics["entropy_l"]), np.mean)
    for key, value_l in metrics.get("balance_metrics", {}).items():
        per_layer[key] = (np.asarray(value_l), np.max)
    for key, (value_l, reduce) in per_layer.items():
        out.update({f"{key}/layer_{i}": float(v) for i, v in enumerate(value_l)})
        out[key] = float(reduce(value_l))
    for name, value in metrics.get("balance_losses", {}).items():
        out[f"balance_loss/{name}"] = float(value)
    return out


class MetricsLogger:
    """Each logged step to the writers (moejax/train/trackers/: metrics.jsonl, appended on resume,
    TensorBoard, W&B, MLflow), a progress bar and a log line.

    The writers get the same record; each keeps what it shows (metrics.jsonl all of it, the others
    the finite scalars, and TensorBoard and W&B the expert loads as histograms). Only process 0
    writes. The progress bar is drawn on a terminal only; in a log file each logged step's line
    starts with ``[step/total]`` instead of the bar's redraws.
    """

    def __init__(self, workdir: str, *, total_steps: int, start_step: int, enabled: bool = True,
                 writers: Sequence[trackers.Writer] | None = None):
        """``writers``: open writers (:func:`moejax.train.trackers.open_writers`), closed by
        :meth:`close`; None: metrics.jsonl and TensorBoard."""
        self.enabled = enabled
        if not enabled:
            return
        if writers is None:
            writers = trackers.open_writers(("jsonl", "tensorboard"), trackers.RunSettings(
                workdir=workdir, project="", run_name="", tags=(), run_id="", mlflow_uri="", config={}))
        self.writers = list(writers)
        self.total_steps = total_steps
        self.bar = tqdm.tqdm(total=total_steps, initial=start_step, unit="step", dynamic_ncols=True,
                             disable=not sys.stderr.isatty())

    def advance(self, steps: int = 1, **postfix: float) -> None:
        if self.enabled:
            self.bar.update(steps)
            if postfix:
                self.bar.set_postfix({k: f"{v:.4g}" for k, v in postfix.items()}, refresh=False)

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        if not self.enabled:
            return
        record = {"step": step, **{k: _plain(v) for k, v in metrics.items()}}
        for writer in self.writers:
            writer.write(step, record)
        shown = [f"{k}={_fmt(v)}" for k, v in record.items() if isinstance(v, (int, float, str)) and "/" not in k]
        if self.bar.disable:
            shown.insert(0, f"[{step}/{self.total_steps}]")
        log.info(" ".join(shown))

    def close(self, error: BaseException | None = None) -> None:
        """Closes the bar and the writers; ``error``: what stopped the run (None: it ended normally)."""
        if self.enabled:
            self.bar.close()
            for writer in self.writers:
                writer.close(error)


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


def metric_records(workdir: str) -> Iterator[dict[str, Any]]:
    """The records of ``workdir/metrics.jsonl`` in order (none when the file is absent); a line that
    is not JSON (a write cut short by a kill) is skipped."""
    path = os.path.join(workdir, "metrics.jsonl")
    if not os.path.isfile(path):
        return
    with open(path) as f:
        for line in f:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                yield record


def eval_losses_from_metrics(workdir: str) -> tuple[tuple[int, float] | None, tuple[int, float] | None]:
    """(step, eval_loss) of the first and of the last evaluation in ``workdir/metrics.jsonl``."""
    first = last = None
    for record in metric_records(workdir):
        if isinstance(record.get("eval_loss"), (int, float)):
            last = (int(record["step"]), float(record["eval_loss"]))
            first = first or last
    return first, last
