"""Rank consistency: does the merge proxy order mixtures the way really trained models do?

For the same mixtures, ``proxy`` holds the merged models' metrics (``merge.MergeEvaluator``) and
``trained`` the metrics of models trained on each mixture (a runs table's final checkpoints).
Both are ``{mixture name: {"bench:<task>": score, "loss:<domain>": loss, ...}}``.

Reported, each as a Spearman correlation with a bootstrap interval:

- ``tasks[t]``: per benchmark task, the proxy's scores against the trained models' scores;
- ``losses[d]``: per held-out domain, the proxy's losses against the trained losses;
- ``overall``: the *macro score*, the mean over tasks of each task's scores standardised across
  the mixtures (z-scores, so every task weighs the same whatever its spread, the paper's
  "macro-average of normalised scores"), proxy against trained;
- ``mean_loss``: the mean held-out loss, proxy against trained.

The bootstrap resamples mixtures with replacement (``n_boot`` times, seeded) and recomputes the
correlation; resamples where either side is constant are left out of the percentile interval.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from scipy import stats

Metrics = Mapping[str, float]


def macro_z(matrix_mt: np.ndarray) -> np.ndarray:
    """Mean over columns (tasks) of the column-standardised matrix [mixtures, tasks]; a constant
    column contributes 0."""
    sd_t = matrix_mt.std(axis=0)
    z_mt = (matrix_mt - matrix_mt.mean(axis=0)) / np.where(sd_t > 0, sd_t, 1.0)
    return z_mt.mean(axis=1)


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rho; NaN when either side is constant."""
    if np.ptp(x) == 0 or np.ptp(y) == 0:
        return float("nan")
    return float(stats.spearmanr(x, y).statistic)


def _with_interval(x: np.ndarray, y: np.ndarray, idx_bm: np.ndarray, mass: float) -> dict[str, float]:
    boot = np.array([spearman(x[i], y[i]) for i in idx_bm])
    boot = boot[np.isfinite(boot)]
    lo, hi = (np.percentile(boot, [50 * (1 - mass), 50 * (1 + mass)]) if boot.size else (np.nan, np.nan))
    return {"rho": spearman(x, y), "lo": float(lo), "hi": float(hi), "n_boot": int(boot.size)}


def rank_consistency(
    proxy: Mapping[str, Metrics], trained: Mapping[str, Metrics], *, tasks: Sequence[str] | None = None,
    losses: Sequence[str] | None = None, n_boot: int = 1000, mass: float = 0.95, seed: int = 0,
) -> dict[str, Any]:
    """Spearman of proxy vs trained per task, per loss domain, macro score and mean loss (module
    docstring), over the mixtures both hold. ``tasks``/``losses`` default to every ``bench:``/
    ``loss:`` key the two share."""
    names = sorted(set(proxy) & set(trained))
    if len(names) < 3:
        raise ValueError(f"rank consistency needs at least 3 mixtures in both proxy and trained; shared: {names}")
    shared = set.intersection(*(set(proxy[n]) & set(trained[n]) for n in names))
    tasks = list(tasks) if tasks is not None else sorted(k[6:] for k in shared if k.startswith("bench:"))
    losses = list(losses) if losses is not None else sorted(k[5:] for k in shared if k.startswith("loss:"))

    def matrix(source: Mapping[str, Metrics], keys: list[str]) -> np.ndarray:
        return np.array([[float(source[n][k]) for k in keys] for n in names]).reshape(len(names), len(keys))

    idx_bm = np.random.default_rng(seed).integers(0, len(names), size=(n_boot, len(names)))
    out: dict[str, Any] = {"mixtures": names, "tasks": {}, "losses": {}}
    bench_p, bench_t = matrix(proxy, [f"bench:{t}" for t in tasks]), matrix(trained, [f"bench:{t}" for t in tasks])
    loss_p, loss_t = matrix(proxy, [f"loss:{d}" for d in losses]), matrix(trained, [f"loss:{d}" for d in losses])
    for j, t in enumerate(tasks):
        out["tasks"][t] = _with_interval(bench_p[:, j], bench_t[:, j], idx_bm, mass)
    for j, d in enumerate(losses):
        out["losses"][d] = _with_interval(loss_p[:, j], loss_t[:, j], idx_bm, mass)
    if tasks:
        out["overall"] = _with_interval(macro_z(bench_p), macro_z(bench_t), idx_bm, mass)
    if losses:
        out["mean_loss"] = _with_interval(loss_p.mean(axis=1), loss_t.mean(axis=1), idx_bm, mass)
    return out
