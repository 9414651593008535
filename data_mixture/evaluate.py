"""Honest comparison of mixture laws: fit every law on the same rows, predict rows it never saw.

Default hold-out (``holdout="largest"``): **leave one scale out** -- fit on every row whose
model size (the ``size_column``) is below the largest, predict every row at the largest size.
``"size=N"`` holds out the size closest to N instead (fitting on all the others, so it can also
test interpolation), ``"runs=a,b"`` holds out named runs, and ``"none"`` fits and scores every
row (in-sample goodness of fit, *not* an extrapolation test: for tables too small to hold a size
out; Spearman and the optimum are then computed at the largest size).

Per law and validation domain, on the held-out rows:

- ``mae``: mean |predicted - observed| loss (nats);
- ``mre``: mean |predicted - observed| / observed;
- ``spearman``: Spearman rank correlation between predicted and observed loss *across
  mixtures* at the held-out size, computed per held-out token count (rows of one checkpoint
  budget, one per mixture; needs >= 3) and averaged over token counts -- does the law order the
  mixtures right where it was not fitted?
- the **optimal mixture** the law picks at the held-out size and the largest held-out token
  count (minimising the equal-weight mean of the predicted validation losses over the simplex,
  with :mod:`data_mixture.optimize`), and ``pick_regret``: among the mixtures actually run at
  the held-out size, the observed mean loss of the one the law ranks best minus the best observed
  (0 = it picks the best tested mixture);
- ``fit_seconds``: wall time of the law's fits (all domains).

A law the training rows cannot identify (too few sizes or runs) is reported as skipped with the
reason, not dropped silently; the others are still compared.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy.stats import spearmanr

from data_mixture.table import RunsTable, TableError


class EvaluateError(ValueError):
    """A hold-out that leaves nothing to fit or nothing to predict; names the sizes/runs."""


class _PointFit:
    """The Fit-like view of per-domain LawFits that :func:`data_mixture.optimize.optimize_mixture` needs."""

    def __init__(self, law: str, size_column: str, mix_domains, fits: dict):
        self.law, self.size_column, self.mix_domains = law, size_column, tuple(mix_domains)
        self.loss_domains = tuple(fits)
        self.fits, self.bench, self.bootstrap = fits, {}, []

    def predict_losses(self, size_r, tokens_r, mix_rm, *, member=None):
        return np.stack([self.fits[d].predict(size_r, tokens_r, mix_rm) for d in self.loss_domains], axis=1)

    def predict_bench(self, loss_rv, *, member=None):
        return np.zeros((np.asarray(loss_rv).shape[0], 0))


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
        raise EvaluateError(f"--holdout {holdout!r}; allowed: largest | size=N | runs=a,b,...")
    if test.all() or not test.any():
        raise EvaluateError(f"hold-out {what} leaves {'nothing to fit' if test.all() else 'nothing to predict'}: the "
                            f"table has sizes {', '.join(f'{s:.4g}' for s in sizes)}; a leave-one-scale-out "
                            "comparison needs at least two sizes.")
    return test, what


def _spearman_by_tokens(tokens_r, obs_r, pred_r) -> float:
    rhos = []
    for t in np.unique(tokens_r):
        sel = tokens_r == t
        if sel.sum() >= 3 and np.ptp(obs_r[sel]) > 0 and np.ptp(pred_r[sel]) > 0:
            rhos.append(spearmanr(pred_r[sel], obs_r[sel]).statistic)
    return float(np.mean(rhos)) if rhos else float("nan")


def evaluate_laws(table: RunsTable, laws: Sequence[str], *, holdout: str = "largest", size_column: str = "params_total",
                  seed: int = 0, starts: int = 64, tokens: str = "all") -> dict[str, Any]:
    """The comparison as a JSON-able dict (see the module docstring)."""
    from data_mixture.laws import get_law
    from data_mixture.optimize import optimize_mixture

    if tokens not in ("all", "last"):
        raise EvaluateError(f"--tokens {tokens!r}; allowed: all | last.")
    for name in laws:
        get_law(name)  # unknown names fail before any fitting
    test, what = split_holdout(table, holdout, size_column)
    train_t, test_t = (table, table.take(test)) if holdout == "none" else (table.take(~test), table.take(test))
    if tokens == "last":
        keep = np.array([test_t.tokens[i] == test_t.tokens[test_t.run == r].max() for i, r in enumerate(test_t.run)])
        test_t = test_t.take(keep)
    size_te = test_t.size(size_column)
    held_size = float(np.exp(np.mean(np.log(size_te))))
    held_tokens = float(test_t.tokens.max())
    obs_mean = test_t.loss_rv.mean(axis=1)
    last = test_t.tokens == held_tokens
    best_obs_idx = np.flatnonzero(last)[np.argmin(obs_mean[last])]
    report: dict[str, Any] = {
        "holdout": what, "size_column": size_column, "train_rows": len(train_t), "test_rows": len(test_t),
        "train_sizes": sorted(set(train_t.size(size_column).tolist())), "held_out_size": held_size,
        "held_out_tokens": held_tokens, "loss_domains": list(table.loss_domains), "mix_domains": list(table.mix_domains),
        "observed_best": {"run": str(test_t.run[best_obs_idx]), "mean_loss": float(obs_mean[best_obs_idx]),
                          "weights": dict(zip(table.mix_domains, test_t.mix_rm[best_obs_idx].tolist()))},
        "seed": seed, "starts": starts, "laws": {},
    }
    for name in laws:
        law = get_law(name)
        entry: dict[str, Any] = {"mixture_moves_with_scale": bool(law.mixture_moves_with_scale), "domains": {}}
        try:
            fits = {}
            t0 = time.perf_counter()
            for d in table.loss_domains:
                fits[d] = law.fit(train_t, d, size_column=size_column, seed=seed, starts=starts)
            entry["fit_seconds"] = time.perf_counter() - t0
        except TableError as e:
            entry["skipped"] = str(e)
            report["laws"][name] = entry
            continue
        pred_rv = np.stack([fits[d].predict(size_te, test_t.tokens, test_t.mix_rm) for d in table.loss_domains], axis=1)
        for j, d in enumerate(table.loss_domains):
            obs, pred = test_t.loss_rv[:, j], pred_rv[:, j]
            entry["domains"][d] = {
                "mae": float(np.mean(np.abs(pred - obs))),
                "mre": float(np.mean(np.abs(pred - obs) / obs)),
                "spearman": _spearman_by_tokens(test_t.tokens, obs, pred),
                "num_params": int(fits[d].num_params),
            }
        doms = entry["domains"].values()
        entry["mean"] = {k: float(np.nanmean([v[k] for v in doms])) for k in ("mae", "mre", "spearman")}
        entry["mean"]["spearman_of_mean_loss"] = _spearman_by_tokens(test_t.tokens, obs_mean, pred_rv.mean(axis=1))
        pick = np.flatnonzero(last)[np.argmin(pred_rv.mean(axis=1)[last])]
        entry["pick_regret"] = float(obs_mean[pick] - obs_mean[best_obs_idx])
        entry["picked_tested_run"] = str(test_t.run[pick])
        opt = optimize_mixture(_PointFit(name, size_column, table.mix_domains, fits), size=held_size,
                               tokens=held_tokens, starts=4, seed=seed, bootstrap=False)
        entry["optimal_mixture"] = opt["weights"]
        entry["optimal_predicted_mean_loss"] = opt["objective"]["value"]
        entry["predictions"] = {
            "run": test_t.run.tolist(), "tokens": test_t.tokens.tolist(),
            "observed": test_t.loss_rv.tolist(), "predicted": pred_rv.tolist(),
        }
        report["laws"][name] = entry
    return report


def format_report(report: dict[str, Any]) -> str:
    """Markdown tables: per-law means, then per law and domain."""
    lines = [f"Hold-out: {report['holdout']}; fitted on {report['train_rows']} rows at sizes "
             f"{', '.join(f'{s:.3g}' for s in report['train_sizes'])}, predicting {report['test_rows']} rows.",
             f"Best tested mixture at the held-out size: {report['observed_best']['run']} "
             f"(mean loss {report['observed_best']['mean_loss']:.4f}).", "",
             "| law | MAE | mean rel. error | Spearman (mean over domains) | Spearman (mean loss) | pick regret | fit s | "
             "optimal mixture (" + ", ".join(report["mix_domains"]) + ") |",
             "|---|---|---|---|---|---|---|---|"]
    for name, e in report["laws"].items():
        if "skipped" in e:
            lines.append(f"| {name} | skipped: {e['skipped']} | | | | | | |")
            continue
        m = e["mean"]
        mix = ", ".join(f"{e['optimal_mixture'][d]:.2f}" for d in report["mix_domains"])
        lines.append(f"| {name} | {m['mae']:.4f} | {m['mre']:.4f} | {m['spearman']:.3f} | {m['spearman_of_mean_loss']:.3f} | "
                     f"{e['pick_regret']:.4f} | {e['fit_seconds']:.1f} | {mix} |")
    lines += ["", "| law | domain | MAE | mean rel. error | Spearman |", "|---|---|---|---|---|"]
    for name, e in report["laws"].items():
        for d, v in e.get("domains", {}).items():
            lines.append(f"| {name} | {d} | {v['mae']:.4f} | {v['mre']:.4f} | {v['spearman']:.3f} |")
    return "\n".join(lines)
