"""What balance buys downstream: the best setting of each balancing method from the front
(``experiments.studies.which_balancing_objective --front``), served with expert parallelism, and its benchmarks.

    python -m experiments.studies.what_balance_buys_downstream --out /path/to/balancing_out   # reads OUT/front
    python -m experiments.studies.what_balance_buys_downstream --out ... --max-vio 1.0 --factors 1.25,2.0

For each method of ``OUT/front/front.json``, the *best setting* is the strength with the lowest
held-out loss among those whose held-out global MaxVio is at most ``--max-vio`` (balanced
enough to serve; if none is, the most balanced one), plus ``none``, judged on seed 0 (the seed
every strength has: the other seeds were added to some settings only, and a mean over more
seeds is not comparable with one run). Every finished seed of that setting is then, on 8 fake
CPU devices (``jax_num_cpu_devices``):

- restored onto an ``expert = 8`` mesh with the ``expert_parallel`` backend at each
  ``ep_capacity_factor`` of ``--factors`` (each device keeps ``ceil(factor x q / 8)`` slots per
  destination, see docs/expert_parallel.md), routed exactly as in training (selection biases
  included), and run over the held-out batches (2 x 16 x 256 tokens per domain): the fraction of
  (token, choice) assignments dropped, and the held-out loss with those drops, against the
  dropless loss of the same checkpoint;
- evaluated with ``python -m moejax.eval`` (the run's default built-in benchmarks; written to
  the run's ``eval/step_N.json`` and reused when already there): the mean benchmark score and
  each task's.

Writes ``OUT/front/downstream.{md,json}``; the per-run numbers are cached in each run's
``downstream.json``, so a rerun only computes what is missing.
"""

from __future__ import annotations

import argparse
import json
import os

import jax

jax.config.update("jax_num_cpu_devices", 8)  # before any device is touched; CPU only

import numpy as np  # noqa: E402

from experiments.studies.which_balancing_objective import (  # noqa: E402
    FRONT_BATCH,
    front_config,
    front_objectives,
    front_summary,
    held_out,
)

DEVICES = 8


def best_settings(summary: list[dict], max_vio: float) -> list[dict]:
    """Per method, the lowest-loss strength with mean MaxVio <= max_vio (else the most balanced)."""
    best = []
    for method in dict.fromkeys(r["method"] for r in summary):
        rows = [r for r in summary if r["method"] == method]
        ok = [r for r in rows if r["max_vio_mean"] <= max_vio]
        best.append(min(ok, key=lambda r: r["loss_mean"]) if ok else min(rows, key=lambda r: r["max_vio_mean"]))
    return best


def ep_config(cfg, factor: float):
    c = cfg.copy_and_resolve_references()
    c.mesh.data, c.mesh.expert = 1, DEVICES
    c.model.moe.backend, c.model.moe.ep_capacity_factor = "expert_parallel", factor
    return c


def benchmarks(workdir: str, step: int) -> dict:
    from moejax.eval.__main__ import main as eval_main
    from moejax.eval.evaluate import benchmark_score, mean_score

    path = os.path.join(workdir, "eval", f"step_{step}.json")
    if not os.path.exists(path):
        eval_main(["--workdir", workdir, "--step", str(step), "--no-progress"])
    with open(path) as f:
        result = json.load(f)
    return {"mean": mean_score(result["benchmarks"]),
            "tasks": {name: benchmark_score(b) for name, b in result["benchmarks"].items()}}


