"""Scoring mixture decisions: does a method order pairs of mixtures as the observed losses do?

Pairwise decision accuracy (the metric AI2's DataDecide scores small-scale decisions with): over
the K mixtures observed at one size, of the K (K - 1) / 2 pairs (i, j) with different observed
losses, the fraction whose order the method predicts, ``sign(pred_i - pred_j) == sign(obs_i -
obs_j)`` (a predicted tie counts half).

Seed noise splits the pairs, **per pair**: with each cell's own seed standard deviation ``s_i``
(over its ``n_i`` seeds) the standard error of a difference of two cell means is
``sqrt(s_i^2 / n_i + s_j^2 / n_j)``; a pair whose observed difference is below ``z`` times that
(``z = 2`` by default) is *within the noise*: its observed order is not a fact a method can be
scored on, so it is counted apart (:func:`noise_pairs`, :func:`split_accuracy`). A cell with one
seed has no sd of its own and takes a pooled figure that one noisy cell cannot inflate
(:func:`robust_pooled_sd`: the pooled sd over the cells that :func:`noisy_cells` does not flag).
Public mixture studies report seed variances that differ by orders of magnitude between
mixtures, so one pooled figure would let the noisiest cell decide every other pair.

Intervals: the accuracy gets a percentile bootstrap over *mixtures* (resample the K mixtures with
replacement; a pair of distinct mixtures drawn ``c_i`` and ``c_j`` times counts ``c_i c_j`` times;
a mixture paired with its own copy does not count) -- :func:`mixture_resamples`,
:func:`resampled_accuracy`; two methods scored on the same resamples give a paired interval of
their difference. A loss difference between two mixtures gets a t-interval over seeds
(:func:`seed_difference`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy import stats

NOISE_Z = 2.0
"""A pair is within the noise when |obs_i - obs_j| < NOISE_Z x the standard error of the difference."""


def pair_signs(x_k: np.ndarray) -> np.ndarray:
    """(P,) sign(x_i - x_j) over the pairs i < j, in ``np.triu_indices(K, 1)`` order."""
    x_k = np.asarray(x_k, np.float64)
    i, j = np.triu_indices(x_k.shape[0], 1)
    return np.sign(x_k[i] - x_k[j])


def pairwise_accuracy(pred_k: np.ndarray, obs_k: np.ndarray) -> float:
    """Fraction of mixture pairs (with different observed losses) whose order ``pred_k`` gets
    right; a predicted tie counts half. NaN when fewer than two mixtures differ."""
    obs_p, pred_p = pair_signs(obs_k), pair_signs(pred_k)
    keep = obs_p != 0
    if not keep.any():
        return float("nan")
    agree = np.where(pred_p[keep] == 0, 0.5, (pred_p[keep] == obs_p[keep]).astype(np.float64))
    return float(agree.mean())


def agreement_matrix(pred_k: np.ndarray, obs_k: np.ndarray) -> np.ndarray:
    """(K, K) symmetric: 1 where sign(pred_i - pred_j) == sign(obs_i - obs_j), 0.5 where the
    prediction ties, 0 where it is wrong; NaN on the diagonal and where the observations tie."""
    pred_k, obs_k = np.asarray(pred_k, np.float64), np.asarray(obs_k, np.float64)
    obs_kk = np.sign(obs_k[:, None] - obs_k[None, :])
    pred_kk = np.sign(pred_k[:, None] - pred_k[None, :])
    agree_kk = np.where(pred_kk == 0, 0.5, (pred_kk == obs_kk).astype(np.float64))
    return np.where(obs_kk == 0, np.nan, agree_kk)


def noise_pairs(obs_k: np.ndarray, seeds_k: np.ndarray, sd_k, z: float = NOISE_Z, *,
                fallback: float | None = None) -> np.ndarray:
    """(K, K) bool: pairs within the seed noise, ``|obs_i - obs_j| < z sqrt(s_i^2/n_i + s_j^2/n_j)``
    with ``n`` the seeds averaged in each cell mean and ``s`` each cell's own seed sd.

    ``sd_k``: (K,) per-cell sds (None or NaN where a cell has no sd of its own: it takes
    ``fallback``), or one number for every cell. A pair with a cell whose sd is unknown (no own
    sd and no fallback) is not within the noise (the noise is not measured there)."""
    obs_k = np.asarray(obs_k, np.float64)
    k = obs_k.shape[0]
    if sd_k is None or isinstance(sd_k, (int, float, np.floating)):
        sd_k = np.full(k, np.nan if sd_k is None else float(sd_k))
    sd_k = np.array([np.nan if s is None else s for s in sd_k], np.float64)
    if fallback is not None and np.isfinite(fallback):
        sd_k = np.where(np.isfinite(sd_k), sd_k, float(fallback))
    var_k = sd_k ** 2 / np.asarray(seeds_k, np.float64)
    with np.errstate(invalid="ignore"):
        se_kk = np.sqrt(var_k[:, None] + var_k[None, :])
        within = np.abs(obs_k[:, None] - obs_k[None, :]) < z * se_kk
    within &= np.isfinite(se_kk)
    np.fill_diagonal(within, False)
    return within


def split_accuracy(agree_kk: np.ndarray, within_kk: np.ndarray) -> dict:
    """Accuracy over the decided pairs (observed difference outside the noise) and, apart, over
    the pairs within the noise; ``accuracy_all``: over every pair with different observations.
    Pairs counted once (i < j); accuracies NaN where a set is empty."""
    i, j = np.triu_indices(agree_kk.shape[0], 1)
    a_p, w_p = agree_kk[i, j], within_kk[i, j]
    valid = np.isfinite(a_p)

    def acc(mask):
        return float(a_p[mask].mean()) if mask.any() else float("nan")

    return {
        "accuracy": acc(valid & ~w_p), "pairs_decided": int((valid & ~w_p).sum()),
        "accuracy_within_noise": acc(valid & w_p), "pairs_within_noise": int((valid & w_p).sum()),
        "accuracy_all": acc(valid), "pairs": int(valid.sum()),
    }


def mixture_resamples(k: int, resamples: int, seed: int) -> np.ndarray:
    """(B, K) multiplicities of K mixtures in B bootstrap resamples (each draws K with replacement)."""
    rng = np.random.default_rng(seed)
    return rng.multinomial(k, np.full(k, 1.0 / k), size=resamples).astype(np.float64)


def resampled_accuracy(agree_kk: np.ndarray, keep_kk: np.ndarray, counts_bk: np.ndarray) -> np.ndarray:
    """(B,) decision accuracy of each resample over the pairs ``keep_kk`` allows:
    ``sum_{i != j} c_i c_j a_ij / sum_{i != j} c_i c_j`` over kept pairs (NaN where none is drawn)."""
    keep = keep_kk & np.isfinite(agree_kk)
    np.fill_diagonal(keep, False)
    a_kk = np.where(keep, agree_kk, 0.0)
    num_b = np.einsum("bi,ij,bj->b", counts_bk, a_kk, counts_bk)
    den_b = np.einsum("bi,ij,bj->b", counts_bk, keep.astype(np.float64), counts_bk)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den_b > 0, num_b / np.where(den_b > 0, den_b, 1.0), np.nan)


def percentile_interval(x_b: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """Central ``level`` percentile interval of the finite entries of ``x_b`` (NaN, NaN if none)."""
    x_b = np.asarray(x_b, np.float64)
    x_b = x_b[np.isfinite(x_b)]
    if not x_b.size:
        return float("nan"), float("nan")
    lo, hi = np.percentile(x_b, [(1 - level) / 2 * 100, (1 + level) / 2 * 100])
    return float(lo), float(hi)


def pooled_sd(x_r: np.ndarray, cell_r: np.ndarray) -> dict:
    """Pooled within-cell standard deviation of replicate values ``x_r`` grouped by ``cell_r``:
    ``sqrt(sum_c sum_s (x_cs - xbar_c)^2 / sum_c (n_c - 1))`` over the cells with n_c >= 2.
    Returns {sd, dof, cells, rows}; sd None when no cell has two replicates (not measured)."""
    x_r, cell_r = np.asarray(x_r, np.float64), np.asarray(cell_r)
    ss, dof, cells, rows = 0.0, 0, 0, 0
    for c in np.unique(cell_r):
        x = x_r[cell_r == c]
        if x.size >= 2:
            ss += float(np.sum((x - x.mean()) ** 2))
            dof += x.size - 1
            cells += 1
            rows += x.size
    return {"sd": float(np.sqrt(ss / dof)) if dof else None, "dof": dof, "cells": cells, "rows": rows}


def cell_sds(x_r: np.ndarray, cell_r: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(cells, sd_c, dof_c) of replicate values ``x_r`` grouped by ``cell_r`` (sorted cell ids):
    each cell's sample sd (ddof 1; NaN with one replicate) and its degrees of freedom."""
    x_r, cell_r = np.asarray(x_r, np.float64), np.asarray(cell_r)
    cells = np.unique(cell_r)
    sd_c = np.array([np.std(x_r[cell_r == c], ddof=1) if (cell_r == c).sum() >= 2 else np.nan for c in cells])
    dof_c = np.array([(cell_r == c).sum() - 1 for c in cells])
    return cells, sd_c, dof_c


