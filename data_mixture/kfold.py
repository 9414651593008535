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

from data_mixture.baselines import BASELINES, Cells, build_cells, cell_pools, compute_baselines
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


def evaluate_kfold(rows: RunsTable, k: int, *, laws, size_column, seed, starts, resamples, floor,
                   target=None) -> dict[str, Any]:
    """One out-of-fold evaluation in the report format of :func:`data_mixture.evaluate.evaluate_laws`."""
    from data_mixture import evaluate as ev
    from data_mixture.laws.base import SizeExtrapolationWarning

    t_start = time.perf_counter()
    domains, mix_domains = tuple(rows.loss_domains), tuple(rows.mix_domains)
    cells = build_cells(rows, size_column)
    fold_r, fold_c = folds_of(rows, cells, size_column, k, seed)
    top = np.flatnonzero(fold_c >= 0)
    held, fold_c = take_cells(cells, top), fold_c[top]
    decision = ev._Decision(held, float(held.size_c.max()), floor, domains, resamples, seed)
    best = decision.idx_k[int(np.argmin(decision.obs_k))] if decision.k else int(np.argmin(held.obs_cv.mean(axis=1)))
    report: dict[str, Any] = {
        "holdout": f"kfold={k} (out-of-fold predictions of the {len(held)} cells at the largest size; its mixtures in "
                   f"{k} folds, seed {seed})",
        "size_column": size_column, "train_rows": len(rows), "test_rows": int((fold_r >= 0).sum()),
        "train_cells": len(cells), "test_cells": len(held), "train_sizes": sorted(set(rows.size(size_column).tolist())),
        "held_out_size": decision.size, "held_out_tokens": float(held.tokens_c[decision.idx_k].max()) if decision.k else None,
        "loss_domains": list(domains), "mix_domains": list(mix_domains),
        "observed_best": {"run": held.label(best), "mean_loss": float(held.obs_cv[best].mean()),
                          "seeds": int(held.seeds_c[best]), "weights": dict(zip(mix_domains, held.mix_cm[best].tolist()))},
        "decision": decision.describe(resamples), "noise_floor": floor, "seed": seed, "starts": starts,
        "laws": {}, "baselines": {},
    }
    law_boots, base_boots, skipped = {}, {}, {}
    for name in laws:
        t0 = time.perf_counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            pred_cv, why = _law_oof(name, rows, held, fold_r, fold_c, k, domains, size_column, seed, starts)
        if pred_cv is None:
            report["laws"][name] = {"skipped": why}
            continue
        entry, boots = ev.score_method(held, decision, domains, pred_cv, pred_cv, pred_cv.mean(axis=1))
        entry["fit_seconds"] = time.perf_counter() - t0
        entry["warnings"] = list(dict.fromkeys(str(w.message) for w in caught if issubclass(w.category, UserWarning)
                                               and not issubclass(w.category, SizeExtrapolationWarning)))
        entry["predictions"] = ev._predictions(held, pred_cv)
        report["laws"][name], law_boots[name] = entry, boots
    for name, got in _baselines_oof(rows, held, fold_r, fold_c, k, domains, mix_domains, size_column, target).items():
        entry = {"description": BASELINES[name]}
        if "skipped" in got:
            entry["skipped"] = skipped[name] = got["skipped"]
            report["baselines"][name] = entry
            continue
        scored, boots = ev.score_method(held, decision, domains, got["pred_cv"], got["rank_cv"], got["rank_c"])
        entry.update(scored, notes=got["notes"])
        report["baselines"][name], base_boots[name] = entry, boots
    report["verdict"] = ev._verdicts(report, law_boots, base_boots, skipped, domains)
    report["seconds"] = time.perf_counter() - t_start
    return ev._jsonable(report)
