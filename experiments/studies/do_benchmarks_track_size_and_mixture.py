"""Calibrate the built-in benchmarks on trained checkpoints: score vs model size and mixture.

    python -m experiments.studies.do_benchmarks_track_size_and_mixture --workdirs runs/mixture_ladder/s0_m0 ... \\
        --steps 140 --max-items 64 --out experiments/studies/results/bench_v2

For every (workdir, step) it scores the tasks of ``--versions`` (default benchmarks-v2, add
benchmarks-v1 to compare) with the same :class:`moejax.eval.evaluate.Evaluator` as
``python -m moejax.eval`` (held-out losses included), reading the checkpoints only: results go
to ``OUT/calibration.json`` (one record per checkpoint, written after each, reused on a rerun
with the same settings), never into the workdirs. Then it writes ``OUT/calibration_mix.png`` and
``OUT/calibration_loss.png``: one panel per task, accuracy against the training weight (or the
held-out loss) of the task's domain, one colour per model size and step, and prints a markdown
table. Standard error of one accuracy:
``sqrt(p (1 - p) / max_items)``, at most 0.5 / sqrt(max_items) (0.0625 at 64 items).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
from absl import logging as absl_logging

from moejax.eval.benchmarks import VERSIONS, task_names
from moejax.eval.evaluate import Evaluator, benchmark_score, make_settings
from moejax.eval.restore import open_run
from moejax.model.transformer import param_counts

# The corpus domain whose mixture weight a task is plotted against (v2: its prefix; v1: its name).
_DOMAIN = {"code": "code", "prose": "prose", "math": "math", "know": "knowledge", "knowledge": "knowledge"}


def task_domain(task: str) -> str:
    return _DOMAIN[task.split("_")[0]]


def evaluate(workdirs: list[str], steps: list[int] | None, tasks: list[str], max_items: int, loss_batches: int,
             out_path: str) -> list[dict]:
    """One record per (workdir, step): run name, sizes, mixture, losses and task scores."""
    records = []
    if os.path.isfile(out_path):
        with open(out_path) as f:
            records = json.load(f)["records"]
    done = {(r["workdir"], r["step"]): r for r in records if r["tasks"] == tasks and r["max_items"] == max_items}
    records = list(done.values())
    for workdir in workdirs:
        erun = open_run(workdir)
        wanted = [s for s in erun.steps if steps is None or s in steps]
        todo = [s for s in wanted if (os.path.abspath(workdir), s) not in done]
        if not todo:
            continue
        settings = make_settings(erun, tasks=tasks, max_items=max_items, loss_batches=loss_batches)
        evaluator = Evaluator(erun, settings, progress=False)
        counts = param_counts(erun.cfg.model)
        mixture = dict(erun.cfg.data.mixture)
        total = sum(mixture.values())
        for step in todo:
            start = time.perf_counter()
            result = evaluator.evaluate(erun.load(step))
            records.append({
                "run": os.path.basename(os.path.normpath(workdir)), "workdir": os.path.abspath(workdir), "step": step,
                "params_active": counts["active"], "params_total": counts["total"],
                "tokens": step * erun.cfg.train.global_batch_size * erun.cfg.train.seq_len,
                "mixture": {d: w / total for d, w in mixture.items()},
                "loss": {d: v["loss"] for d, v in result["losses"]["domains"].items()},
                "scores": {t: benchmark_score(b) for t, b in result["benchmarks"].items()},
                "tasks": tasks, "max_items": max_items, "eval_seconds": result["eval_seconds"],
            })
            _save(out_path, records)
            print(f"{records[-1]['run']} step {step}: {time.perf_counter() - start:.0f}s "
                  + " ".join(f"{t}={s:.2f}" for t, s in records[-1]["scores"].items()), flush=True)
    return records


def _save(path: str, records: list[dict]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"records": records}, f, indent=1)
    os.replace(tmp, path)


def plot(records: list[dict], tasks: list[str], path: str, x_axis: str = "mix") -> str:
    """One panel per task: accuracy against the training weight (``x_axis="mix"``) or the held-out
    loss (``"loss"``) of the task's domain, one line per (size, step)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted({(r["params_active"], r["step"]) for r in records})
    colors = plt.cm.viridis(np.linspace(0, 0.9, len(sizes)))
    cols = 4
    rows = -(-len(tasks) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.6 * rows), squeeze=False, sharey=True)
    for ax, task in zip(axes.flat, tasks):
        domain = task_domain(task)
        for color, (active, step) in zip(colors, sizes):
            def x_of(r: dict) -> float:
                return r["mixture"].get(domain, 0.0) if x_axis == "mix" else r["loss"][domain]

            rs = sorted((r for r in records if (r["params_active"], r["step"]) == (active, step)), key=x_of)
            x = [x_of(r) for r in rs]
            y = [r["scores"][task] for r in rs]
            ax.plot(x, y, "o", color=color, ms=4, alpha=0.85,
                    label=f"{active / 1e3:.0f}k act., {step} steps")
        ax.axhline(0.25, color="grey", lw=0.6, ls=":")
        ax.set_title(task, fontsize=9)
        ax.set_xlabel(f"mix:{domain}" if x_axis == "mix" else f"held-out loss:{domain} (nats/byte)", fontsize=8)
        ax.set_ylim(0, 1.02)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(tasks):]:
        ax.axis("off")
    axes[0][0].set_ylabel("accuracy")
    axes[0][0].legend(fontsize=6, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def table(records: list[dict], tasks: list[str]) -> str:
    """Markdown: one row per checkpoint (sorted by size, step, run), one column per task."""
    head = "| run | active | step | mix c/p/m/k | " + " | ".join(tasks) + " |"
    lines = [head, "|" + "---|" * (4 + len(tasks))]
    for r in sorted(records, key=lambda r: (r["params_active"], r["step"], r["run"])):
        mix = "/".join(f"{r['mixture'].get(d, 0):.2f}" for d in ("code", "prose", "math", "knowledge"))
        lines.append(f"| {r['run']} | {r['params_active'] / 1e3:.0f}k | {r['step']} | {mix} | "
                     + " | ".join(f"{r['scores'][t]:.2f}" for t in tasks) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m experiments.studies.do_benchmarks_track_size_and_mixture",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--workdirs", nargs="+", default=[], help="training run directories (read only)")
    p.add_argument("--steps", type=int, nargs="*", default=None, help="checkpoint steps (default: all)")
    p.add_argument("--versions", nargs="+", default=[VERSIONS[-1]], choices=VERSIONS)
    p.add_argument("--max-items", type=int, default=64, help="items per task")
    p.add_argument("--loss-batches", type=int, default=1, help="held-out batches per domain")
    p.add_argument("--out", required=True, help="output directory (calibration.json, calibration.png)")
    p.add_argument("--plot-only", action="store_true", help="replot and retabulate OUT/calibration.json")
    args = p.parse_args(argv)
    absl_logging.set_verbosity(absl_logging.ERROR)
    os.makedirs(args.out, exist_ok=True)
    out_json = os.path.join(args.out, "calibration.json")
    tasks = [t for v in args.versions for t in task_names(v)]
    if not args.plot_only and not args.workdirs:
        p.error("--workdirs is required unless --plot-only")
    if args.plot_only:
        with open(out_json) as f:
            records = [r for r in json.load(f)["records"] if set(tasks) <= set(r["scores"])]
    else:
        records = evaluate(args.workdirs, args.steps, tasks, args.max_items, args.loss_batches, out_json)
    for x_axis in ("mix", "loss"):
        print(f"wrote {plot(records, tasks, os.path.join(args.out, f'calibration_{x_axis}.png'), x_axis)}")
    print(table(records, tasks))


if __name__ == "__main__":
    sys.exit(main())