NOISY_LEVEL = 0.99
"""A cell is flagged noisy when its variance over the other cells' pooled variance exceeds this F quantile."""


def noisy_cells(sd_c: np.ndarray, dof_c: np.ndarray, level: float = NOISY_LEVEL) -> np.ndarray:
    """(C,) bool: cells whose seed variance is an outlier. Cell c is flagged when
    ``s_c^2 / s_(-c)^2 > F(level; dof_c, dof_(-c))``, ``s_(-c)`` the pooled sd of the other cells
    with seeds (leave-one-out, so a noisy cell cannot hide itself by inflating the reference)."""
    sd_c, dof_c = np.asarray(sd_c, np.float64), np.asarray(dof_c)
    ok = np.isfinite(sd_c) & (dof_c >= 1)
    ss_c = np.where(ok, sd_c ** 2 * dof_c, 0.0)
    flag = np.zeros(sd_c.shape[0], bool)
    for c in np.flatnonzero(ok):
        dof_rest = int(dof_c[ok].sum() - dof_c[c])
        if dof_rest < 1:
            continue
        var_rest = (ss_c.sum() - ss_c[c]) / dof_rest
        if var_rest > 0:
            flag[c] = sd_c[c] ** 2 / var_rest > stats.f.ppf(level, dof_c[c], dof_rest)
        else:
            flag[c] = sd_c[c] > 0
    return flag


