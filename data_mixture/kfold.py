"""Out-of-fold scoring of laws and baselines: ``evaluate`` with ``holdout="kfold=K"``.

For a table whose sizes cannot spare one for a hold-out (one or two sizes: a leave-one-scale-out
fit would leave too few sizes for most laws), the mixtures run at the largest size (each with all
its seeds and checkpoints there) are split at random (fixed by ``seed``) into K folds; every law
and baseline is fitted on every row but one fold's and predicts that fold's cells, so every cell
at the largest size gets an out-of-fold prediction (the smaller sizes are always trained on). The decisions are then scored exactly as :mod:`data_mixture.evaluate` scores a
hold-out -- at the largest size, over its final checkpoints, with the per-pair seed noise and a
bootstrap over mixtures -- on those out-of-fold predictions. A law or baseline that cannot be
fitted on some fold is skipped with that fold's reason.
"""

from __future__ import annotations

import time
import warnings
from typing import Any

import numpy as np

from data_mixture.baselines import Cells, build_cells, cell_pools, compute_baselines
from data_mixture.table import RunsTable, TableError

FOLDS = 5


def take_cells(cells: Cells, sel: np.ndarray) -> Cells:
    """The cells ``sel`` (indices) of ``cells``."""
    idx = np.asarray(sel)
    pick = (lambda a: None if a is None else a[idx])
    return Cells(cells.size_c[idx], cells.tokens_c[idx], cells.frac_c[idx], cells.mix_cm[idx], cells.obs_cv[idx],
                 cells.seeds_c[idx], [cells.runs[i] for i in idx], [cells.reps[i] for i in idx],
                 pick(cells.unique_cm), pick(cells.pool_cm))


def folds_of(rows: RunsTable, cells: Cells, size_column: str, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(fold of each row, fold of each cell): the mixtures at the largest size dealt at random into
    k folds; -1 (always trained on) for the cells of smaller sizes."""
    from data_mixture.baselines import mixture_ids

    top = np.isclose(cells.size_c, cells.size_c.max())
    mid_c = mixture_ids(cells.mix_cm)
    groups = np.unique(mid_c[top])
    if len(groups) < k:
        raise TableError(f"kfold={k} needs at least {k} mixtures at the largest size; the table has {len(groups)}.")
    perm = np.random.default_rng(seed).permutation(len(groups))
    fold_g = np.empty(len(groups), int)
    fold_g[perm] = np.arange(len(groups)) % k
    fold_c = np.where(top, fold_g[np.searchsorted(groups, mid_c)], -1)
    return fold_c[rows.mixture_keys(size_column)], fold_c


def _law_oof(name, rows, held, fold_r, fold_c, k, domains, size_column, seed, starts) -> tuple[np.ndarray | None, str]:
    from data_mixture.laws import get_law

    law = get_law(name)
    pred_cv = np.full(held.obs_cv.shape, np.nan)
    for f in range(k):
        train = rows.take(fold_r != f)
        try:
            fits = law.fit_domains(train, list(domains), size_column=size_column, seed=seed, starts=starts)
        except TableError as e:
            return None, f"fold {f + 1} of {k}: {e}"
        sel = np.flatnonzero(fold_c == f)
        test = rows.take(fold_r == f)
        pools = cell_pools(test, size_column) if any("unique_tokens" in x.info for x in fits.values()) else None
        # cell_pools orders the fold's cells as build_cells(test) does, i.e. as sel (both sorted by cell key)
        part = take_cells(held, sel)
        pred_cv[sel] = np.stack([fits[d].predict(part.size_c, part.tokens_c, part.mix_cm, unique_rm=pools)
                                 for d in domains], axis=1)
    return pred_cv, ""


def _baselines_oof(rows, held, fold_r, fold_c, k, domains, mix_domains, size_column, target) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for f in range(k):
        sel = np.flatnonzero(fold_c == f)
        got = compute_baselines(build_cells(rows.take(fold_r != f), size_column), take_cells(held, sel), domains,
                                mix_domains, target)
        for name, g in got.items():
            entry = out.setdefault(name, {"pred_cv": None, "rank_cv": np.full(held.obs_cv.shape, np.nan),
                                          "rank_c": None, "notes": set()})
            if "skipped" in entry:
                continue
            if "skipped" in g:
                out[name] = {"skipped": f"fold {f + 1} of {k}: {g['skipped']}"}
                continue
            entry["rank_cv"][sel] = g["rank_cv"]
            if g["pred_cv"] is not None:
                entry["pred_cv"] = entry["pred_cv"] if entry["pred_cv"] is not None else np.full(held.obs_cv.shape, np.nan)
                entry["pred_cv"][sel] = g["pred_cv"]
            if g["rank_c"] is not None:
                entry["rank_c"] = entry["rank_c"] if entry["rank_c"] is not None else np.full(len(held), np.nan)
                entry["rank_c"][sel] = g["rank_c"]
            entry["notes"].add(g["notes"])
    for e in out.values():
        if "notes" in e:
            e["notes"] = f"out of {k} folds; " + " | ".join(sorted(n for n in e["notes"] if n))[:400]
    return out


def out_of_fold(rows: RunsTable, k: int, *, laws, size_column: str, seed: int, starts: int,
                target=None) -> dict[str, Any]:
    """Out-of-fold predictions for :func:`data_mixture.evaluate.evaluate_laws` (``holdout="kfold=K"``,
    which scores them): {"cells", "held" (the cells at the largest size), "laws" {name: {"pred_cv",
    "seconds", "warnings"} or {"skipped"}}, "baselines" {name: predictions or {"skipped"}}}."""
    from data_mixture.laws.base import SizeExtrapolationWarning

    domains, mix_domains = tuple(rows.loss_domains), tuple(rows.mix_domains)
    cells = build_cells(rows, size_column)
    fold_r, fold_c = folds_of(rows, cells, size_column, k, seed)
    top = np.flatnonzero(fold_c >= 0)
    held, fold_c = take_cells(cells, top), fold_c[top]
    out: dict[str, Any] = {"cells": cells, "held": held, "test_rows": int((fold_r >= 0).sum()), "laws": {}}
    for name in laws:
        t0 = time.perf_counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            pred_cv, why = _law_oof(name, rows, held, fold_r, fold_c, k, domains, size_column, seed, starts)
        if pred_cv is None:
            out["laws"][name] = {"skipped": why}
            continue
        out["laws"][name] = {"pred_cv": pred_cv, "seconds": time.perf_counter() - t0,
                             "warnings": list(dict.fromkeys(str(w.message) for w in caught
                                                            if issubclass(w.category, UserWarning)
                                                            and not issubclass(w.category, SizeExtrapolationWarning)))}
    out["baselines"] = _baselines_oof(rows, held, fold_r, fold_c, k, domains, mix_domains, size_column, target)
    return out
