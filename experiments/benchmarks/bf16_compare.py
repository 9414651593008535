"""``train.compute_dtype = bfloat16`` against float32 on CPU: the step's tokens/s and the default
job's loss curve.

    ./launch.sh python -m experiments.benchmarks.bf16_compare [--steps 400] [--rounds 7]
        [--out results/bf16_compare.json]
    ./launch.sh python -m experiments.benchmarks.bf16_compare --smoke     # tiny, few steps: checks the tool

Two parts:

- **step**: the default job's train step (``experiments/configs/tiny_moe.py``) built once per
  compute dtype in this process, timed in interleaved rounds on the same random batch; tokens/s
  median and spread ((max - min) / median) per dtype, their ratio, and the matmul peak (jitted
  1024 x 1024) in float32 and bfloat16 measured in the same process.
- **curve**: the default job itself (``python -m moejax.main`` with the tiny config, same seed),
  ``--steps`` steps once per dtype, one after the other, each in its own process and workdir; the
  training loss at every logged step and the held-out loss (``eval_loss``) at every evaluation,
  read from each run's ``metrics.jsonl``; reported: the final held-out losses and their difference
  (bfloat16 - float32).

Only the compute dtype changes: parameters and optimizer moments stay float32
(``train.param_dtype``), the router computes in float32 whatever the compute dtype
(``moejax/model/router.py``). ``--smoke``: a 1-layer model, 6 steps, 1 round.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

DTYPES = ("float32", "bfloat16")
SMOKE_OVERRIDES = {"model.num_layers": 1, "model.d_model": 32, "model.num_heads": 2, "model.num_kv_heads": 2,
                   "model.head_dim": 16, "model.moe.expert_dim": 32, "model.mlp_dim": 64,
                   "train.global_batch_size": 2, "train.seq_len": 32, "train.log_every": 2,
                   "train.eval_every": 3, "train.eval_batches": 1}
CONFIG = "experiments/configs/tiny_moe.py"


def _config(dtype: str, smoke: bool):
    from moejax.config import load

    return load(CONFIG, {"train.compute_dtype": dtype, **(SMOKE_OVERRIDES if smoke else {})})[0]


def step_part(smoke: bool, rounds: int) -> dict:
    """Tokens/s of the default job's step per compute dtype, interleaved, and the matmul peaks."""
    import jax.numpy as jnp

    from experiments.benchmarks.cpu_matmul_paths import _step_workload
    from experiments.benchmarks.expert_scaling import timed
    from experiments.benchmarks.timing import matmul_peak_flops

    built = {dtype: _step_workload(_config(dtype, smoke), 1) for dtype in DTYPES}
    samples = timed({dtype: b[0] for dtype, b in built.items()}, rounds, warmup=1)
    out: dict = {"peak_gflops": {"float32": matmul_peak_flops(dtype=jnp.float32) / 1e9,
                                 "bfloat16": matmul_peak_flops(dtype=jnp.bfloat16) / 1e9}}
    for dtype, s in samples.items():
        med = statistics.median(s)
        out[dtype] = {"tokens_per_sec": built[dtype][1] / med, "median_s": med, "spread": (max(s) - min(s)) / med,
                      "samples_s": s, "kernels": built[dtype][3]}
    out["bf16_speedup"] = out["float32"]["median_s"] / out["bfloat16"]["median_s"]
    return out


def read_curve(workdir: str) -> dict:
    """``{"loss": [[step, loss], ...], "eval_loss": [[step, loss], ...]}`` from a run's metrics.jsonl."""
    from moejax.train.metrics import metric_records

    if not os.path.isfile(os.path.join(workdir, "metrics.jsonl")):
        raise FileNotFoundError(f"{workdir}/metrics.jsonl: the run wrote no metrics (its output is above)")
    curve: dict[str, list] = {"loss": [], "eval_loss": []}
    for record in metric_records(workdir):
        for key in curve:
            if isinstance(record.get(key), (int, float)):
                curve[key].append([int(record["step"]), float(record[key])])
    return curve