def downstream(run: dict, steps: int, factors: list[float], workdir: str) -> dict:
    cache = os.path.join(workdir, "downstream.json")
    done = {}
    if os.path.exists(cache):
        with open(cache) as f:
            done = json.load(f)
    cfg = front_config(front_objectives(run["method"], run["strength"]), steps, FRONT_BATCH, run["seed"])
    if "dropless" not in done:
        done["dropless"] = held_out(cfg, workdir)
    for factor in factors:
        if f"ep{factor:g}" not in done:
            done[f"ep{factor:g}"] = held_out(ep_config(cfg, factor), workdir)
    if "benchmarks" not in done:
        done["benchmarks"] = benchmarks(workdir, steps)
    with open(cache, "w") as f:
        json.dump(done, f, indent=1)
    return done


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="results/balancing_study", help="the --out of which_balancing_objective --front")
    p.add_argument("--max-vio", type=float, default=1.0, help="best setting: lowest loss with mean MaxVio <= this")
    p.add_argument("--factors", default="1.25,2.0", help="ep_capacity_factor values, comma-separated")
    args = p.parse_args()
    front_dir = os.path.join(args.out, "front")
    path = os.path.join(front_dir, "front.json")
    if not os.path.exists(path):
        p.error(f"{path} not found: run python -m experiments.studies.which_balancing_objective --front "
                f"--out {args.out} first")
    try:
        factors = [float(x) for x in args.factors.split(",") if x]
    except ValueError:
        p.error(f"--factors: expected comma-separated numbers, got {args.factors!r}")
    bad = [f for f in factors if not 0 < f <= DEVICES]
    if bad or not factors:
        p.error(f"--factors: each must be in (0, {DEVICES}] (>= {DEVICES} is dropless), got {args.factors!r}")
    with open(path) as f:
        front = json.load(f)

    rows = []
    for best in best_settings(front_summary([r for r in front["runs"] if r["seed"] == 0]), args.max_vio):
        runs = [r for r in front["runs"] if r["method"] == best["method"]
                and (best["method"] == "none" or r["strength"] == best["strength"])]
        per_seed = []
        for run in runs:
            print(f"=== {run['run']}", flush=True)
            per_seed.append(downstream(run, front["steps"], factors, os.path.join(front_dir, "runs", run["run"])))
        row = {"method": best["method"], "strength": best["strength"], "swept": best["swept"],
               "seeds": [r["seed"] for r in runs], "loss_seed0": best["loss_mean"], "max_vio_seed0": best["max_vio_mean"],
               "max_vio": float(np.mean([r["held_out_max_vio"] for r in runs])),
               "dropless_loss": float(np.mean([d["dropless"]["loss"] for d in per_seed])),
               "bench_mean": float(np.mean([d["benchmarks"]["mean"] for d in per_seed])),
               "bench_tasks": {t: float(np.mean([d["benchmarks"]["tasks"][t] for d in per_seed]))
                               for t in per_seed[0]["benchmarks"]["tasks"]}}
        for factor in factors:
            key = f"ep{factor:g}"
            row[key] = {"drop_rate": float(np.mean([d[key]["drop_rate"] for d in per_seed])),
                        "drop_rate_max": float(np.max([d[key]["drop_rate"] for d in per_seed])),
                        "loss": float(np.mean([d[key]["loss"] for d in per_seed]))}
        rows.append(row)

    head = ["method", "strength", "seeds", "held-out loss", "held-out MaxVio"]
    head += [f"drop rate @ {f:g}" for f in factors] + [f"loss @ {f:g}" for f in factors] + ["bench mean"]
    lines = [f"Best setting per method (lowest loss with MaxVio <= {args.max_vio:g} on seed 0), served with "
             f"expert_parallel on {DEVICES} fake devices at ep_capacity_factor {', '.join(f'{f:g}' for f in factors)}; "
             "means over seeds (drop rate: fraction of (token, choice) assignments dropped on the held-out batches).",
             "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        strength = "" if r["method"] == "none" else f"{r['swept']}={r['strength']:g}"
        cells = [r["method"], strength, str(len(r["seeds"])), f"{r['dropless_loss']:.4f}", f"{r['max_vio']:.3f}"]
        cells += [f"{100 * r[f'ep{f:g}']['drop_rate']:.2f}%" for f in factors]
        cells += [f"{r[f'ep{f:g}']['loss']:.4f}" for f in factors] + [f"{r['bench_mean']:.3f}"]
        lines.append("| " + " | ".join(cells) + " |")
    with open(os.path.join(front_dir, "downstream.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(front_dir, "downstream.json"), "w") as f:
        json.dump({"max_vio": args.max_vio, "factors": factors, "devices": DEVICES, "rows": rows}, f, indent=1)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
