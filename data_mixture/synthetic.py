"""Synthetic runs tables drawn from a known law (tests, benchmarks, planning simulations).

``synthetic_table`` trains nothing: it draws mixtures (Dirichlet), model sizes and checkpoints,
evaluates a law's loss function with given true parameters and multiplies by log-normal noise.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from data_mixture.table import RunsTable, from_columns


def draw_design(
    *,
    mix_domains: Sequence[str],
    sizes: Sequence[float],
    runs_per_size: int,
    checkpoints: Sequence[float] = (0.5, 1.0),
    tokens_per_param: float = 20.0,
    seed: int = 0,
    shared_mixtures: bool = False,
    concentration: float = 1.0,
) -> dict[str, Any]:
    """Columns run, params_total, params_active, tokens, mix:* of a ladder: ``runs_per_size``
    mixtures at each size (the same mixtures at every size if ``shared_mixtures``), each run
    with checkpoints at fractions of ``tokens_per_param * N`` tokens."""
    rng = np.random.default_rng(seed)
    m = len(mix_domains)
    shared = rng.dirichlet(np.full(m, concentration), runs_per_size)
    cols: dict[str, list] = {"run": [], "params_total": [], "params_active": [], "tokens": []}
    for d in mix_domains:
        cols[f"mix:{d}"] = []
    for si, n in enumerate(sizes):
        mixes = shared if shared_mixtures else rng.dirichlet(np.full(m, concentration), runs_per_size)
        for k in range(runs_per_size):
            for frac in checkpoints:
                cols["run"].append(f"s{si}_m{k}")
                cols["params_total"].append(float(n))
                cols["params_active"].append(float(n))
                cols["tokens"].append(float(round(frac * tokens_per_param * n)))
                for j, d in enumerate(mix_domains):
                    cols[f"mix:{d}"].append(float(mixes[k, j]))
    return cols


def synthetic_table(
    loss_fn,
    design: Mapping[str, Any],
    mix_domains: Sequence[str],
    *,
    domains: Sequence[str] = ("valid",),
    noise: float = 0.005,
    seed: int = 0,
) -> RunsTable:
    """Adds ``loss:<domain>`` columns: ``loss_fn(domain_index, N, D, mix_rm) * exp(noise * z)``."""
    rng = np.random.default_rng(seed + 7919)
    cols = dict(design)
    n = np.asarray(cols["params_total"], np.float64)
    d = np.asarray(cols["tokens"], np.float64)
    mix = np.stack([np.asarray(cols[f"mix:{x}"], np.float64) for x in mix_domains], axis=1)
    for v, name in enumerate(domains):
        clean = np.asarray(loss_fn(v, n, d, mix), np.float64)
        cols[f"loss:{name}"] = list(clean * np.exp(noise * rng.standard_normal(clean.shape)))
    return from_columns(cols)
