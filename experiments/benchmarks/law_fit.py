"""Fit time of every mixture law on a synthetic 1,000-row, 5-domain runs table.

    .venv/bin/python -m experiments.benchmarks.law_fit [--laws camel,additive] [--bootstrap 100]
        [--starts 64] [--out results/law_fit.json]

The table: 5 training domains, 5 validation domains, 4 sizes (1e7..1e9) x 50 mixtures x 5
checkpoints = 1,000 rows, drawn from a camel law (validation domain v shifts the truth) with
0.5 % log-normal noise; mixing_law gets the same 50 mixtures at every size (it needs them).
Times are wall-clock for ``fit_table`` (point fit of all 5 domains + bootstrap), including
jit compilation, split into phases (``point``: multi-start stage 1 + polish of all domains;
``bootstrap``: all domain x resample refits), plus the process CPU time and the machine's
load alongside: on a shared machine wall-clock numbers are upper bounds, and CPU seconds
(summed over threads) are the steadier measure of the work done.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path

from data_mixture.fit import fit_table
from experiments.benchmarks.timing import write_json
from data_mixture.laws import LAWS, LawFit
from data_mixture.synthetic import draw_design, synthetic_table

DOMS = ("code", "prose", "math", "knowledge", "web")
VALID = ("v_code", "v_prose", "v_math", "v_knowledge", "v_web")
TRUTH = {"E": 1.6, "A": 0.6, "alpha": 0.35, "B": 0.8, "beta": 0.3, "rho": 0.5, "t": [0.2, -0.3, 0.1, 0.0], "s": [0.0, 0.1, 0.0, 0.5, 0.2]}


def make_table(shared_mixtures: bool):
    design = draw_design(
        mix_domains=DOMS, sizes=(1e7, 3e7, 1e8, 1e9), runs_per_size=50, checkpoints=(0.25, 0.5, 1.0, 1.5, 2.0), seed=0, shared_mixtures=shared_mixtures
    )
    truth = LawFit("camel", "valid", DOMS, TRUTH, 0, {"n_ref": 1e8, "d_ref": 2e9})
    return synthetic_table(lambda v, n, d, m: truth.predict(n, d, m) * (1 + 0.05 * v), design, DOMS, domains=VALID, noise=0.005)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--laws", default=",".join(LAWS))
    ap.add_argument("--bootstrap", type=int, default=100)
    ap.add_argument("--starts", type=int, default=64)
    ap.add_argument("--out", default="results/law_fit.json")
    args = ap.parse_args(argv)
    rows = []
    for law in args.laws.split(","):
        table = make_table(shared_mixtures=law == "mixing_law")
        load0 = os.getloadavg()[0]
        t0, c0 = time.perf_counter(), time.process_time()
        fit = fit_table(table, law, bootstrap=args.bootstrap, starts=args.starts, seed=0, progress=False)
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
        rows.append(
            {
                "law": law,
                "rows": len(table),
                "mix_domains": len(table.mix_domains),
                "loss_domains": len(table.loss_domains),
                "starts": args.starts,
                "bootstrap": args.bootstrap,
                "seconds": round(seconds, 2),
                "cpu_seconds": round(cpu, 2),
                "phase_seconds": {k: round(v, 2) for k, v in fit.info["phase_seconds"].items()},
                "objective_per_domain": {d: fit.point[d].info.get("objective") for d in VALID},
                "num_params_per_domain": fit.point[VALID[0]].num_params,
                "load_avg_1min_before": round(load0, 2),
                "load_avg_1min_after": round(os.getloadavg()[0], 2),
            }
        )
        print(f"{law:14s} {seconds:8.1f} s  cpu {cpu:8.1f} s  phases {rows[-1]['phase_seconds']}  (params/domain {rows[-1]['num_params_per_domain']}, load {load0:.1f} -> {os.getloadavg()[0]:.1f})", flush=True)
        result = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform()}, "results": rows}
        out = Path(args.out)
        write_json(out, result, announce=False)  # after every law, so a cut-short run keeps its numbers
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