def compare_curves(curves: dict[str, dict]) -> dict:
    """Final held-out loss per dtype, their difference, and the largest training-loss gap."""
    f32, bf16 = curves["float32"], curves["bfloat16"]
    if not f32["eval_loss"] or not bf16["eval_loss"]:
        raise ValueError("a run logged no eval_loss: nothing to compare (set train.eval_every)")
    train_f32 = dict(map(tuple, f32["loss"]))
    gaps = [abs(loss - train_f32[step]) for step, loss in bf16["loss"] if step in train_f32]
    return {"final_eval_loss": {"float32": f32["eval_loss"][-1][1], "bfloat16": bf16["eval_loss"][-1][1]},
            "final_eval_step": f32["eval_loss"][-1][0],
            "final_eval_loss_diff_bf16_minus_f32": bf16["eval_loss"][-1][1] - f32["eval_loss"][-1][1],
            "max_train_loss_gap": max(gaps) if gaps else None}


def curve_part(steps: int, smoke: bool, workdir_root: str) -> dict:
    """The default job once per dtype (own process each), then :func:`compare_curves`."""
    overrides = {"train.steps": steps, **(SMOKE_OVERRIDES if smoke else {})}
    curves = {}
    for dtype in DTYPES:
        workdir = os.path.join(workdir_root, dtype)
        cmd = [sys.executable, "-m", "moejax.main", "--config", CONFIG, "--workdir", workdir, "-q",
               f"--config.train.compute_dtype={dtype}"] + [f"--config.{k}={v}" for k, v in overrides.items()]
        print(" ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)
        curves[dtype] = read_curve(workdir)
    return {"steps": steps, "curves": curves, **compare_curves(curves)}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=400, help="steps of the default job per dtype (its own default)")
    p.add_argument("--rounds", type=int, default=7, help="interleaved rounds of the step timing")
    p.add_argument("--parts", default="step,curve", help="comma-separated: step, curve")
    p.add_argument("--workdir", default="", help="where the two runs go (default: a temporary directory)")
    p.add_argument("--smoke", action="store_true", help="tiny model, 6 steps, 1 round: checks the tool")
    p.add_argument("--out", default="results/bf16_compare.json")
    args = p.parse_args(argv)
    parts = args.parts.split(",")
    if any(part not in ("step", "curve") for part in parts):
        p.error(f"--parts: {args.parts!r}: allowed are step, curve (comma-separated)")
    steps, rounds = (6, 1) if args.smoke else (args.steps, args.rounds)
    if steps < 1 or rounds < 1:
        p.error("--steps and --rounds must be at least 1")

    from experiments.benchmarks.timing import host, host_line, write_json

    before = host()
    print(f"host: {host_line(before)}", flush=True)
    result: dict = {"smoke": args.smoke, "host_before": before}
    if "step" in parts:
        s = result["step"] = step_part(args.smoke, rounds)
        print(f"matmul peak float32 {s['peak_gflops']['float32']:.0f}, bfloat16 {s['peak_gflops']['bfloat16']:.0f} "
              "GFLOP/s")
        for dtype in DTYPES:
            print(f"step {dtype:9s} {s[dtype]['tokens_per_sec']:9.0f} tokens/s (spread {s[dtype]['spread']:.0%})")
        print(f"bfloat16 / float32 tokens/s: {s['bf16_speedup']:.2f}")
    if "curve" in parts:
        with tempfile.TemporaryDirectory() as tmp:
            c = result["curve"] = curve_part(steps, args.smoke, args.workdir or tmp)
        print(f"final held-out loss at step {c['final_eval_step']}: float32 {c['final_eval_loss']['float32']:.4f}, "
              f"bfloat16 {c['final_eval_loss']['bfloat16']:.4f}, "
              f"difference {c['final_eval_loss_diff_bf16_minus_f32']:+.4f}; "
              f"largest training-loss gap {c['max_train_loss_gap']}")
    write_json(args.out, {**result, "host": host()})


if __name__ == "__main__":
    main()
