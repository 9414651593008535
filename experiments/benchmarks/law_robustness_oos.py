"""Law robustness out of sample: truths written after the law forms were frozen.

    .venv/bin/python -m experiments.benchmarks.law_robustness_oos [--seeds 0,1] [--starts 16]
        [--out experiments/studies/results/robustness]

The in-sample matrix (``law_robustness``, ``robustness.md``) is not a test of CAMEL's current form:
that form was chosen on the matrix's own truths. Here the forms were frozen first
(``law_robustness --freeze`` wrote ``frozen_laws.json``: a sha256 of every ``data_mixture/laws/*.py``
and the UTC time, committed before this file), and the truths below were designed afterwards,
without fitting any law to them. A run refuses to call its results out of sample when a law's
source hash differs from the frozen one (it names the changed files in ``oos.md``).

Three new forms, each at two strengths (the optimum's gain over the uniform mixture at the target,
``gain_target`` in ``oos.json``: the real mid-training study's scale, 0.1-1 %, and large ones):

* ``repetition``: data-constrained sources. math and knowledge have fixed pools of unique tokens;
  upweighting them repeats them, and a domain's effective tokens follow Muennighoff et al. 2023,
  ``D' = U + U R* (1 - exp(-R / R*))`` with ``R = D / U - 1`` (R* = 15.4, their fit). Small models
  want the valuable scarce data; at the target its pool is exhausted, so the optimum moves.
* ``target_mix``: the validation set is not the training mix: a weighted set of four skills
  (0.1, 0.3, 0.4, 0.2), each drawing on every training domain through a transfer matrix; the
  knowledge domain's transfer grows with size (``n^0.2``).
* ``log_linear``: ``log L`` linear in the mixture with a size interaction (RegMix's form with a
  ``r . v log n`` term), so the best vertex changes with size.

The small ``target_mix`` strength is the large one's mixture effect scaled down
(``L(u) + lambda (L(r) - L(u))``, lambda = 0.25: the same optimum, a quarter of the gain); the other
two take smaller coefficients. Noise: log-normal with one sd per table drawn uniformly in 0.7-1.2 %
(the measured per-domain seed noise of the mid-training study). The design, sizes, target,
test mixtures and scores are those of ``law_robustness`` (``--starts`` and ``--seeds`` reduced to
keep the run to a few CPU minutes on 2 shared cores).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import time
from pathlib import Path

import numpy as np

from data_mixture.laws import LAWS, get_law
from data_mixture.synthetic import ROBUST_DOMAINS, ROBUST_D_REF, ROBUST_N_REF, draw_design, simplex_grid, synthetic_table
from data_mixture.table import TableError
from experiments.benchmarks.timing import write_json
from experiments.benchmarks import law_robustness as lr

R_STAR = 15.4  # Muennighoff et al. 2023's fitted R*
NOISE_RANGE = (0.007, 0.012)
UNIFORM = np.full(len(ROBUST_DOMAINS), 1.0 / len(ROBUST_DOMAINS))


def _nd(size_r, tokens_r):
    return np.asarray(size_r, np.float64) / ROBUST_N_REF, np.asarray(tokens_r, np.float64) / ROBUST_D_REF


def repetition(g: float):
    """L = 1.6 + 0.5 n^-0.35 + 0.8 (sum_j c_j D'_j^0.6)^-0.35, c = exp(g (0, -1, 0.3, 1)),
    D'_j the effective tokens of domain j (repeats beyond the pools U = (inf, inf, 0.3, 0.05) in
    units of 2e9 tokens: math 6e8, knowledge 1e8 unique tokens)."""
    pool = np.array([np.inf, np.inf, 0.3, 0.05])
    c = np.exp(g * np.array([0.0, -1.0, 0.3, 1.0]))

    def fn(size_r, tokens_r, mix_rm):
        n, d = _nd(size_r, tokens_r)
        x = d[:, None] * np.asarray(mix_rm, np.float64)
        with np.errstate(invalid="ignore"):
            rep = np.maximum(x / pool - 1.0, 0.0)
            eff = np.where(x > pool, pool + pool * R_STAR * (1.0 - np.exp(-rep / R_STAR)), x)
        return 1.6 + 0.5 * n**-0.35 + 0.8 * np.sum(c * np.power(np.maximum(eff, 1e-30), 0.6), axis=1) ** -0.35

    fn.__doc__ = repetition.__doc__.replace("g (", f"{g:g} (")
    return fn


def target_mix(g: float, scale: float = 1.0):
    """L = sum_v w_v L_v, w = (0.1, 0.3, 0.4, 0.2); L_v = E_v + 0.5 n^-0.35 + B_v (d q_v)^-0.3,
    q_v = sum_j T_vj k_j r_j with T = rows of (I + g S) normalised, k = (1, 1, 1, n^0.2),
    E = (1.2, 1.6, 1.0, 1.4), B = (0.6, 0.8, 1.0, 0.9), S = [[0 .2 .6 .1] [.1 0 .3 .5] [.5 .6 0 .2]
    [0 .8 .1 0]]; the mixture effect scaled by ``scale`` about the uniform mixture."""
    w, e, b = np.array([0.1, 0.3, 0.4, 0.2]), np.array([1.2, 1.6, 1.0, 1.4]), np.array([0.6, 0.8, 1.0, 0.9])
    t = np.eye(4) + g * np.array([[0, .2, .6, .1], [.1, 0, .3, .5], [.5, .6, 0, .2], [0, .8, .1, 0]])
    t = t / t.sum(axis=1, keepdims=True)

    def full(size_r, tokens_r, mix_rm):
        n, d = _nd(size_r, tokens_r)
        k = np.ones((n.shape[0], 4))
        k[:, 3] = n**0.2
        q = (np.asarray(mix_rm, np.float64) * k) @ t.T
        return (e + 0.5 * n[:, None] ** -0.35 + b * (d[:, None] * np.maximum(q, 1e-9)) ** -0.3) @ w

    def fn(size_r, tokens_r, mix_rm):
        if scale == 1.0:
            return full(size_r, tokens_r, mix_rm)
        base = full(size_r, tokens_r, np.broadcast_to(UNIFORM, np.shape(mix_rm)))
        return base + scale * (full(size_r, tokens_r, mix_rm) - base)

    fn.__doc__ = target_mix.__doc__ + f" (g = {g:g}, scale = {scale:g})"
    return fn


def log_linear(g: float):
    """log L = log 3 + r . w + (r . v) log n - 0.06 log n - 0.05 log d, w = g (0, -0.6, 0.5, -0.3),
    v = g (0, 0.15, -0.2, -0.35)."""
    w, v = g * np.array([0.0, -0.6, 0.5, -0.3]), g * np.array([0.0, 0.15, -0.2, -0.35])

    def fn(size_r, tokens_r, mix_rm):
        n, d = _nd(size_r, tokens_r)
        r = np.asarray(mix_rm, np.float64)
        return np.exp(np.log(3.0) + r @ w + (r @ v) * np.log(n) - 0.06 * np.log(n) - 0.05 * np.log(d))

    fn.__doc__ = log_linear.__doc__.replace("g (", f"{g:g} (")
    return fn


OOS_TRUTHS = {
    "repetition_small": repetition(0.2),
    "repetition_large": repetition(2.0),
    "target_mix_small": target_mix(1.0, scale=0.25),
    "target_mix_large": target_mix(3.0),
    "log_linear_small": log_linear(0.004),
    "log_linear_large": log_linear(0.1),
}
"""name -> L(N, D, mix_rm) (noiseless), written after the law forms were frozen."""


def gain_over_uniform(fn, size: float) -> tuple[list[float], float]:
    """The optimum over the simplex (step 0.05) at ``size`` (20 tokens/param) and its relative gain over uniform."""
    grid = simplex_grid(len(ROBUST_DOMAINS), 0.05)
    loss = fn(np.full(len(grid), size), np.full(len(grid), size * lr.TOKENS_PER_PARAM), grid)
    uni = float(fn(np.array([size]), np.array([size * lr.TOKENS_PER_PARAM]), UNIFORM[None])[0])
    return grid[int(np.argmin(loss))].tolist(), (uni - float(loss.min())) / uni


def truth_info() -> dict:
    out = {}
    for name, fn in OOS_TRUTHS.items():
        lo, g_lo = gain_over_uniform(fn, lr.SIZES[0])
        hi, g_hi = gain_over_uniform(fn, lr.TARGET)
        out[name] = {"doc": " ".join(fn.__doc__.split()), "optimum_smallest": lo, "optimum_target": hi,
                     "gain_smallest": g_lo, "gain_target": g_hi,
                     "optimum_moves": bool(np.abs(np.subtract(lo, hi)).sum() > 1e-9),
                     "optimum_shift_l1": float(np.abs(np.subtract(lo, hi)).sum())}
    return out


def noise_of(truth: str, seed: int) -> float:
    """The table's noise sd, uniform in NOISE_RANGE, drawn from (truth, seed)."""
    key = sum(map(ord, truth))
    return float(np.random.default_rng([seed, key]).uniform(*NOISE_RANGE))


