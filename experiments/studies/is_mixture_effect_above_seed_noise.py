"""Pilot of the mid-training protocol: is the mixture effect larger than the seed noise?

    ./launch.sh python -m data_mixture sweep --plan experiments/studies/results/midtrain_pilot/plan.json \\
        --root runs/midtrain_pilot --parallel 2 --eval-args '--max-items 128'
    ./launch.sh python -m experiments.studies.is_mixture_effect_above_seed_noise --runs runs/midtrain_pilot/runs.csv \\
        --out experiments/studies/results/midtrain_pilot

The plan: one base at one proxy size, K mixtures x S seeds continued from it. For each metric
(held-out loss per domain and of the mean over domains, each benchmark score), at the final
checkpoint of the mid-training runs:

- ``seed_sd``: the pooled within-mixture standard deviation over seeds (``decisions.pooled_sd``);
- ``mixture_sd``: the standard deviation of the K mixtures' seed means;
- ``ratio`` = mixture_sd / (seed_sd / sqrt(S)): how many standard errors of a mixture's mean the
  mixtures spread over; a protocol can tell mixtures apart where it is well above 2.

Writes ``pilot.json`` and ``pilot.md`` (the runs table is copied beside them).
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import numpy as np

from data_mixture.decisions import pooled_sd
from data_mixture.table import read_runs


def spread(x_r: np.ndarray, cell_r: np.ndarray) -> dict:
    """Seed noise and mixture spread of one metric (rows of the final checkpoints)."""
    keep = np.isfinite(x_r)
    x_r, cell_r = x_r[keep], cell_r[keep]
    noise = pooled_sd(x_r, cell_r)
    cells = np.unique(cell_r)
    means_k = np.array([x_r[cell_r == c].mean() for c in cells])
    seeds = float(np.mean([np.sum(cell_r == c) for c in cells])) if cells.size else 0.0
    mixture_sd = float(np.std(means_k, ddof=1)) if cells.size > 1 else None
    ratio = None
    if noise["sd"] and mixture_sd is not None:
        ratio = mixture_sd / (noise["sd"] / np.sqrt(seeds))
    return {"seed_sd": noise["sd"], "dof": noise["dof"], "mixtures": int(cells.size), "seeds_per_mixture": seeds,
            "mixture_sd": mixture_sd, "ratio": ratio, "mixture_means": means_k.tolist()}


def analyse_size(final) -> dict:
    """Every metric's :func:`spread` over the final-checkpoint rows of one size."""
    cell_r = final.mixture_keys()
    metrics = {f"loss:{d}": final.loss(d) for d in final.loss_domains}
    metrics["loss:mean"] = final.loss_rv.mean(axis=1)
    for j, task in enumerate(final.bench_tasks):
        metrics[f"bench:{task}"] = final.bench_rt[:, j]
    return {"params_active": float(final.params_active[0]), "mid_tokens": float(final.tokens.max()),
            "base_tokens": float(final.base_tokens.max()),
            "metrics": {name: spread(x, cell_r) for name, x in metrics.items()}}


def analyse(runs_csv: str) -> dict:
    """{runs, sizes: {params_active: analyse_size(...)}} over the mid-training runs' final checkpoints."""
    table = read_runs(runs_csv)
    mid = table.law_rows()
    if not mid.mid_training().any():
        raise SystemExit(f"{runs_csv}: no mid-training rows (no 'base' column); this pilot reads a mid-training sweep.")
    last = np.array([t == mid.tokens[mid.run == r].max() for r, t in zip(mid.run, mid.tokens)])
    final = mid.take(last)
    sizes = np.unique(final.params_active)
    return {"runs": runs_csv, "sizes": {f"{n:.6g}": analyse_size(final.take(final.params_active == n)) for n in sizes}}


def fmt(x, spec=".4f") -> str:
    return "n/a" if x is None else format(x, spec)


def report_md(result: dict) -> str:
    lines = ["# Mid-training pilot: seed noise vs mixture spread", "",
             "Final checkpoints of the mid-training runs. `ratio` = mixture sd / (seed sd / sqrt(seeds)): how many "
             "standard errors of a mixture's mean the mixtures spread over."]
    for r in result["sizes"].values():
        lines += ["", f"## {r['params_active']:.4g} active parameters (base {r['base_tokens']:.4g} tokens, "
                      f"mid-training {r['mid_tokens']:.4g} tokens)", "",
                  "| metric | seed sd (dof) | mixture sd | ratio | mixture means |", "|---|---|---|---|---|"]
        for name, m in r["metrics"].items():
            means = ", ".join(f"{v:.4f}" for v in m["mixture_means"])
            lines.append(f"| {name} | {fmt(m['seed_sd'])} ({m['dof']}) | {fmt(m['mixture_sd'])} | {fmt(m['ratio'], '.1f')} | {means} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", required=True, help="runs table of the pilot sweep (ROOT/runs.csv)")
    ap.add_argument("--out", required=True, help="directory for pilot.json, pilot.md and a copy of the runs table")
    args = ap.parse_args(argv)
    result = analyse(args.runs)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "pilot.json").write_text(json.dumps(result, indent=1))
    (out / "pilot.md").write_text(report_md(result))
    shutil.copyfile(args.runs, out / "runs.csv")
    print(report_md(result))


if __name__ == "__main__":
    main()
