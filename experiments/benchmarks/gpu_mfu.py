"""MFU of the train step on one GPU (sized for an NVIDIA H200): a ~1B-total MoE in bfloat16.

    MOEJAX_PYTHON=.venv-gpu/bin/python   # a jax[cuda12]==0.10.2 environment (docs/accelerators.md)
    .venv-gpu/bin/python -m experiments.benchmarks.gpu_mfu [--steps 20] [--peak-tflops 989]
    .venv/bin/python -m experiments.benchmarks.gpu_mfu --smoke   # the same code path, tiny, on CPU

The model: d_model 1024, 16 layers (MoE every layer), 16 query / 8 key-value heads of 64, 32
routed experts top-4 of width 512 plus one shared expert of 1024, vocabulary 32768, untied
embeddings: 0.97B total and 0.27B active parameters (1.6 GFLOP per token trained). Batch 32 x 2048 tokens, bfloat16
compute and float32 parameters, scanned layers, dropless dispatch with ``jax.lax.ragged_dot``
(``grouped_matmul=auto`` picks it off CPU), AdamW. Random tokens (a throughput measurement,
not a training run).

Reports, after compilation: median step time over ``--steps`` steps, tokens/s, model FLOP/s
(6 x active matmul parameters + attention, :func:`moejax.model.transformer.flops_per_token`)
and MFU against ``--peak-tflops`` (989 = H100/H200 dense bfloat16). Before running it checks the
compiled step's memory (``memory_analysis``) against the device. Writes JSON. Runs in a few
minutes (compilation ~1 min, 20 steps of ~65k tokens).
"""

from __future__ import annotations

import argparse
import time

import jax
import numpy as np

from experiments.benchmarks.profile_step import random_batch
from experiments.benchmarks.step_time import _peak_bytes
from experiments.benchmarks.timing import machine, write_json
from moejax import checks, sharding
from moejax.config import default_config
from moejax.model.transformer import flops_per_token, param_counts
from moejax.train.state import init_state, setup
from moejax.train.step import make_train_step


def gpu_config(smoke: bool = False):
    c = default_config()
    t, m = c.train, c.model
    t.global_batch_size, t.seq_len, t.steps = 32, 2048, 1000
    t.compute_dtype, t.param_dtype, t.scan_layers, t.remat = "bfloat16", "float32", True, "none"
    c.optim.lr, c.optim.warmup_steps = 3e-4, 100
    m.vocab_size, m.d_model, m.num_layers = 32768, 1024, 16
    m.num_heads, m.num_kv_heads, m.head_dim = 16, 8, 64
    m.tie_embeddings = False
    moe = m.moe
    moe.num_experts, moe.experts_per_token, moe.expert_dim = 32, 4, 512
    moe.num_shared_experts, moe.shared_expert_dim = 1, 1024
    moe.backend, moe.grouped_matmul = "dropless", "auto"
    if smoke:  # the same code path at CPU size
        t.global_batch_size, t.seq_len, t.compute_dtype = 2, 64, "float32"
        m.vocab_size, m.d_model, m.num_layers, m.num_heads, m.num_kv_heads, m.head_dim = 256, 64, 2, 2, 1, 32
        moe.num_experts, moe.expert_dim, moe.shared_expert_dim = 8, 32, 64
    return c


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--peak-tflops", type=float, default=989.0, help="the device's dense bf16 peak")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, float32: check the script on CPU")
    parser.add_argument("--out", default="results/gpu_mfu.json")
    args = parser.parse_args()
    if jax.default_backend() == "cpu" and not args.smoke:
        raise SystemExit("gpu_mfu: no GPU found (jax.default_backend() is 'cpu'); run it with a CUDA build "
                         "of jax (docs/accelerators.md), or pass --smoke to check the script on CPU.")
    cfg = gpu_config(args.smoke)
    mesh = sharding.make_mesh(checks.validate(cfg, 1))
    run = setup(cfg, mesh)
    state = init_state(cfg, run)
    step = make_train_step(cfg, run)
    batch = random_batch(cfg)
    with jax.set_mesh(mesh):
        compiled = step.lower(state, batch).compile()
        peak_bytes = _peak_bytes(compiled.memory_analysis())
        stats = jax.devices()[0].memory_stats() or {}
        limit = stats.get("bytes_limit")
        print(f"compiled step needs {peak_bytes / 2**30:.1f} GiB"
              + (f" of {limit / 2**30:.1f} GiB on the device" if limit else ""))
        if limit and peak_bytes > limit:
            raise SystemExit("gpu_mfu: the step does not fit; lower --config sizes or set train.remat=full")
        start = time.perf_counter()
        state, metrics = step(state, batch)
        jax.block_until_ready(metrics)
        compile_s = time.perf_counter() - start
        times = []
        for _ in range(args.steps):
            start = time.perf_counter()
            state, metrics = step(state, batch)
            jax.block_until_ready(metrics)
            times.append(time.perf_counter() - start)
    t = cfg.train
    step_s = float(np.median(times))
    tokens_per_sec = t.global_batch_size * t.seq_len / step_s
    model_flops = flops_per_token(cfg.model, t.seq_len) * tokens_per_sec
    counts = param_counts(cfg.model)
    mfu = model_flops / (args.peak_tflops * 1e12)
    print(f"{counts['total'] / 1e9:.2f}B total / {counts['active'] / 1e9:.2f}B active params, batch "
          f"{t.global_batch_size}x{t.seq_len}, {jax.devices()[0].device_kind}")
    print(f"step {step_s * 1e3:.1f} ms  {tokens_per_sec:,.0f} tokens/s  {model_flops / 1e12:.1f} TFLOP/s  "
          f"MFU {mfu:.1%} of {args.peak_tflops:.0f} TFLOP/s  (compile + first step {compile_s:.1f} s, "
          f"loss {float(metrics['loss']):.3f})")
    write_json(args.out, {
        "params": counts, "step_time_s": step_s, "tokens_per_sec": tokens_per_sec, "model_flops_per_sec": model_flops,
        "mfu": mfu, "peak_tflops": args.peak_tflops, "compile_and_first_step_s": compile_s,
        "peak_memory_gib": peak_bytes / 2**30, "device_kind": jax.devices()[0].device_kind, "smoke": args.smoke,
        "machine": machine(),
    })


if __name__ == "__main__":
    main()