def run_cell(truth: str, design: str, law: str, seed: int, starts: int) -> dict:
    cols = draw_design(mix_domains=ROBUST_DOMAINS, sizes=lr.SIZES, runs_per_size=lr.RUNS_PER_SIZE,
                       checkpoints=lr.CHECKPOINTS, tokens_per_param=lr.TOKENS_PER_PARAM, seed=seed,
                       shared_mixtures=design == "same", concentration=1.0)
    fn, noise = OOS_TRUTHS[truth], noise_of(truth, seed)
    table = synthetic_table(lambda v, n, d, m: fn(n, d, m), cols, ROBUST_DOMAINS, noise=noise, seed=seed)
    mix_km = lr.test_mixtures()
    size_k = np.full(len(mix_km), lr.TARGET)
    tokens_k = np.full(len(mix_km), lr.TARGET * lr.TOKENS_PER_PARAM * lr.CHECKPOINTS[-1])
    t0 = time.perf_counter()
    try:
        fit = get_law(law).fit(table, "valid", starts=starts, seed=seed)
    except TableError as e:
        return {"refused": str(e), "noise": noise}
    out = lr.score(fit.predict(size_k, tokens_k, mix_km), fn(size_k, tokens_k, mix_km))
    out.update(noise=noise, fit_seconds=round(time.perf_counter() - t0, 2))
    return out


