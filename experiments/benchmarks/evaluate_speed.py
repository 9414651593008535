"""Wall time of ``evaluate`` (every law + the baselines) on a 1,008-row table with 5 held-out sizes.

    ./launch.sh python -m experiments.benchmarks.evaluate_speed [--starts 64,16] [--laws camel,additive]
        [--out results/evaluate_speed.json]

The table (``make_table``): 4 training domains (``ROBUST_DOMAINS``), 4 validation domains drawn
from four of the robustness truths (``camel``, ``additive``, ``mixture_floor``, ``capped_domain``
of :mod:`data_mixture.synthetic`, one per domain), 7 log-spaced sizes 1e7..1e9 x the same 16
mixtures (Dirichlet(1)) x 3 seeds x 3 checkpoints (0.5, 0.75, 1 of 20 tokens per parameter) =
1,008 rows, 0.5 % log-normal noise per row (each seed its own draw). ``evaluate --holdout each``
holds out the 5 sizes above the two smallest in turn, each fitted on the sizes below it.

For every ``--starts`` value the whole evaluation runs once in a fresh process, so every figure
includes jit compilation, as a CLI call of ``evaluate`` does: wall and process CPU seconds,
per-law fit seconds summed over hold-outs, the rest (baselines, bootstrap, optima), the
machine's load before and after, and per method the decision accuracy (mean loss) and MAE at
each hold-out, so that fewer starts can be judged by what they cost in accuracy.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from data_mixture.evaluate import evaluate_laws
from experiments.benchmarks.timing import write_json
from data_mixture.laws import LAWS
from data_mixture.synthetic import ROBUST_DOMAINS, ROBUST_TRUTHS, draw_design, synthetic_table

SIZES = tuple(float(x) for x in 1e7 * 10 ** (np.arange(7) / 3))  # 1e7 .. 1e9
MIXTURES = 16
SEEDS = 3
CHECKPOINTS = (0.5, 0.75, 1.0)
NOISE = 0.005
TRUTHS = ("camel", "additive", "mixture_floor", "capped_domain")  # validation domain v follows TRUTHS[v]


def make_table():
    """The 1,008-row table: every (size, mixture) run once per seed, noise drawn per row."""
    design = draw_design(mix_domains=ROBUST_DOMAINS, sizes=SIZES, runs_per_size=MIXTURES, checkpoints=CHECKPOINTS,
                         tokens_per_param=20.0, seed=0, shared_mixtures=True)
    cols: dict[str, list] = {k: [] for k in design}
    cols["seed"] = []
    for s in range(SEEDS):
        for k, v in design.items():
            cols[k] += [f"{x}_seed{s}" for x in v] if k == "run" else list(v)
        cols["seed"] += [s] * len(design["run"])
    truths = [ROBUST_TRUTHS[t] for t in TRUTHS]
    return synthetic_table(lambda v, n, d, m: truths[v](n, d, m), cols, ROBUST_DOMAINS, domains=ROBUST_DOMAINS,
                           noise=NOISE, seed=0)


def run_once(table, laws, starts: int) -> dict:
    load0 = os.getloadavg()[0]
    t0, c0 = time.perf_counter(), time.process_time()
    report = evaluate_laws(table, laws, holdout="each", size_column="params_total", starts=starts, seed=0)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    fit_s = {law: round(sum(r["laws"][law].get("fit_seconds", 0.0) for r in report["holdouts"]), 2) for law in laws}
    methods = report["summary"]["methods"]
    return {
        "starts": starts, "seconds": round(wall, 2), "cpu_seconds": round(cpu, 2), "law_fit_seconds": fit_s,
        "other_seconds": round(wall - sum(fit_s.values()), 2),
        "held_out_sizes": report["summary"]["held_out_sizes"],
        "decision_accuracy": {m: v["decision_accuracy"] for m, v in methods.items()},
        "mean_decision_accuracy": {m: v["mean_decision_accuracy"] for m, v in methods.items()},
        "mae": {m: v["mae"] for m, v in methods.items()},
        "verdict": report["verdict"]["text"],
        "load_avg_1min_before": round(load0, 2), "load_avg_1min_after": round(os.getloadavg()[0], 2),
    }


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--laws", default=",".join(LAWS))
    ap.add_argument("--starts", default="64,16", help="random starts per law fit, one evaluation each (comma-separated)")
    ap.add_argument("--out", default="results/evaluate_speed.json")
    ap.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)  # internal: one setting, JSON on stdout
    args = ap.parse_args(argv)
    laws = [x for x in args.laws.split(",") if x]
    if args.one is not None:
        print("RESULT " + json.dumps(run_once(make_table(), laws, args.one)))
        return {}
    table = make_table()
    sizes = np.unique(table.params_total)
    print(f"table: {len(table)} rows, {len(sizes)} sizes, {MIXTURES} mixtures x {SEEDS} seeds x {len(CHECKPOINTS)} checkpoints; "
          f"laws {', '.join(laws)}", flush=True)
    result = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform()}, "rows": len(table),
              "sizes": sizes.tolist(), "laws": laws, "runs": []}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for starts in (int(s) for s in args.starts.split(",")):
        proc = subprocess.run([sys.executable, "-m", "experiments.benchmarks.evaluate_speed", "--laws", ",".join(laws),
                               "--one", str(starts)], capture_output=True, text=True)
        lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
        if proc.returncode or not lines:
            raise SystemExit(f"the evaluation with {starts} starts failed:\n{proc.stderr[-3000:]}")
        got = json.loads(lines[-1][len("RESULT "):])
        result["runs"].append(got)
        print(f"starts {starts:3d}: {got['seconds']:7.1f} s wall, {got['cpu_seconds']:7.1f} s CPU, law fits {got['law_fit_seconds']}, "
              f"rest {got['other_seconds']} s (load {got['load_avg_1min_before']} -> {got['load_avg_1min_after']})", flush=True)
        for m, acc in got["mean_decision_accuracy"].items():
            print(f"    {m:16s} decision accuracy per hold-out {_r(got['decision_accuracy'][m])}  mean {_r(acc)}  MAE {_r(got['mae'][m])}")
        print(f"    {got['verdict']}", flush=True)
        write_json(out, result, announce=False)  # after every setting, so a cut-short run keeps its numbers
    print(f"wrote {out}")
    return result


def _r(x):
    if isinstance(x, list):
        return [_r(v) for v in x]
    return None if x is None else round(float(x), 3)


if __name__ == "__main__":
    main()
