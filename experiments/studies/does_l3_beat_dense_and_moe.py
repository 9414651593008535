"""L3 study: dense vs L3 vs iso-sparse MoE at the same active FLOPs and tokens, on the built-in corpus.

    python -m experiments.studies.does_l3_beat_dense_and_moe   # dense, l3, moe + the two L3 ablations
    python -m experiments.studies.does_l3_beat_dense_and_moe --runs dense,l3 --steps 100
    python -m experiments.studies.does_l3_beat_dense_and_moe --report-only   # rebuild the table from finished runs

Models (d_model 128, 4 layers, vocabulary 272, 16 x 256 tokens per step, same seed and data):

- ``l3``: a dense transformer (SwiGLU width 512) plus one Large Lookup Layer after layer 1 with
  a budget of 4,352 rows (16 per token on average), at most 64 rows per token, LZW allocation
  from 1M tokens of the training split (``python -m moejax.data.l3_alloc``), concat output;
- ``l3_uniform`` / ``l3_residual``: the same with the uniform allocation / the residual output;
- ``dense``: the dense transformer with its SwiGLU width raised until its training FLOPs per token
  (:func:`moejax.model.transformer.flops_per_token`, which counts the L3 layer's gathered rows)
  match ``l3``'s;
- ``moe``: every layer an MoE with top-2 routed experts, each half the width of ``dense``'s MLP
  (same active FLOPs) and as many experts as bring its total parameters closest to ``l3``'s
  (the same sparsity), global-batch balancing + z-loss.

Each run goes to ``OUT/runs/<name>`` (a finished run is not redone). The final checkpoint is
evaluated with ``python -m moejax.eval`` (held-out loss per domain on 4 x 16 x 256 tokens, the
built-in benchmarks on 64 items each); the table goes to ``OUT/table.md`` and ``OUT/table.json``
with the median training tokens/s (a shared CPU: compare within one table only).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import numpy as np

from moejax.config import default_config
from experiments.studies import EVAL_WINDOWS
from moejax.log import add_verbosity_flags, setup_logging
from moejax.model.transformer import flops_per_token, param_counts

RUNS = ("dense", "l3", "moe", "l3_uniform", "l3_residual")
BUDGET, MAX_ROWS, VOCAB = 4352, 64, 272


def base_config(steps: int):
    c = default_config()
    t = c.train
    t.steps, t.global_batch_size, t.seq_len = steps, 16, 256
    t.log_every, t.eval_every, t.eval_batches = 10, steps, 2
    t.eval_windows = EVAL_WINDOWS["train.eval_windows"]  # as the committed results were evaluated
    c.checkpoint.every_steps = steps
    c.optim.warmup_steps = max(steps // 10, 1)
    m = c.model
    m.vocab_size, m.num_layers, m.first_k_dense, m.mlp_dim = VOCAB, 4, 4, 512  # all dense
    return c


def l3_config(steps: int, allocation: str, output: str = "concat"):
    c = base_config(steps)
    l3 = c.model.l3
    l3.after_layers, l3.budget, l3.max_rows, l3.output, l3.allocation = (1,), BUDGET, MAX_ROWS, output, allocation
    return c


def dense_config(steps: int, target_flops: float):
    """The dense model whose SwiGLU width brings its FLOPs per token closest to ``target_flops``."""
    c = base_config(steps)
    widths = np.arange(512, 4096)
    gaps = []
    for width in widths:
        c.model.mlp_dim = int(width)
        gaps.append(abs(flops_per_token(c.model, c.train.seq_len) - target_flops))
    c.model.mlp_dim = int(widths[int(np.argmin(gaps))])
    return c


def moe_config(steps: int, dense_mlp_dim: int, target_params: int):
    """Top-2 MoE in every layer, experts half the dense width, expert count matching the params."""
    c = base_config(steps)
    m = c.model
    m.first_k_dense, m.moe.num_shared_experts = 0, 0
    m.moe.experts_per_token, m.moe.expert_dim = 2, dense_mlp_dim // 2
    m.moe.balancing = (("global_batch", {"weight": 1e-2}), ("z_loss", {"weight": 1e-3}))
    gaps = {}
    for experts in range(2, 257, 2):
        m.moe.num_experts = experts
        gaps[experts] = abs(param_counts(m)["total"] - target_params)
    m.moe.num_experts = min(gaps, key=gaps.get)
    return c


def make_allocation(out: str, method: str) -> str:
    path = os.path.join(out, f"allocation_{method}.json")
    if not os.path.isfile(path):
        subprocess.run(
            [sys.executable, "-m", "moejax.data.l3_alloc", "--budget", str(BUDGET), "--max-rows", str(MAX_ROWS),
             "--method", method, "--vocab-size", str(VOCAB), "--out", path],
            check=True,
        )
    return path


def configs(steps: int, out: str) -> dict:
    lzw = make_allocation(out, "lzw")
    cfgs = {
        "l3": l3_config(steps, lzw),
        "l3_uniform": l3_config(steps, make_allocation(out, "uniform")),
        "l3_residual": l3_config(steps, lzw, output="residual"),
    }
    target = flops_per_token(cfgs["l3"].model, cfgs["l3"].train.seq_len)
    cfgs["dense"] = dense_config(steps, target)
    cfgs["moe"] = moe_config(steps, cfgs["dense"].model.mlp_dim, param_counts(cfgs["l3"].model)["total"])
    return cfgs


def train_run(cfg, workdir: str) -> None:
    from moejax.train.loop import train

    if not os.path.isfile(os.path.join(workdir, "done")):
        train(cfg, workdir)
        open(os.path.join(workdir, "done"), "w").close()


def evaluate_run(workdir: str, step: int) -> dict:
    path = os.path.join(workdir, "eval", f"step_{step}.json")
    if not os.path.isfile(path):
        subprocess.run(
            [sys.executable, "-m", "moejax.eval", "--workdir", workdir, "--max-items", "64", "--no-progress"],
            check=True, stdout=subprocess.DEVNULL,
        )
    with open(path) as f:
        return json.load(f)


def row(name: str, cfg, workdir: str) -> dict:
    result = evaluate_run(workdir, cfg.train.steps)
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        speeds = [r["tokens_per_sec"] for r in map(json.loads, f) if "tokens_per_sec" in r]
    counts = param_counts(cfg.model)
    bench = result["benchmarks"]
    return {
        "run": name,
        "params_total": counts["total"],
        "params_active": counts["active"],
        "train_flops_per_token": flops_per_token(cfg.model, cfg.train.seq_len),
        "held_out_loss": result["losses"]["loss_mean"],
        **{f"loss/{d}": v["loss"] for d, v in result["losses"]["domains"].items()},
        **{f"bench/{d}": v.get("accuracy", v.get("exact_match")) for d, v in bench.items()},
        "tokens_per_sec": float(np.median(speeds[len(speeds) // 2:])),
    }


def write_table(rows: list[dict], out: str) -> str:
    keys = list(rows[0])
    fmt = lambda v: f"{v:,}" if isinstance(v, int) else (f"{v:.4g}" if isinstance(v, float) else str(v))
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(fmt(r[k]) for k in keys) + " |" for r in rows]
    table = "\n".join(lines)
    with open(os.path.join(out, "table.md"), "w") as f:
        f.write(table + "\n")
    with open(os.path.join(out, "table.json"), "w") as f:
        json.dump(rows, f, indent=2)
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", default=",".join(RUNS), help=f"comma-separated subset of {','.join(RUNS)}")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--out", default="results/l3_study")
    parser.add_argument("--report-only", action="store_true", help="only rebuild the table from finished runs")
    add_verbosity_flags(parser)
    args = parser.parse_args()
    setup_logging(args.verbosity)
    names = [n for n in args.runs.split(",") if n]
    unknown = sorted(set(names) - set(RUNS))
    if unknown:
        parser.error(f"unknown runs {unknown}; choose from {', '.join(RUNS)}")
    os.makedirs(args.out, exist_ok=True)
    cfgs = configs(args.steps, args.out)
    rows = []
    for name in names:
        workdir = os.path.join(args.out, "runs", name)
        if not args.report_only:
            train_run(cfgs[name], workdir)
        if os.path.isfile(os.path.join(workdir, "done")):
            rows.append(row(name, cfgs[name], workdir))
    if rows:
        print(write_table(rows, args.out))


if __name__ == "__main__":
    main()
