"""MFU of the train step on one GPU (sized for an 80 GB H100): dense and MoE at 8, 64 and 128 experts,
each MoE with ``ragged_dot`` and with tokamax, in bfloat16.

    ./launch.sh gpu-check                                      # builds the GPU environment, runs this and more
    .venv-gpu/bin/python -m experiments.benchmarks.gpu_mfu [--steps 20] [--peak-tflops 989] \\
        [--experts 8,64,128] [--grouped-matmul ragged,tokamax] [--no-dense]
    .venv/bin/python -m experiments.benchmarks.gpu_mfu --smoke   # the same code path, tiny, on CPU

The models: d_model 1024, 16 layers (MoE every layer), 16 query / 8 key-value heads of 64,
vocabulary 32768, untied embeddings, one shared expert of width 1024, and routed experts of 2048
active units per token at every count: 8 experts of width 1024 top-2, 64 of width 256 top-8, 128
of width 256 top-8 (the fine-grained shapes of DeepSeek and Qwen3-MoE); ``dense`` is the same
model with a SwiGLU of width 3072 (the MoE's active width: equal active FLOPs). Batch 32 x 2048
tokens, bfloat16 compute and float32 parameters, scanned layers, dropless dispatch, AdamW. Random
tokens (a throughput measurement, not a training run). One device: ``grouped_matmul="tokamax"``
serves on one device only (docs/performance.md).

Reports per variant, after compilation: median step time over ``--steps`` steps, tokens/s, model
FLOP/s (6 x active matmul parameters + attention, :func:`moejax.model.transformer.flops_per_token`)
and MFU against ``--peak-tflops`` (989 = H100/H200 dense bfloat16). Before running a variant it
checks the compiled step's memory (``memory_analysis``) against the device and records a variant
that does not fit instead of running it. A variant that fails (e.g. a kernel that does not
compile) is recorded with its error and the others still run. Writes JSON.
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
from moejax.model.grouped_matmul import tokamax_installed
from moejax.model.transformer import flops_per_token, param_counts
from moejax.train.state import init_state, setup
from moejax.train.step import make_train_step

# experts -> (top-k, expert width): 2048 active routed units per token at every count.
SHAPES = {8: (2, 1024), 16: (4, 512), 32: (4, 512), 64: (8, 256), 128: (8, 256)}


def gpu_config(experts: int | None = 32, impl: str = "auto", smoke: bool = False):
    """The benchmark model: MoE with ``experts`` routed experts (dropless, ``impl``), or dense (None)."""
    c = default_config()
    t, m = c.train, c.model
    t.global_batch_size, t.seq_len, t.steps = 32, 2048, 1000
    t.compute_dtype, t.param_dtype, t.scan_layers, t.remat = "bfloat16", "float32", True, "none"
    c.optim.lr, c.optim.warmup_steps = 3e-4, 100
    m.vocab_size, m.d_model, m.num_layers = 32768, 1024, 16
    m.num_heads, m.num_kv_heads, m.head_dim = 16, 8, 64
    m.tie_embeddings = False
    moe = m.moe
    top_k, width = SHAPES.get(experts or 32, (8, 256))
    moe.num_experts, moe.experts_per_token, moe.expert_dim = experts or 32, top_k, width
    moe.num_shared_experts, moe.shared_expert_dim = 1, 1024
    moe.backend, moe.grouped_matmul = "dropless", impl
    m.mlp_dim = top_k * width + 1024  # the dense model: the MoE's active width
    if experts is None:
        m.first_k_dense = m.num_layers
    if smoke:  # the same code path at CPU size
        t.global_batch_size, t.seq_len, t.compute_dtype = 2, 64, "float32"
        m.vocab_size, m.d_model, m.num_layers, m.num_heads, m.num_kv_heads, m.head_dim = 256, 64, 2, 2, 1, 32
        moe.expert_dim, moe.shared_expert_dim = 32, 64
        m.mlp_dim = top_k * 32 + 64
        if experts is None:
            m.first_k_dense = m.num_layers
    return c


def variants(experts: list[int], impls: list[str], dense: bool, smoke: bool) -> dict:
    """name -> config: ``dense`` first, then every expert count with every grouped matmul."""
    out = {"dense": gpu_config(None, smoke=smoke)} if dense else {}
    for e in experts:
        for impl in impls:
            out[f"{e}e {impl}"] = gpu_config(e, impl, smoke)
    return out


def measure(cfg, steps: int, peak_tflops: float) -> dict:
    """Compile and time one variant's train step on the first device; its row."""
    mesh = sharding.make_mesh(checks.validate(cfg, 1), jax.devices()[:1])
    run = setup(cfg, mesh)
    step = make_train_step(cfg, run)
    batch = random_batch(cfg)
    t = cfg.train
    counts = param_counts(cfg.model)
    row = {"experts": cfg.model.moe.num_experts if cfg.model.first_k_dense < cfg.model.num_layers else 0,
           "grouped_matmul": cfg.model.moe.grouped_matmul, "params_total": counts["total"],
           "params_active": counts["active"]}
    with jax.set_mesh(mesh):
        start = time.perf_counter()
        compiled = step.lower(run.abstract_state, batch).compile()
        row["compile_s"] = time.perf_counter() - start
        peak_bytes = _peak_bytes(compiled.memory_analysis())
        limit = (jax.devices()[0].memory_stats() or {}).get("bytes_limit")
        row["peak_memory_gib"] = peak_bytes / 2**30
        if limit and peak_bytes > limit:
            return {**row, "error": f"does not fit: {peak_bytes / 2**30:.1f} GiB of {limit / 2**30:.1f} GiB"}
        state = init_state(cfg, run)
        state, metrics = step(state, batch)
        jax.block_until_ready(metrics)
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            state, metrics = step(state, batch)
            jax.block_until_ready(metrics)
            times.append(time.perf_counter() - start)
    step_s = float(np.median(times))
    tokens_per_sec = t.global_batch_size * t.seq_len / step_s
    model_flops = flops_per_token(cfg.model, t.seq_len) * tokens_per_sec
    return {**row, "step_time_s": step_s, "tokens_per_sec": tokens_per_sec, "model_flops_per_sec": model_flops,
            "mfu": model_flops / (peak_tflops * 1e12), "loss": float(metrics["loss"])}


