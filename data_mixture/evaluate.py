"""Honest comparison of mixture laws: fit every law on the same rows, predict rows it never saw,
and score them beside trivial baselines on the decision a user makes (which mixture is better).

Rows: a mid-training table is scored on its mid-training rows (:meth:`RunsTable.law_rows`).

Hold-outs (``holdout``):

- ``"largest"`` (default): **leave one scale out** -- fit on every row whose model size (the
  ``size_column``) is below the largest, predict every row at the largest size;
- ``"size=N"``: hold out the size closest to N (fitting on all the others, so it can also test
  interpolation); ``"runs=a,b"``: hold out named runs;
- ``"each"``: every size above the two smallest is held out in turn, fitted on the sizes below
  it only (H extrapolations in one call; the report holds one evaluation per hold-out);
- ``"kfold=K"`` (``"kfold"``: K = 5): out-of-fold predictions of every cell, (size, mixture)
  groups in K random folds, scored at the largest size (:mod:`data_mixture.kfold`; for tables
  with too few sizes to hold one out);
- ``"none"``: fit and score every row, scored at the largest size (in-sample goodness of fit,
  *not* an extrapolation test).

**Cells.** Replicates (rows differing only in ``seed``) form one (size, mixture, tokens) cell
(:mod:`data_mixture.baselines`); laws are fitted on every row (all seeds), scores compare each
method's prediction with the cell mean over seeds.

**Seed noise floor** per size, over the cells at the final checkpoints of that size that have >= 2
seeds: each cell's own seed standard deviation of the loss (per domain and of the mean over
domains), cells whose variance is an outlier against the others flagged ``noisy``
(:func:`data_mixture.decisions.noisy_cells`), and the pooled sd over the cells not flagged (the
figure a cell without seeds takes) beside the plain pooled sd over all of them; "not measured (one
seed)" where no cell has two seeds.

**Decisions** are scored at the largest held-out size, over each mixture's final checkpoint there
(the K mixtures' cell means ``obs_k``): pairwise decision accuracy (:mod:`data_mixture.decisions`)
over the pairs outside the seed noise of *that pair* (``|obs_i - obs_j| >= 2 sqrt(s_i^2/n_i +
s_j^2/n_j)``, ``s_i`` cell i's own seed sd, the robust pooled figure for a cell with one seed),
the pairs within it counted apart; with the noise not measured every
pair counts as decided (and the report says so). A 95% percentile bootstrap over mixtures
(``resamples`` resamples) gives the interval; all methods share the resamples.

Per method (laws and the baselines of :mod:`data_mixture.baselines`) and validation domain, over
the held-out cells (a repetition-aware law predicts each cell at its own ``unique:<domain>`` pools,
:func:`data_mixture.baselines.cell_pools`): ``mae`` = mean |pred - obs| (nats), ``mre`` = mean |pred - obs| / obs (None for
rankers without a loss prediction), ``spearman`` = rank correlation across the mixtures of one
(size, tokens) group (>= 3 cells), averaged over groups; ``decision`` = the decision accuracy of
that domain's loss. On the mean loss over domains: ``decision`` (the headline), ``pick_regret``
= observed mean loss of the method's pick among the K mixtures minus the best observed, with a
t-interval over seeds (paired when the two cells share seeds; none with one seed). Laws also get
the ``optimal_mixture`` over the simplex at the held-out size and largest token count
(:mod:`data_mixture.optimize`; a repetition-aware law at the held-out decision cells' pools), ``fit_seconds`` and the parameters at their bounds
(``LawFit.info["at_bounds"]``, when the fit records them).

**Verdict** (one line): a law *beats* a baseline when the paired bootstrap interval of the
difference in decision accuracy on the mean loss (law minus baseline, the same mixture resamples)
lies above 0; the line says whether any law beats every baseline that could be computed
(``rank_by_weight`` ranks single domains, so it enters only the same rule applied per validation
domain, ``verdict["domains"]``).

A law the training rows cannot identify (too few sizes or runs) is reported as skipped with the
reason, not dropped silently; so is a baseline the rows cannot give.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy.stats import spearmanr

from data_mixture import decisions as dec
from data_mixture.baselines import BASELINES, Cells, build_cells, cell_pools, compute_baselines, practitioner_names
from data_mixture.laws.base import SizeExtrapolationWarning
from data_mixture.table import RunsTable, TableError
from moejax.errors import UserError

LEVEL = 0.95
EACH_MIN_FIT_SIZES = 2  # holdout "each": sizes with at least this many smaller sizes are held out


class EvaluateError(UserError):
    """A hold-out that leaves nothing to fit or nothing to predict; names the sizes/runs."""


class _PointFit:
    """The Fit-like view of per-domain LawFits that :func:`data_mixture.optimize.optimize_mixture` needs,
    predicting at the pools ``unique_m`` ((M,), ``inf``: unlimited; None: each fit's recorded ones)."""

    def __init__(self, law: str, size_column: str, mix_domains, fits: dict, unique_m: np.ndarray | None = None):
        self.law, self.size_column, self.mix_domains = law, size_column, tuple(mix_domains)
        self.loss_domains = tuple(fits)
        self.fits, self.bench, self.bootstrap, self.unique_m = fits, {}, [], unique_m

    def predict_losses(self, size_r, tokens_r, mix_rm, *, member=None):
        return np.stack([self.fits[d].predict(size_r, tokens_r, mix_rm, unique_rm=self.unique_m)
                         for d in self.loss_domains], axis=1)

    def predict_bench(self, loss_rv, *, member=None):
        return np.zeros((np.asarray(loss_rv).shape[0], 0))


# ------------------------------------------------------------------------------------- hold-outs


def split_holdout(table: RunsTable, holdout: str, size_column: str) -> tuple[np.ndarray, str]:
    """Boolean (R,) mask of held-out rows and a description."""
    size = table.size(size_column)
    sizes = np.unique(size)
    if holdout == "none":
        return size == sizes[-1], f"none (in-sample; scored at the largest size {sizes[-1]:.4g})"
    if holdout == "largest":
        test = size == sizes[-1]
        what = f"largest size {sizes[-1]:.4g} ({size_column})"
    elif holdout.startswith("size="):
        try:
            want = float(holdout[5:])
        except ValueError:
            raise EvaluateError(f"--holdout {holdout!r}: expected size=NUMBER, e.g. size=3e6.") from None
        if not (math.isfinite(want) and want > 0):
            raise EvaluateError(f"--holdout {holdout!r}: the size must be a number > 0.")
        pick = sizes[np.argmin(np.abs(np.log(sizes) - np.log(want)))]
        test = size == pick
        what = f"size {pick:.4g} ({size_column})"
    elif holdout.startswith("runs="):
        names = [n.strip() for n in holdout[5:].split(",") if n.strip()]
        unknown = sorted(set(names) - set(table.run.tolist()))
        if unknown:
            raise EvaluateError(f"--holdout names run(s) {', '.join(unknown)} that the table does not have.")
        test = np.isin(table.run, names)
        what = f"runs {', '.join(names)}"
    else:
        raise EvaluateError(f"--holdout {holdout!r}; allowed: largest | each | size=N | runs=a,b,... | kfold=K | none")
    if test.all() or not test.any():
        raise EvaluateError(f"hold-out {what} leaves {'nothing to fit' if test.all() else 'nothing to predict'}: the "
                            f"table has sizes {', '.join(f'{s:.4g}' for s in sizes)}; a leave-one-scale-out "
                            "comparison needs at least two sizes.")
    return test, what


def each_holdouts(table: RunsTable, size_column: str) -> list[float]:
    """The sizes ``holdout="each"`` holds out: every size with >= EACH_MIN_FIT_SIZES smaller ones."""
    sizes = np.unique(table.size(size_column))
    if len(sizes) <= EACH_MIN_FIT_SIZES:
        raise EvaluateError(f"--holdout each needs more than {EACH_MIN_FIT_SIZES} sizes (each held-out size is fitted on "
                            f">= {EACH_MIN_FIT_SIZES} smaller ones); the table has {len(sizes)} in column {size_column!r}: "
                            f"{', '.join(f'{s:.4g}' for s in sizes)}. Use --holdout largest.")
    return [float(s) for s in sizes[EACH_MIN_FIT_SIZES:]]


# ---------------------------------------------------------------------------------- noise floor


def noise_floor(cells: Cells, loss_domains: Sequence[str]) -> dict[str, dict]:
    """Per size (key ``f"{size:.6g}"``), over the final-checkpoint cells with >= 2 seeds: each
    cell's own seed sd (``per_cell``, with ``noisy`` flags from
    :func:`data_mixture.decisions.noisy_cells`), the robust pooled sd that cells without seeds
    take (``sd_mean_loss``, ``sd``: over the cells not flagged,
    :func:`data_mixture.decisions.robust_pooled_sd`) and the plain pooled sd over every cell
    (``sd_mean_loss_all``, :func:`data_mixture.decisions.pooled_sd`), of the mean loss and of each domain."""
    out = {}
    for s in np.unique(cells.size_c):
        sel = np.flatnonzero((cells.size_c == s) & cells.final_c)
        cell_r = np.concatenate([np.full(cells.seeds_c[c], c) for c in sel])
        loss_rv = np.concatenate([np.stack([v for _, v in cells.reps[c]]) for c in sel])
        mean = dec.pooled_sd(loss_rv.mean(axis=1), cell_r)
        entry: dict[str, Any] = {"size": float(s), "cells": int(sel.size), "cells_with_seeds": mean["cells"],
                                 "rows": mean["rows"], "dof": mean["dof"]}
        if mean["sd"] is None:
            entry.update(measured=False, note="not measured (one seed)")
        else:
            ids, sd_c, dof_c = dec.cell_sds(loss_rv.mean(axis=1), cell_r)
            robust = dec.robust_pooled_sd(sd_c, dof_c)
            if robust["sd"] is None:  # every cell flagged cannot happen with >= 2 cells; one cell: its own sd
                robust["sd"] = mean["sd"]
            per_dom = {d: dec.cell_sds(loss_rv[:, v], cell_r)[1] for v, d in enumerate(loss_domains)}
            level = float(np.mean(cells.obs_cv[sel]))
            entry.update(measured=True, sd_mean_loss=robust["sd"], rel_sd_mean_loss=robust["sd"] / level,
                         sd_mean_loss_all=mean["sd"], dof_robust=robust["dof"],
                         sd={d: dec.robust_pooled_sd(sd, dof_c)["sd"] for d, sd in per_dom.items()},
                         sd_all={d: dec.pooled_sd(loss_rv[:, v], cell_r)["sd"] for v, d in enumerate(loss_domains)},
                         per_cell=[{"run": cells.label(int(c)), "seeds": int(dof_c[i] + 1),
                                    "sd_mean_loss": None if not np.isfinite(sd_c[i]) else float(sd_c[i]),
                                    "sd": {d: None if not np.isfinite(per_dom[d][i]) else float(per_dom[d][i])
                                           for d in loss_domains},
                                    "noisy": bool(robust["noisy"][i])}
                                   for i, c in enumerate(ids) if dof_c[i] >= 1])
        out[f"{s:.6g}"] = entry
    return out


# ------------------------------------------------------------------------------------- scoring


class _Decision:
    """The K mixtures a decision is scored on (final checkpoints at the decision size), their
    within-noise pairs per target (mean loss, each domain; each pair judged by the seed sds of
    its own two cells, :func:`data_mixture.decisions.noise_pairs`) and the shared mixture resamples."""

    def __init__(self, held: Cells, size: float, floor: dict, loss_domains, resamples: int, seed: int):
        self.idx_k = np.flatnonzero((held.size_c == size) & held.final_c)
        self.size, self.k = size, int(self.idx_k.size)
        n_k = held.seeds_c[self.idx_k]
        self.obs_kv = held.obs_cv[self.idx_k]
        self.obs_k = self.obs_kv.mean(axis=1)
        self.noise = floor.get(f"{size:.6g}", {"measured": False})
        measured = self.noise.get("measured", False)
        reps = [np.stack([v for _, v in held.reps[c]]) for c in self.idx_k]
        sd_kv = np.array([np.std(r, axis=0, ddof=1) if len(r) >= 2 else np.full(len(loss_domains), np.nan) for r in reps])
        sd_k = np.array([np.std(r.mean(axis=1), ddof=1) if len(r) >= 2 else np.nan for r in reps])
        self.sd_k = sd_k
        fallback = self.noise["sd_mean_loss"] if measured else None
        self.within = {None: dec.noise_pairs(self.obs_k, n_k, sd_k if measured else None, fallback=fallback)}
        for v, d in enumerate(loss_domains):
            self.within[d] = dec.noise_pairs(self.obs_kv[:, v], n_k, sd_kv[:, v] if measured else None,
                                             fallback=self.noise["sd"][d] if measured else None)
        self.counts_bk = dec.mixture_resamples(self.k, resamples, seed) if self.k >= 2 else None

    def score(self, rank_k: np.ndarray, obs_k: np.ndarray, domain: str | None) -> tuple[dict, np.ndarray | None]:
        """Decision accuracy split by the noise, its bootstrap interval, and the (B,) resamples."""
        if self.k < 2:
            return {"accuracy": None, "note": f"{self.k} mixture(s) at the decision size: no pair to decide"}, None
        agree_kk = dec.agreement_matrix(rank_k, obs_k)
        within_kk = self.within[domain]
        out = dec.split_accuracy(agree_kk, within_kk)
        acc_b = dec.resampled_accuracy(agree_kk, ~within_kk, self.counts_bk)
        out["lo"], out["hi"] = dec.percentile_interval(acc_b, LEVEL)
        return out, acc_b

    def describe(self, resamples: int) -> dict:
        within = self.within[None]
        i, j = np.triu_indices(self.k, 1)
        out = {"size": self.size, "mixtures": self.k, "pairs": int(i.size), "pairs_within_noise": int(within[i, j].sum()),
               "noise_z": dec.NOISE_Z, "resamples": resamples, "interval": LEVEL, "noise": "per pair",
               "noise_measured": bool(self.noise.get("measured", False))}
        out["pairs_decided"] = out["pairs"] - out["pairs_within_noise"]
        if out["noise_measured"]:
            out["sd_mean_loss"] = self.noise["sd_mean_loss"]
            out["cell_sd_mean_loss"] = [None if not np.isfinite(x) else float(x) for x in self.sd_k]
            out["cells_without_seeds"] = int((~np.isfinite(self.sd_k)).sum())
        return out


def _spearman_by_group(held: Cells, obs_c: np.ndarray, rank_c: np.ndarray) -> float:
    """Spearman across the cells of each (size, tokens) group with >= 3 cells, averaged."""
    rhos = []
    for s, t in {(float(a), float(b)) for a, b in zip(held.size_c, held.tokens_c)}:
        sel = (held.size_c == s) & (held.tokens_c == t) & np.isfinite(rank_c)
        if sel.sum() >= 3 and np.ptp(obs_c[sel]) > 0 and np.ptp(rank_c[sel]) > 0:
            rhos.append(spearmanr(rank_c[sel], obs_c[sel]).statistic)
    return float(np.mean(rhos)) if rhos else float("nan")


def _pick_regret(held: Cells, decision: _Decision, rank_k: np.ndarray) -> dict:
    """Observed mean loss of the lowest-ranked mixture minus the best observed, with its interval."""
    pick = decision.idx_k[int(np.argmin(rank_k))]
    best = decision.idx_k[int(np.argmin(decision.obs_k))]
    diff = dec.seed_difference(held.mean_reps(pick), held.mean_reps(best), LEVEL)
    return {"pick_regret": float(held.obs_cv[pick].mean() - held.obs_cv[best].mean()),
            "pick_regret_interval": {"lo": diff["lo"], "hi": diff["hi"], "method": diff["method"]},
            "picked_tested_run": held.label(pick)}


def score_method(held: Cells, decision: _Decision, loss_domains, pred_cv, rank_cv, rank_c) -> tuple[dict, dict]:
    """Every metric of one method on the held-out cells; also the (B,) resampled accuracies of
    its decisions, {None (the mean loss) or domain: acc_b}, for the targets it decides."""
    entry: dict[str, Any] = {"domains": {}}
    boots: dict[str | None, np.ndarray] = {}
    for v, d in enumerate(loss_domains):
        obs, rank = held.obs_cv[:, v], rank_cv[:, v]
        if not np.isfinite(rank).any():
            continue
        m: dict[str, Any] = {"mae": None, "mre": None}
        if pred_cv is not None:
            m["mae"] = float(np.mean(np.abs(pred_cv[:, v] - obs)))
            m["mre"] = float(np.mean(np.abs(pred_cv[:, v] - obs) / obs))
        m["spearman"] = _spearman_by_group(held, obs, rank)
        m["decision"], acc_b = decision.score(rank[decision.idx_k], decision.obs_kv[:, v], d)
        if acc_b is not None:
            boots[d] = acc_b
        entry["domains"][d] = m
    doms = list(entry["domains"].values())

    def mean_of(key):
        vals = [x[key] for x in doms if x[key] is not None and np.isfinite(x[key])]
        return float(np.mean(vals)) if vals else None

    entry["mean"] = {"mae": mean_of("mae"), "mre": mean_of("mre"), "spearman": mean_of("spearman"), "spearman_of_mean_loss": None}
    if rank_c is not None:
        entry["mean"]["spearman_of_mean_loss"] = _spearman_by_group(held, held.obs_cv.mean(axis=1), rank_c)
        entry["decision"], acc_b = decision.score(rank_c[decision.idx_k], decision.obs_k, None)
        entry["mean"]["decision_accuracy"] = entry["decision"]["accuracy"]
        if acc_b is not None:
            boots[None] = acc_b
        if decision.k >= 1:
            entry.update(_pick_regret(held, decision, rank_c[decision.idx_k]))
    return entry, boots


# ------------------------------------------------------------------------------------- verdict


def verdict(law_b: dict[str, np.ndarray], base_b: dict[str, np.ndarray], law_acc: dict, base_acc: dict,
            skipped: dict[str, str]) -> dict:
    """Paired differences law - baseline of the resampled decision accuracies; a law beats a
    baseline when the interval's lower end is above 0. ``text``: the one-line verdict."""
    rule = (f"a law beats a baseline when the {LEVEL:.0%} paired bootstrap interval over mixtures of its decision-accuracy "
            "difference (law minus baseline, mean loss) lies above 0")
    out: dict[str, Any] = {"rule": rule, "laws": {}, "winners": [], "baselines": sorted(base_b)}
    if not law_b:
        out["text"] = "Verdict: no law made decisions here (none could be fitted, or fewer than 2 mixtures to compare)."
        return out
    if not base_b:
        out["text"] = "Verdict: no baseline could be computed here, so no law can be said to beat them."
        return out
    for law, a_b in law_b.items():
        row = {}
        for base, b_b in base_b.items():
            lo, hi = dec.percentile_interval(a_b - b_b, LEVEL)
            diff = _sub(law_acc[law], base_acc[base])
            row[base] = {"diff": diff, "lo": lo, "hi": hi, "beats": bool(np.isfinite(lo) and lo > 0)}
        out["laws"][law] = row
        if all(r["beats"] for r in row.values()):
            out["winners"].append(law)
    skip = f" ({'; '.join(f'{b} skipped: {r}' for b, r in skipped.items())})" if skipped else ""
    if out["winners"]:
        out["text"] = (f"Verdict: {', '.join(out['winners'])} beat{'s' if len(out['winners']) == 1 else ''} every baseline "
                       f"({', '.join(sorted(base_b))}) in decision accuracy outside the {LEVEL:.0%} paired interval{skip}.")
        return out
    best_law = max(law_acc, key=lambda k: -1 if law_acc[k] is None else law_acc[k])
    best_base = max(base_acc, key=lambda k: -1 if base_acc[k] is None else base_acc[k])
    d = out["laws"][best_law][best_base]
    out["text"] = (f"Verdict: no law beats every baseline ({', '.join(sorted(base_b))}) in decision accuracy outside the "
                   f"{LEVEL:.0%} paired interval; best law {best_law} {_f(law_acc[best_law])}, best baseline {best_base} "
                   f"{_f(base_acc[best_base])}, difference {_f(d['diff'], '+.2f')} [{_f(d['lo'], '+.2f')}, {_f(d['hi'], '+.2f')}]{skip}.")
    return out


def _verdicts(report: dict, law_boots: dict, base_boots: dict, skipped: dict, domains) -> dict:
    """The mean-loss verdict (the headline; the per-domain rank_by_weight baseline does not enter
    it) and, in ``domains``, the same rule per validation domain against every baseline that
    ranks that domain (rank_by_weight included)."""

    def acc(kind, name, target):
        e = report[kind][name]
        return (e.get("decision") if target is None else e["domains"].get(target, {}).get("decision", {})).get("accuracy")

    def one(target):
        law_b = {n: b[target] for n, b in law_boots.items() if target in b}
        base_b = {n: b[target] for n, b in base_boots.items() if target in b}
        # the unequal-size baselines' absence (no unique:<domain> columns) and a practitioner rule that does not
        # apply (target-capped for a held-out target) are said in their table rows, not the verdict
        skip = {n: r for n, r in skipped.items() if (target is not None or n != "rank_by_weight")
                and n not in ("proportional", "unimax") and n not in practitioner_names()}
        return verdict(law_b, base_b, {n: acc("laws", n, target) for n in law_b},
                       {n: acc("baselines", n, target) for n in base_b}, skip)

    out = one(None)
    out["domains"] = {}
    for d in domains:
        v = one(d)
        out["domains"][d] = {"winners": v["winners"], "baselines": v["baselines"], "laws": v["laws"], "text": v["text"]}
    return out


def _sub(a, b):
    return None if a is None or b is None else float(a - b)


def _f(x, fmt: str = ".2f") -> str:
    return "n/a" if x is None or (isinstance(x, float) and not np.isfinite(x)) else format(x, fmt)


# ------------------------------------------------------------------------------------ evaluate


def evaluate_laws(table: RunsTable, laws: Sequence[str], *, holdout: str = "largest", size_column: str = "params_total",
                  seed: int = 0, starts: int = 64, tokens: str = "all", resamples: int = 1000,
                  optimum: bool = True, target=None) -> dict[str, Any]:
    """The comparison as a JSON-able dict (see the module docstring). ``target``
    (:mod:`data_mixture.target`, already applied to ``table``): what the practitioner baselines
    start from (:func:`data_mixture.baselines.target_preference`; None: the mean loss). ``holdout="each"`` returns
    {"holdout", "size_column", "noise_floor", "holdouts": [one evaluation per held-out size],
    "summary", "verdict"}; every other hold-out one evaluation. A registration's check
    (:func:`data_mixture.register.verify`, on the table as read: its rule names its own metric) goes
    in the report as ``report["registration"]``; :func:`format_report` then leads with it."""
    return _evaluate_laws(table, laws, holdout=holdout, size_column=size_column, seed=seed, starts=starts,
                          tokens=tokens, resamples=resamples, optimum=optimum, target=target)


def _evaluate_laws(table: RunsTable, laws: Sequence[str], *, holdout: str, size_column: str, seed: int, starts: int,
                   tokens: str, resamples: int, optimum: bool, target=None) -> dict[str, Any]:
    from data_mixture.laws import get_law

    if tokens not in ("all", "last"):
        raise EvaluateError(f"--tokens {tokens!r}; allowed: all | last.")
    if resamples < 100:
        raise EvaluateError(f"--resamples {resamples}; allowed: >= 100 (a 95% interval needs at least a few hundred).")
    for name in laws:
        get_law(name)  # unknown names fail before any fitting
    rows = table.law_rows()
    if rows.loss_rv is None or not rows.loss_domains:
        raise TableError("the table has no loss:* columns to evaluate (was it read with query=True?).")
    floor = noise_floor(build_cells(rows, size_column), rows.loss_domains)
    common = dict(laws=laws, size_column=size_column, seed=seed, starts=starts, tokens=tokens, resamples=resamples,
                  optimum=optimum, floor=floor, target=target)
    if holdout == "kfold" or holdout.startswith("kfold="):
        from data_mixture.kfold import FOLDS

        k = holdout[6:] if holdout.startswith("kfold=") else str(FOLDS)
        if not k.isdigit() or int(k) < 2:
            raise EvaluateError(f"--holdout {holdout!r}; allowed: kfold=K with K >= 2 whole folds, e.g. kfold=5.")
        return _evaluate_kfold(rows, int(k), laws=laws, size_column=size_column, seed=seed, starts=starts,
                               resamples=resamples, floor=floor, target=target)
    if holdout != "each":
        test, what = split_holdout(rows, holdout, size_column)
        train = rows if holdout == "none" else rows.take(~test)
        return _evaluate_one(train, rows.take(test), what, **common)
    size = rows.size(size_column)
    reports = []
    for s in each_holdouts(rows, size_column):
        what = f"size {s:.4g} ({size_column}), fitted on the {int((np.unique(size) < s).sum())} sizes below"
        reports.append(_evaluate_one(rows.take(size < s), rows.take(size == s), what, **common))
    return _each_summary(reports, size_column, floor)


def _evaluate_one(train_t: RunsTable, test_t: RunsTable, what: str, *, laws, size_column, seed, starts, tokens,
                  resamples, optimum, floor, target=None) -> dict[str, Any]:
    """One hold-out: fit every law on ``train_t``, score laws and baselines on ``test_t``."""
    t_start = time.perf_counter()
    if tokens == "last":
        last = np.array([test_t.tokens[i] == test_t.tokens[test_t.run == r].max() for i, r in enumerate(test_t.run)])
        test_t = test_t.take(last)
    domains, mix_domains = tuple(test_t.loss_domains), tuple(test_t.mix_domains)
    held, train = build_cells(test_t, size_column), build_cells(train_t, size_column)
    decision_size = float(held.size_c.max())
    decision = _Decision(held, decision_size, floor, domains, resamples, seed)
    held_tokens = float(held.tokens_c[decision.idx_k].max()) if decision.k else float(held.tokens_c.max())
    best = decision.idx_k[int(np.argmin(decision.obs_k))] if decision.k else int(np.argmin(held.obs_cv.mean(axis=1)))
    report: dict[str, Any] = {
        "holdout": what, "size_column": size_column, "train_rows": len(train_t), "test_rows": len(test_t),
        "train_cells": len(train), "test_cells": len(held),
        "train_sizes": sorted(set(train_t.size(size_column).tolist())), "held_out_size": decision_size,
        "held_out_tokens": held_tokens, "loss_domains": list(domains), "mix_domains": list(mix_domains),
        "observed_best": {"run": held.label(best), "mean_loss": float(held.obs_cv[best].mean()), "seeds": int(held.seeds_c[best]),
                          "weights": dict(zip(mix_domains, held.mix_cm[best].tolist()))},
        "decision": decision.describe(resamples), "noise_floor": floor,
        "seed": seed, "starts": starts, "laws": {}, "baselines": {},
    }
    law_boots, base_boots, skipped = {}, {}, {}
    for name in laws:
        entry, boots = _evaluate_law(name, train_t, test_t, held, decision, domains, mix_domains, size_column=size_column,
                                     seed=seed, starts=starts, optimum=optimum)
        report["laws"][name], law_boots[name] = entry, boots
    for name, got in compute_baselines(train, held, domains, mix_domains, target).items():
        entry: dict[str, Any] = {"description": BASELINES[name]}
        if "skipped" in got:
            entry["skipped"] = skipped[name] = got["skipped"]
            report["baselines"][name] = entry
            continue
        scored, boots = score_method(held, decision, domains, got["pred_cv"], got["rank_cv"], got["rank_c"])
        entry.update(scored, notes=got["notes"])
        if got["pred_cv"] is not None:
            entry["predictions"] = _predictions(held, got["pred_cv"])
        report["baselines"][name], base_boots[name] = entry, boots
    report["verdict"] = _verdicts(report, law_boots, base_boots, skipped, domains)
    report["seconds"] = time.perf_counter() - t_start
    return _jsonable(report)


def _evaluate_kfold(rows: RunsTable, k: int, *, laws, size_column, seed, starts, resamples, floor,
                    target) -> dict[str, Any]:
    """One out-of-fold evaluation (:mod:`data_mixture.kfold`), scored as a hold-out is."""
    from data_mixture.kfold import out_of_fold

    t_start = time.perf_counter()
    domains, mix_domains = tuple(rows.loss_domains), tuple(rows.mix_domains)
    oof = out_of_fold(rows, k, laws=laws, size_column=size_column, seed=seed, starts=starts, target=target)
    held, cells = oof["held"], oof["cells"]
    decision = _Decision(held, float(held.size_c.max()), floor, domains, resamples, seed)
    best = decision.idx_k[int(np.argmin(decision.obs_k))] if decision.k else int(np.argmin(held.obs_cv.mean(axis=1)))
    report: dict[str, Any] = {
        "holdout": f"kfold={k} (out-of-fold predictions of the {len(held)} cells at the largest size; its mixtures in "
                   f"{k} folds, seed {seed})",
        "size_column": size_column, "train_rows": len(rows), "test_rows": oof["test_rows"], "train_cells": len(cells),
        "test_cells": len(held), "train_sizes": sorted(set(rows.size(size_column).tolist())),
        "held_out_size": decision.size, "held_out_tokens": float(held.tokens_c[decision.idx_k].max()) if decision.k else None,
        "loss_domains": list(domains), "mix_domains": list(mix_domains),
        "observed_best": {"run": held.label(best), "mean_loss": float(held.obs_cv[best].mean()),
                          "seeds": int(held.seeds_c[best]), "weights": dict(zip(mix_domains, held.mix_cm[best].tolist()))},
        "decision": decision.describe(resamples), "noise_floor": floor, "seed": seed, "starts": starts,
        "laws": {}, "baselines": {},
    }
    law_boots, base_boots, skipped = {}, {}, {}
    for name, got in oof["laws"].items():
        if "skipped" in got:
            report["laws"][name] = got
            continue
        entry, law_boots[name] = score_method(held, decision, domains, got["pred_cv"], got["pred_cv"], got["pred_cv"].mean(axis=1))
        entry.update(fit_seconds=got["seconds"], warnings=got["warnings"], predictions=_predictions(held, got["pred_cv"]))
        report["laws"][name] = entry
    for name, got in oof["baselines"].items():
        entry = {"description": BASELINES[name]}
        if "skipped" in got:
            entry["skipped"] = skipped[name] = got["skipped"]
        else:
            scored, base_boots[name] = score_method(held, decision, domains, got["pred_cv"], got["rank_cv"], got["rank_c"])
            entry.update(scored, notes=got["notes"])
        report["baselines"][name] = entry
    report["verdict"] = _verdicts(report, law_boots, base_boots, skipped, domains)
    report["seconds"] = time.perf_counter() - t_start
    return _jsonable(report)


def _evaluate_law(name, train_t, test_t, held: Cells, decision: _Decision, domains, mix_domains, *, size_column, seed,
                  starts, optimum) -> tuple[dict, dict]:
    """Fit one law on the training rows, predict the held-out cells, score; the law's warnings
    (e.g. predicting outside the fitted token range) are kept in ``entry["warnings"]``."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        entry, boots = _fit_and_score(name, train_t, test_t, held, decision, domains, mix_domains, size_column=size_column,
                                      seed=seed, starts=starts, optimum=optimum)
    # predicting the held-out size is extrapolation in size by design: that warning is no news here
    entry["warnings"] = list(dict.fromkeys(str(w.message) for w in caught if issubclass(w.category, UserWarning)
                                           and not issubclass(w.category, SizeExtrapolationWarning)))
    return entry, boots


def _fit_and_score(name, train_t, test_t, held: Cells, decision: _Decision, domains, mix_domains, *, size_column, seed,
                   starts, optimum) -> tuple[dict, dict]:
    from data_mixture.laws import get_law
    from data_mixture.optimize import optimize_mixture

    law = get_law(name)
    entry: dict[str, Any] = {"mixture_moves_with_scale": bool(law.mixture_moves_with_scale)}
    t0 = time.perf_counter()
    try:
        fits = law.fit_domains(train_t, list(domains), size_column=size_column, seed=seed, starts=starts)
    except TableError as e:
        entry["skipped"] = str(e)
        return entry, {}
    entry["fit_seconds"] = time.perf_counter() - t0
    # repetition-aware laws predict each held-out cell at its own pools (the others ignore them)
    pools_cm = cell_pools(test_t, size_column) if any("unique_tokens" in f.info for f in fits.values()) else None
    pred_cv = np.stack([fits[d].predict(held.size_c, held.tokens_c, held.mix_cm, unique_rm=pools_cm)
                        for d in domains], axis=1)
    scored, boots = score_method(held, decision, domains, pred_cv, pred_cv, pred_cv.mean(axis=1))
    entry.update(scored)
    for d in domains:
        entry["domains"][d]["num_params"] = int(fits[d].num_params)
    entry["at_bounds"] = {d: fits[d].info.get("at_bounds") for d in domains if fits[d].info.get("at_bounds")}
    if optimum:
        at_k = decision.idx_k if decision.k else np.arange(len(held))
        tokens = float(held.tokens_c[at_k].max())
        # at the held-out decision cells' pools (the largest of each domain's, should they differ)
        unique_m = None if pools_cm is None else pools_cm[at_k].max(axis=0)
        opt = optimize_mixture(_PointFit(name, size_column, mix_domains, fits, unique_m), size=decision.size,
                               tokens=tokens, starts=4, seed=seed, bootstrap=False)
        entry["optimal_mixture"] = opt["weights"]
        entry["optimal_predicted_mean_loss"] = opt["objective"]["value"]
    entry["predictions"] = _predictions(held, pred_cv)
    return entry, boots


def _predictions(held: Cells, pred_cv: np.ndarray) -> dict:
    return {"run": [held.label(c) for c in range(len(held))], "size": held.size_c.tolist(), "tokens": held.tokens_c.tolist(),
            "seeds": held.seeds_c.tolist(), "observed": held.obs_cv.tolist(), "predicted": pred_cv.tolist()}


def _each_summary(reports: list[dict], size_column: str, floor: dict) -> dict:
    """Several hold-outs: per method, decision accuracy (and MAE) at each, and the verdicts."""
    methods: dict[str, dict] = {}
    for r in reports:
        for kind in ("laws", "baselines"):
            for name, e in r[kind].items():
                m = methods.setdefault(name, {"kind": kind[:-1], "decision_accuracy": [], "mae": []})
                m["decision_accuracy"].append(None if "skipped" in e else e.get("decision", {}).get("accuracy"))
                m["mae"].append(None if "skipped" in e else e["mean"]["mae"])
    for m in methods.values():
        accs = [a for a in m["decision_accuracy"] if a is not None]
        m["mean_decision_accuracy"] = float(np.mean(accs)) if accs else None
    wins = {}
    for r in reports:
        for law in r["verdict"]["winners"]:
            wins[law] = wins.get(law, 0) + 1
    held = [r["held_out_size"] for r in reports]
    text = (f"Verdict over {len(reports)} hold-outs: "
            + ("; ".join(f"{law} beats every baseline at {n} of them" for law, n in wins.items()) if wins
               else "no law beats every baseline at any of them") + ".")
    return _jsonable({"holdout": f"each (sizes {', '.join(f'{s:.4g}' for s in held)}, each fitted on the sizes below)",
                      "size_column": size_column, "noise_floor": floor, "holdouts": reports,
                      "summary": {"held_out_sizes": held, "methods": methods, "wins": wins},
                      "verdict": {"text": text, "per_holdout": [r["verdict"]["text"] for r in reports]},
                      "seconds": float(sum(r["seconds"] for r in reports))})


def _jsonable(x):
    """Plain JSON types; non-finite floats become None."""
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, (int, np.integer)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        return float(x) if np.isfinite(x) else None
    if isinstance(x, np.ndarray):
        return _jsonable(x.tolist())
    return x


# -------------------------------------------------------------------------------------- report


def format_report(report: dict[str, Any]) -> str:
    """Markdown: the verdict first (and the registration check, when there is one), then the noise
    floor, the methods, per-domain scores, bounds."""
    if "registration" in report:
        from data_mixture.register import format_check

        rest = {k: v for k, v in report.items() if k != "registration"}
        return format_report(rest) + "\n\n## Pre-registration\n\n" + "\n".join(format_check(report["registration"]))
    if "holdouts" in report:
        lines = [f"**{report['verdict']['text']}**", "", f"Hold-outs: {report['holdout']}.", ""]
        lines += _floor_lines(report["noise_floor"])
        lines += ["", "| method | kind | " + " | ".join(f"decision acc. at {s:.3g}" for s in report["summary"]["held_out_sizes"])
                  + " | mean |", "|---|---|" + "---|" * (len(report["summary"]["held_out_sizes"]) + 1)]
        for name, m in report["summary"]["methods"].items():
            lines.append(f"| {name} | {m['kind']} | " + " | ".join(_f(a) for a in m["decision_accuracy"])
                         + f" | {_f(m['mean_decision_accuracy'])} |")
        for r in report["holdouts"]:
            lines += ["", f"## Hold-out: {r['holdout']}", "", _format_one(r, floor=False)]
        return "\n".join(lines)
    return _format_one(report)


def _floor_lines(floor: dict) -> list[str]:
    lines = ["Seed noise floor (final checkpoints of each size; pooled sd over the cells not flagged noisy, the figure "
             "a cell without seeds takes, beside the plain pooled sd over every cell with seeds):", "",
             "| size | cells (with >= 2 seeds) | rows | dof | sd of the mean loss (robust) | all cells | relative | "
             "sd per domain (robust) | noisy cells |", "|---|---|---|---|---|---|---|---|---|"]
    cells = []
    for e in floor.values():
        if not e["measured"]:
            lines.append(f"| {e['size']:.4g} | {e['cells']} (0) | | | {e['note']} | | | | |")
            continue
        per = ", ".join(f"{d} {_f(v, '.4f')}" for d, v in e["sd"].items())
        noisy = [c["run"] for c in e.get("per_cell", []) if c["noisy"]]
        lines.append(f"| {e['size']:.4g} | {e['cells']} ({e['cells_with_seeds']}) | {e['rows']} | {e['dof']} | "
                     f"{e['sd_mean_loss']:.4f} | {_f(e.get('sd_mean_loss_all'), '.4f')} | {e['rel_sd_mean_loss']:.2%} | "
                     f"{per} | {len(noisy)} |")
        cells += [(e["size"], c) for c in e.get("per_cell", [])]
    if cells:
        doms = list(cells[0][1]["sd"])
        lines += ["", "Seed sd of each cell (final checkpoints; **noisy**: its variance over the other cells' pooled "
                  f"variance above the {dec.NOISY_LEVEL:.0%} F quantile):", "",
                  "| size | cell | seeds | sd of the mean loss | " + " | ".join(doms) + " | |",
                  "|---|---|---|---|" + "---|" * len(doms) + "---|"]
        lines += [f"| {s:.4g} | {c['run']} | {c['seeds']} | {_f(c['sd_mean_loss'], '.4f')} | "
                  + " | ".join(_f(c["sd"][d], ".4f") for d in doms) + f" | {'**noisy**' if c['noisy'] else ''} |"
                  for s, c in cells]
    return lines


def _acc_cell(d: dict | None) -> str:
    if not d or d.get("accuracy") is None:
        return "n/a"
    return f"{d['accuracy']:.2f} [{_f(d.get('lo'))}, {_f(d.get('hi'))}]"


def _within_cell(d: dict | None, measured: bool) -> str:
    if not d or d.get("accuracy") is None:
        return "n/a"
    if not measured:
        return "noise not measured"
    return f"{_f(d['accuracy_within_noise'])} ({d['pairs_within_noise']})"


def _regret_cell(e: dict) -> str:
    if "pick_regret" not in e:
        return "n/a"
    iv = e["pick_regret_interval"]
    if iv["lo"] is None:
        return f"{e['pick_regret']:.4f} (one seed)"
    return f"{e['pick_regret']:.4f} [{iv['lo']:.4f}, {iv['hi']:.4f}]"


def _format_one(report: dict[str, Any], floor: bool = True) -> str:
    d = report["decision"]
    per_domain = [f"- {dom}: {v['text'].removeprefix('Verdict: ')}" for dom, v in report["verdict"].get("domains", {}).items()]
    lines = [f"**{report['verdict']['text']}**", ""]
    if per_domain:
        lines += ["Per validation domain (the same rule; rank_by_weight included):", ""] + per_domain + [""]
    lines += [f"Hold-out: {report['holdout']}; fitted on {report['train_rows']} rows ({report['train_cells']} cells) at sizes "
              f"{', '.join(f'{s:.3g}' for s in report['train_sizes'])}, predicting {report['test_rows']} rows "
              f"({report['test_cells']} cells, replicates averaged).",
              f"Best tested mixture at the held-out size: {report['observed_best']['run']} "
              f"(mean loss {report['observed_best']['mean_loss']:.4f}, {report['observed_best']['seeds']} seed(s))."]
    if d["noise_measured"]:
        lines.append(f"Decisions: {d['mixtures']} mixtures at size {d['size']:.4g} (final checkpoints), {d['pairs']} pairs: "
                     f"{d['pairs_decided']} decided, {d['pairs_within_noise']} within the seed noise "
                     f"(|difference| < {d['noise_z']:g} x sqrt(s_i^2/n_i + s_j^2/n_j), each cell's own seed sd s; "
                     f"{d.get('cells_without_seeds', 0)} cell(s) with one seed take the robust pooled sd "
                     f"{d['sd_mean_loss']:.4f}) and scored apart. "
                     f"Intervals: {d['interval']:.0%} bootstrap over mixtures ({d['resamples']} resamples).")
    else:
        lines.append(f"Decisions: {d['mixtures']} mixtures at size {d['size']:.4g} (final checkpoints), {d['pairs']} pairs, "
                     f"all counted as decided: the seed noise is not measured at this size (one seed). "
                     f"Intervals: {d['interval']:.0%} bootstrap over mixtures ({d['resamples']} resamples).")
    if floor:
        lines += [""] + _floor_lines(report["noise_floor"])
    mix = report["mix_domains"]
    lines += ["", "| method | decision accuracy [95%] | within noise (pairs) | MAE | mean rel. error | Spearman (domains) | "
              "Spearman (mean loss) | pick regret [95%] | fit s | optimal mixture (" + ", ".join(mix) + ") |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for kind in ("laws", "baselines"):
        for name, e in report[kind].items():
            label = name if kind == "laws" else f"*{name}* (baseline)"
            if "skipped" in e:
                lines.append(f"| {label} | skipped: {e['skipped']} | | | | | | | | |")
                continue
            m, dd = e["mean"], e.get("decision")
            within = _within_cell(dd, d["noise_measured"])
            opt = ", ".join(f"{e['optimal_mixture'][x]:.2f}" for x in mix) if "optimal_mixture" in e else ""
            fit_s = f"{e['fit_seconds']:.1f}" if "fit_seconds" in e else ""
            lines.append(f"| {label} | {_acc_cell(dd)} | {within} | {_f(m['mae'], '.4f')} | {_f(m['mre'], '.4f')} | "
                         f"{_f(m['spearman'], '.3f')} | {_f(m['spearman_of_mean_loss'], '.3f')} | {_regret_cell(e)} | {fit_s} | {opt} |")
    lines += _paired_lines(report["verdict"])
    lines += ["", "| method | domain | decision accuracy [95%] | within noise (pairs) | MAE | mean rel. error | Spearman |",
              "|---|---|---|---|---|---|---|"]
    for kind in ("laws", "baselines"):
        for name, e in report[kind].items():
            for dom, v in e.get("domains", {}).items():
                dd = v["decision"]
                within = _within_cell(dd, d["noise_measured"])
                lines.append(f"| {name} | {dom} | {_acc_cell(dd)} | {within} | {_f(v['mae'], '.4f')} | {_f(v['mre'], '.4f')} | "
                             f"{_f(v['spearman'], '.3f')} |")
    lines += ["", "Baselines:", ""] + [f"- {n}: {BASELINES[n]}" + (f" ({e['notes']})" if e.get("notes") else "")
                                       for n, e in report["baselines"].items()]
    lines += _bounds_lines(report["laws"])
    warned = [f"- {name}: {w}" for name, e in report["laws"].items() for w in e.get("warnings", [])]
    if warned:
        lines += ["", "Warnings from the laws:", ""] + warned
    return "\n".join(lines)


def _paired_lines(v: dict) -> list[str]:
    if not v["laws"] or not v["baselines"]:
        return []
    bases = v["baselines"]
    lines = ["", "Decision accuracy, law minus baseline (mean loss), paired 95% bootstrap interval over mixtures:", "",
             "| law | " + " | ".join(bases) + " |", "|---|" + "---|" * len(bases)]
    for law, row in v["laws"].items():
        cells = []
        for b in bases:
            r = row[b]
            mark = " (beats)" if r["beats"] else ""
            cells.append(f"{_f(r['diff'], '+.2f')} [{_f(r['lo'], '+.2f')}, {_f(r['hi'], '+.2f')}]{mark}")
        lines.append(f"| {law} | " + " | ".join(cells) + " |")
    return lines


def _bounds_lines(laws: dict) -> list[str]:
    lines = []
    for name, e in laws.items():
        for dom, items in (e.get("at_bounds") or {}).items():
            for it in items:
                idx = "" if it.get("index") is None else f"[{it['index']}]"
                lines.append(f"| {name} | {dom} | {it.get('param')}{idx} | {_f(it.get('value'), '.4g')} | "
                             f"{it.get('bound')} {_f(it.get('limit'), '.4g')} |")
    if not lines:
        fitted = [n for n, e in laws.items() if "skipped" not in e]
        return ["", f"Parameters at bounds: none recorded ({', '.join(fitted) or 'no law fitted'})."]
    return ["", "Parameters at (or within 1% of) a bound:", "", "| law | domain | parameter | value | bound |",
            "|---|---|---|---|---|"] + lines
