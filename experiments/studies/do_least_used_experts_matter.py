"""Expert pruning: how much do the least-used experts matter?

    python -m experiments.studies.do_least_used_experts_matter --workdir runs/tiny_moe [--step N]
        [--fractions 0 0.125 0.25 0.5] [--max-items 50] [--tasks code prose math knowledge]

1. Expert usage per MoE layer is measured on the run's held-out batches (the fraction of top-k
   assignments each expert receives, routed as in training).
2. For each fraction f, the round(f * E) least-used experts of every layer are masked out of the
   router's top-k (a very negative selection bias, :mod:`moejax.eval.masking`: the router picks
   its k experts among the others; nothing in the model code changes and the weights stay), and
   held-out loss and benchmarks are evaluated again (:mod:`moejax.eval.evaluate`).

Writes ``DIR/eval/prune.json`` (per fraction: the masked experts, the load they still get (0 by
construction), held-out loss and bits per byte, every task's score) and ``DIR/eval/prune.png``
(change in held-out loss and benchmark scores vs fraction pruned), and prints a table.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from absl import logging as absl_logging  # noqa: E402

from moejax.eval.evaluate import Evaluator, benchmark_score, make_settings, mean_score  # noqa: E402
from moejax.eval.masking import least_used, mask_state, masked_balancer  # noqa: E402
from moejax.eval.restore import open_run  # noqa: E402
from moejax.log import add_verbosity_flags, setup_logging  # noqa: E402
from moejax.model.balancing import RoutingSetup  # noqa: E402

DEFAULT_FRACTIONS = (0.0, 0.125, 0.25, 0.5)


def prune_study(workdir: str, step: int | None, fractions, *, max_items: int, tasks=None, progress=True) -> dict:
    """Usage, then one evaluation per fraction with the least-used experts masked."""
    erun = open_run(workdir)
    ckpt = erun.load(step)
    settings = make_settings(erun, tasks=tasks, max_items=max_items)
    moe = erun.cfg.model.moe
    evaluator = Evaluator(
        erun, settings, balancer=masked_balancer(erun.run.balancer, RoutingSetup.from_config(erun.cfg)),
        progress=progress,
    )
    nothing_masked_le = np.zeros((len(evaluator.moe_layers), moe.num_experts), bool)
    baseline = evaluator.evaluate(
        dataclasses.replace(ckpt, balance=mask_state(ckpt.balance, nothing_masked_le, moe.experts_per_token))
    )
    load_le = np.array([layer["load"] for layer in baseline["routing"]["layers"]])
    rows = []
    for fraction in fractions:
        count = int(round(fraction * moe.num_experts))
        masked_le = least_used(load_le, count)
        result = baseline if count == 0 else evaluator.evaluate(
            dataclasses.replace(ckpt, balance=mask_state(ckpt.balance, masked_le, moe.experts_per_token))
        )
        result_load_le = np.array([layer["load"] for layer in result["routing"]["layers"]])
        rows.append({
            "fraction": fraction, "experts_masked_per_layer": count,
            "masked": [np.flatnonzero(m).tolist() for m in masked_le],
            "load_on_masked": float(result_load_le[masked_le].sum()),
            "loss_mean": result["losses"]["loss_mean"], "bits_per_byte_mean": result["losses"]["bits_per_byte_mean"],
            "loss": {d: v["loss"] for d, v in result["losses"]["domains"].items()},
            "benchmarks": {name: benchmark_score(b) for name, b in result["benchmarks"].items()},
            "benchmark_mean": mean_score(result["benchmarks"]),
        })
    return {"workdir": erun.workdir, "step": ckpt.step, "settings": dataclasses.asdict(settings),
            "usage": load_le.tolist(), "moe_layers": evaluator.moe_layers, "results": rows}


def table(study: dict) -> str:
    base = study["results"][0]
    tasks = list(base["benchmarks"])
    header = ["pruned", "masked/layer", "loss", "d loss", "bits/byte", "bench mean", "d bench", *tasks]
    lines = [header]
    for r in study["results"]:
        lines.append([
            f"{100 * r['fraction']:.1f}%", str(r["experts_masked_per_layer"]), f"{r['loss_mean']:.4f}",
            f"{r['loss_mean'] - base['loss_mean']:+.4f}", f"{r['bits_per_byte_mean']:.4f}",
            f"{r['benchmark_mean']:.3f}", f"{r['benchmark_mean'] - base['benchmark_mean']:+.3f}",
            *(f"{r['benchmarks'][t]:.3f}" for t in tasks),
        ])
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(line, widths)) for line in lines)


def plot(study: dict, path: str) -> None:
    rows = study["results"]
    x = [100 * r["fraction"] for r in rows]
    base = rows[0]
    fig, (ax_loss, ax_bench) = plt.subplots(1, 2, figsize=(11, 4))
    for domain in base["loss"]:
        ax_loss.plot(x, [r["loss"][domain] - base["loss"][domain] for r in rows], "o-", label=domain)
    ax_loss.plot(x, [r["loss_mean"] - base["loss_mean"] for r in rows], "k^-", label="mean")
    for task in base["benchmarks"]:
        ax_bench.plot(x, [r["benchmarks"][task] for r in rows], "o-", label=task)
    ax_bench.plot(x, [r["benchmark_mean"] for r in rows], "k^-", label="mean")
    ax_loss.set_ylabel("change in held-out loss (nats/token)")
    ax_bench.set_ylabel("accuracy / exact match")
    for ax in (ax_loss, ax_bench):
        ax.set_xlabel("experts pruned per layer (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"least-used experts masked: {study['workdir']} step {study['step']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--step", type=int, default=None)
    parser.add_argument("--fractions", type=float, nargs="+", default=list(DEFAULT_FRACTIONS))
    parser.add_argument("--max-items", type=int, default=50, help="items per task (0: all)")
    parser.add_argument("--tasks", nargs="*", default=None)
    parser.add_argument("--no-progress", action="store_true")
    add_verbosity_flags(parser)
    args = parser.parse_args()
    setup_logging(args.verbosity)
    fractions = args.fractions
    if sorted(fractions) != fractions or fractions[0] != 0 or not all(0 <= f < 1 for f in fractions):
        parser.error("--fractions must be increasing, in [0, 1), and start at 0 (the unpruned baseline)")
    absl_logging.set_verbosity(absl_logging.ERROR)
    study = prune_study(args.workdir, args.step, args.fractions, max_items=args.max_items, tasks=args.tasks,
                        progress=not args.no_progress)
    out_dir = os.path.join(study["workdir"], "eval")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "prune.json"), "w") as f:
        json.dump(study, f, indent=1)
    plot(study, os.path.join(out_dir, "prune.png"))
    print(table(study))
    print(f"\nwrote {out_dir}/prune.json and {out_dir}/prune.png")


if __name__ == "__main__":
    main()