def robust_pooled_sd(sd_c: np.ndarray, dof_c: np.ndarray, level: float = NOISY_LEVEL) -> dict:
    """The pooled seed sd over the cells :func:`noisy_cells` does not flag:
    ``sqrt(sum dof_c s_c^2 / sum dof_c)``; {sd (None if no cell has seeds), dof, cells, noisy (C,) bool}."""
    sd_c, dof_c = np.asarray(sd_c, np.float64), np.asarray(dof_c)
    noisy = noisy_cells(sd_c, dof_c, level)
    keep = np.isfinite(sd_c) & (dof_c >= 1) & ~noisy
    dof = int(dof_c[keep].sum())
    sd = float(np.sqrt(np.sum(sd_c[keep] ** 2 * dof_c[keep]) / dof)) if dof else None
    return {"sd": sd, "dof": dof, "cells": int(keep.sum()), "noisy": noisy}


def seed_difference(a: Sequence[tuple[int, float]], b: Sequence[tuple[int, float]], level: float = 0.95) -> dict:
    """Mean of a minus mean of b, with a t-interval over seeds. ``a``, ``b``: (seed, value) pairs.

    Paired when both have the same >= 2 distinct seeds: d_s = a_s - b_s, interval
    ``mean(d) -+ t_{n-1} sd(d) / sqrt(n)``; otherwise Welch's interval when each has >= 2 values;
    otherwise no interval (``method`` says which)."""
    va, vb = np.array([v for _, v in a], np.float64), np.array([v for _, v in b], np.float64)
    diff = float(va.mean() - vb.mean())
    sa, sb = [s for s, _ in a], [s for s, _ in b]
    q = (1 + level) / 2
    if len(set(sa)) == len(sa) >= 2 and set(sa) == set(sb) and len(set(sb)) == len(sb):
        by_b = dict(b)
        d_s = np.array([v - by_b[s] for s, v in a])
        half = float(stats.t.ppf(q, d_s.size - 1) * d_s.std(ddof=1) / np.sqrt(d_s.size))
        return {"diff": diff, "lo": diff - half, "hi": diff + half, "method": f"paired t over {d_s.size} seeds"}
    if va.size >= 2 and vb.size >= 2:
        var_a, var_b = va.var(ddof=1) / va.size, vb.var(ddof=1) / vb.size
        se = float(np.sqrt(var_a + var_b))
        if se == 0:
            return {"diff": diff, "lo": diff, "hi": diff, "method": "Welch t (no spread)"}
        dof = (var_a + var_b) ** 2 / (var_a ** 2 / (va.size - 1) + var_b ** 2 / (vb.size - 1))
        half = float(stats.t.ppf(q, dof) * se)
        return {"diff": diff, "lo": diff - half, "hi": diff + half, "method": f"Welch t ({va.size} and {vb.size} seeds)"}
    return {"diff": diff, "lo": None, "hi": None, "method": "one seed: no interval"}


def detectable_difference(sd_d: float, n: int, level: float = 0.95, power: float = 0.8) -> float:
    """The smallest true difference a paired comparison over ``n`` seeds detects with probability
    ``power`` at two-sided ``level``, given the sd of the per-seed differences ``sd_d``:
    ``(t_{(1+level)/2, n-1} + t_{power, n-1}) sd_d / sqrt(n)`` (the usual t approximation)."""
    dof = n - 1
    return float((stats.t.ppf((1 + level) / 2, dof) + stats.t.ppf(power, dof)) * sd_d / np.sqrt(n))


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (Holm 1979), in the order given.

    With the m raw p-values sorted ascending, ``p_(1) <= ... <= p_(m)``, the adjusted value of the
    i-th smallest is ``min(1, max_{k <= i} (m - k + 1) p_(k))``; rejecting every hypothesis whose
    adjusted p-value is below ``alpha`` controls the family-wise error at ``alpha``. NaN p-values are
    an error (a comparison without a p-value cannot be ranked)."""
    p_m = np.asarray(p_values, np.float64)
    if p_m.ndim != 1 or np.any(~np.isfinite(p_m)) or np.any((p_m < 0) | (p_m > 1)):
        raise ValueError(f"p-values {list(p_values)}; allowed: numbers in [0, 1]")
    m = p_m.size
    order = np.argsort(p_m, kind="stable")
    scaled = (m - np.arange(m)) * p_m[order]
    adj_sorted = np.minimum(1.0, np.maximum.accumulate(scaled))
    adj_m = np.empty(m)
    adj_m[order] = adj_sorted
    return adj_m.tolist()