def markdown(summary: dict, tinfo: dict, laws, meta: dict) -> str:
    frozen = meta["frozen"]
    status = ("**Out of sample**: every law's source hash equals the frozen one "
              f"(frozen {frozen['frozen_at']}, `frozen_laws.json`)." if not meta["changed_laws"] else
              "**Not out of sample**: law sources changed since they were frozen: "
              + ", ".join(meta["changed_laws"]) + ".")
    lines = [f"# Law robustness out of sample ({meta['date']}, load {meta['load_before']:.1f} -> {meta['load_after']:.1f}, "
             f"{meta['cpus']} cpus)", "", status, "",
             f"Truths written after the freeze (`experiments/benchmarks/law_robustness_oos.py`); design as the in-sample "
             f"matrix (4 sizes {lr.SIZES[0]:.0e}..{lr.SIZES[-1]:.0e} x {lr.RUNS_PER_SIZE} mixtures x 2 checkpoints, "
             f"extrapolated to {lr.TARGET:.0e}), noise drawn per table in {NOISE_RANGE[0]:.1%}-{NOISE_RANGE[1]:.1%}, "
             f"{meta['starts']} starts (the in-sample matrix: 64), seeds {', '.join(map(str, meta['seeds']))}. Cell: mean "
             "relative error % (sd over seeds) / pairwise decision accuracy.", "",
             "| truth | gain over uniform at 1e7 / at the target | optimum moves (L1) |", "|---|---|---|"]
    for name, t in tinfo.items():
        lines.append(f"| {name} | {t['gain_smallest']:.2%} / {t['gain_target']:.2%} | "
                     f"{'yes (' + format(t['optimum_shift_l1'], '.2f') + ')' if t['optimum_moves'] else 'no'} |")
    lines += ["", "| truth | design | " + " | ".join(laws) + " | camel / best s.i. (err ratio, acc diff) |",
              "|---|---|" + "---|" * len(laws) + "---|"]
    for key, row in summary.items():
        t, d = key.split("|")
        cells = []
        for law in laws:
            r = row.get(law)
            cells.append("" if r is None else "refused" if "refused" in r else
                         f"{100 * r['rel_err'][0]:.2f} ({100 * r['rel_err'][1]:.2f}) / {r['acc'][0]:.3f}")
        g = lr.goal_check(row)
        lines.append(f"| {t} | {d} | " + " | ".join(cells) + f" | {'' if g is None else format(g['rel_err_ratio'], '.2f') + ', ' + format(g['acc_diff'], '+.3f')} |")
    worse, every = lr.goal_lines(summary)
    lines += ["", f"CAMEL no worse than the best scale-independent law (additive, regmix_linear: relative error and "
                  f"decision accuracy) on every table: **{'yes' if every else 'no'}**."]
    lines += ([""] + worse) if worse else []
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--laws", default=",".join(LAWS))
    ap.add_argument("--truths", default=",".join(OOS_TRUTHS))
    ap.add_argument("--designs", default=",".join(lr.DESIGNS))
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--starts", type=int, default=16)
    ap.add_argument("--out", default="experiments/studies/results/robustness")
    args = ap.parse_args(argv)
    out = Path(args.out)
    frozen_path = out / lr.FROZEN
    if not frozen_path.exists():
        raise SystemExit(f"{frozen_path} is missing: freeze the law forms first "
                         "(python -m experiments.benchmarks.law_robustness --freeze) and commit it before writing truths.")
    frozen = json.loads(frozen_path.read_text())
    laws, truths = args.laws.split(","), args.truths.split(",")
    designs, seeds = args.designs.split(","), [int(s) for s in args.seeds.split(",")]
    path = out / "oos.json"
    result = json.loads(path.read_text()) if path.exists() else {"cells": {}}
    cells = result["cells"]
    todo = [(t, d, law, s) for t in truths for d in designs for s in seeds for law in laws
            if lr.cell_key(t, d, law, s) not in cells]
    if todo:  # cells are fitted on this host: the file is then this run's (write_json adds it)
        result.pop("host", None)
    load0, t0, c0 = os.getloadavg()[0], time.perf_counter(), time.process_time()
    for t, d, law, s in todo:
        cells[lr.cell_key(t, d, law, s)] = run_cell(t, d, law, s, args.starts)
        write_json(path, result, indent=1, announce=False)
        print(f"{t} {d} {law} {s}: {cells[lr.cell_key(t, d, law, s)].get('rel_err', 'refused')}", flush=True)
    tinfo = truth_info()
    summary = lr.summarise(cells, [t for t in OOS_TRUTHS if t in truths], lr.DESIGNS, list(LAWS), seeds)
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "cpus": os.cpu_count(),
            "load_before": load0, "load_after": os.getloadavg()[0], "seconds_this_run": round(time.perf_counter() - t0, 1),
            "cpu_seconds_this_run": round(time.process_time() - c0, 1), "cells_this_run": len(todo),
            "starts": args.starts, "seeds": seeds, "noise_range": NOISE_RANGE, "frozen": frozen,
            "law_hashes": lr.law_hashes(), "changed_laws": lr.changed_laws(frozen)}
    if not todo and "meta" in result:
        meta = {**result["meta"], "law_hashes": lr.law_hashes(), "changed_laws": lr.changed_laws(frozen)}
    result.update(meta=meta, truths=tinfo, summary=summary, goal={k: lr.goal_check(r) for k, r in summary.items()})
    write_json(path, result, indent=1, announce=False)
    md = markdown(summary, tinfo, list(LAWS), meta)
    (out / "oos.md").write_text(md)
    print(md)
    return result


if __name__ == "__main__":
    main()