def format_rows(rows: dict[str, dict]) -> str:
    lines = [f"{'variant':16s} {'params':>14s} {'step ms':>9s} {'tokens/s':>11s} {'TFLOP/s':>8s} {'MFU':>6s}"]
    for name, r in rows.items():
        params = f"{r.get('params_total', 0) / 1e9:.2f}B/{r.get('params_active', 0) / 1e9:.2f}B"
        if "error" in r:
            lines.append(f"{name:16s} {params:>14s} {r['error']}")
        else:
            lines.append(f"{name:16s} {params:>14s} {r['step_time_s'] * 1e3:9.1f} {r['tokens_per_sec']:11,.0f} "
                         f"{r['model_flops_per_sec'] / 1e12:8.1f} {r['mfu']:6.1%}")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--peak-tflops", type=float, default=989.0, help="the device's dense bf16 peak")
    parser.add_argument("--experts", default="8,64,128", help="comma-separated routed expert counts")
    parser.add_argument("--grouped-matmul", default="ragged,tokamax",
                        help="comma-separated model.moe.grouped_matmul values (tokamax: left out when not installed)")
    parser.add_argument("--no-dense", action="store_true", help="leave out the dense model")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, float32: check the script on CPU")
    parser.add_argument("--out", default="results/gpu_mfu.json")
    args = parser.parse_args(argv)
    if jax.default_backend() == "cpu" and not args.smoke:
        raise SystemExit("gpu_mfu: no GPU found (jax.default_backend() is 'cpu'); run it with a CUDA build "
                         "of jax (./launch.sh gpu-check makes one), or pass --smoke to check the script on CPU.")
    impls = [i for i in args.grouped_matmul.split(",") if i != "tokamax" or tokamax_installed()]
    skipped = sorted(set(args.grouped_matmul.split(",")) - set(impls))
    rows: dict[str, dict] = {}
    for name, cfg in variants([int(e) for e in args.experts.split(",")], impls, not args.no_dense, args.smoke).items():
        try:
            rows[name] = measure(cfg, args.steps, args.peak_tflops)
        except Exception as e:  # noqa: BLE001 - one failing variant must not lose the others' numbers
            rows[name] = {"error": f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"}
        print(format_rows({name: rows[name]}).splitlines()[1], flush=True)
    print(f"{jax.devices()[0].device_kind}, batch {cfg.train.global_batch_size}x{cfg.train.seq_len}, "
          f"median of {args.steps} steps, MFU of {args.peak_tflops:.0f} TFLOP/s"
          + (f"; not installed: {', '.join(skipped)}" if skipped else ""))
    print(format_rows(rows))
    write_json(args.out, {
        "rows": rows, "peak_tflops": args.peak_tflops, "steps": args.steps, "skipped": skipped,
        "device_kind": jax.devices()[0].device_kind, "smoke": args.smoke, "machine": machine(),
    })
    failed = [n for n, r in rows.items() if "error" in r and not r["error"].startswith("does not fit")]
    if failed:
        raise SystemExit(f"gpu_mfu: error: {', '.join(failed)} failed (their errors are in {args.out})")


if __name__ == "__main__":
    main()
