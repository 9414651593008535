"""Fit time of every mixture law on a swarm-sized table (512 runs x 64 domains), and CAMEL's bootstrap on a 50-run ladder.

    ./launch.sh python -m experiments.benchmarks.law_fit_swarm [--laws camel,additive] [--parts point,bootstrap]
        [--out experiments/benchmarks/results/law_fit/swarm.json]

Targets: every law's point fit (no bootstrap, 64 starts) of a 512-run, 64-domain table in under
60 s, and ``camel``'s 100-member bootstrap of a 50-run ladder in under 2 minutes, on 2 cores.

* ``point``: the laws that fit one size (``log_linear``, ``regmix``, ``regmix_linear``) fit
  Olmix's ``full_recomputation`` swarm itself (512 runs, 64 domains, one 30M size; target
  ``mean_bpb``). The others need several sizes, so they fit :func:`swarm_ladder`: 128 of that
  swarm's mixtures at 4 sizes (512 runs, one checkpoint each, tokens = 20 N), losses drawn from
  ``L = c + exp(t . r) + A (N / 3e7)^-0.3`` with (c, t) the ``log_linear`` fit of the swarm's
  mean BPB and A = 0.3, times 0.5 % log-normal noise (seed 0): the real mixtures' effect plus a
  size term.
* ``bootstrap``: ``camel`` on the headroom study's ladder (``experiments/studies/results/headroom_v1/
  runs.csv``: 48 mid-training runs, 4 domains, 3 sizes; target ``heldout_qa``, size column
  ``params_active``, as the study fits it), ``fit_table(..., bootstrap=100)``.

Each fit runs in a fresh process state for its law (the first fit of a law includes jit
compilation, as a user's first fit does). Wall seconds, the process's CPU seconds (summed over
threads) and the 1-minute load average before and after are recorded: the 2 cores are shared,
so wall times are upper bounds and CPU seconds the steadier measure.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import time
import warnings
from pathlib import Path

import numpy as np

from data_mixture.fit import fit_table
from data_mixture.laws import LAWS, get_law
from data_mixture.table import RunsTable, from_columns, read_runs
from experiments.benchmarks.timing import write_json

SWARM = Path("experiments/benchmarks/results/olmix_swarms/full_recomputation_runs.csv")
LADDER = Path("experiments/studies/results/headroom_v1/runs.csv")
SIZES = (1e7, 3e7, 1e8, 3e8)
MIXTURES = 128
POINT_LIMIT_S, BOOT_LIMIT_S = 60.0, 120.0


def swarm_ladder(swarm: RunsTable, seed: int = 0) -> RunsTable:
    """512 rows: the first :data:`MIXTURES` mixtures of ``swarm`` at each of :data:`SIZES` (see the module docstring)."""
    truth = get_law("log_linear").fit(swarm, "mean_bpb", seed=0)
    c, t = truth.params["c"], np.asarray(truth.params["t"])
    mix = swarm.mix_rm[:MIXTURES]
    rng = np.random.default_rng(seed)
    cols: dict[str, list] = {"run": [], "params_total": [], "params_active": [], "tokens": []}
    cols.update({f"mix:{d}": [] for d in swarm.mix_domains})
    cols["loss:mean_bpb"] = []
    for n in SIZES:
        loss = (c + np.exp(mix @ t) + 0.3 * (n / 3e7) ** -0.3) * np.exp(0.005 * rng.standard_normal(len(mix)))
        for k in range(len(mix)):
            cols["run"].append(f"m{k:03d}-n{n:.0e}")
            cols["params_total"].append(n)
            cols["params_active"].append(n)
            cols["tokens"].append(20 * n)
            for j, d in enumerate(swarm.mix_domains):
                cols[f"mix:{d}"].append(float(mix[k, j]))
            cols["loss:mean_bpb"].append(float(loss[k]))
    return from_columns(cols)


def _measure(fn) -> tuple[object, dict]:
    load0, t0, c0 = os.getloadavg()[0], time.perf_counter(), time.process_time()
    out = fn()
    return out, {"seconds": round(time.perf_counter() - t0, 2), "cpu_seconds": round(time.process_time() - c0, 2),
                 "load_avg_1min_before": round(load0, 2), "load_avg_1min_after": round(os.getloadavg()[0], 2)}


def point_row(law: str, swarm: RunsTable, ladder: RunsTable) -> dict:
    one_size = get_law(law).min_sizes() == 1
    only = swarm if one_size else ladder
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit, m = _measure(lambda: fit_table(only, law, bootstrap=0, starts=64, seed=0, progress=False, target="mean_bpb"))
    p = fit.point["mean_bpb"]  # type: ignore[attr-defined]
    keep = ("objective", "starts", "starts_near_best", "stage1_seconds", "polish_seconds", "stage1_iterations", "polish_iterations")
    return {"law": law, "table": "olmix full_recomputation" if one_size else "swarm_ladder", "rows": len(only),
            "mix_domains": len(only.mix_domains), "num_params": p.num_params, **m, "limit_s": POINT_LIMIT_S,
            "within_limit": m["seconds"] < POINT_LIMIT_S, "fit_info": {k: p.info[k] for k in keep if k in p.info}}


def bootstrap_row(resamples: int = 100) -> dict:
    table = read_runs(LADDER)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit, m = _measure(lambda: fit_table(table, "camel", bootstrap=resamples, starts=64, seed=0, progress=False,
                                            size_column="params_active", target="heldout_qa"))
    return {"law": "camel", "table": str(LADDER), "runs": int(fit.info["n_runs"]), "rows": int(fit.info["n_rows"]),  # type: ignore[attr-defined]
            "mix_domains": len(table.mix_domains), "bootstrap": resamples, **m,
            "phase_seconds": {k: round(v, 2) for k, v in fit.info["phase_seconds"].items()},  # type: ignore[attr-defined]
            "limit_s": BOOT_LIMIT_S, "within_limit": m["seconds"] < BOOT_LIMIT_S}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--laws", default=",".join(LAWS))
    ap.add_argument("--parts", default="point,bootstrap")
    ap.add_argument("--out", type=Path, default=Path("experiments/benchmarks/results/law_fit/swarm.json"))
    args = ap.parse_args(argv)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    result: dict = {"commit": commit, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                    "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "cpu": _cpu_model()}, "point": [], "bootstrap": []}
    parts = args.parts.split(",")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if "point" in parts:
        swarm = read_runs(SWARM)
        ladder = swarm_ladder(swarm)
        for law in args.laws.split(","):
            row = point_row(law, swarm, ladder)
            result["point"].append(row)
            print(f"{law:14s} {row['table']:26s} {row['seconds']:7.1f} s  cpu {row['cpu_seconds']:7.1f} s  load "
                  f"{row['load_avg_1min_before']:.1f} -> {row['load_avg_1min_after']:.1f}  {row['fit_info']}", flush=True)
            write_json(args.out, result, indent=1, announce=False)
    if "bootstrap" in parts:
        row = bootstrap_row()
        result["bootstrap"].append(row)
        print(f"camel bootstrap 100 on {row['runs']} runs: {row['seconds']:.1f} s (cpu {row['cpu_seconds']:.1f} s) {row['phase_seconds']}", flush=True)
    write_json(args.out, result, indent=1)
    return result


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


if __name__ == "__main__":
    main()
