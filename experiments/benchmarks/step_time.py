"""Train-step throughput: tokens/s, achieved FLOP/s as a fraction of the matmul peak measured in the
same process, and peak memory, for the tiny and small configs, both backends (the peer
architecture: experiments/benchmarks/peer.py).

    python experiments/benchmarks/step_time.py [--configs tiny,small] [--steps 10] [--out results/step_time.json]

Runs on whatever devices JAX sees (one mesh over all of them). Batches are real text from the
built-in corpus. On CPU the small config runs with a reduced batch (``--small-batch``,
``--small-seq``) so the benchmark finishes in minutes; the batch used is in the JSON.
Compilation is excluded: the first step is run and waited for before timing starts. Peak
memory is XLA's own account of the compiled step (``compiled.memory_analysis()``: arguments,
outputs and temporaries, donated buffers counted once), the number that decides whether a
config fits a device.
"""

from __future__ import annotations

import argparse
import time

import jax
import numpy as np

from experiments.benchmarks.timing import machine, matmul_peak_flops, write_json
from experiments.configs import small_moe, tiny_moe
from moejax import checks, sharding
from moejax.data.pipeline import make_train_iterator
from moejax.model.transformer import flops_per_token, param_counts
from moejax.train.state import init_state, setup, to_global
from moejax.train.step import make_train_step


def measure(cfg, steps: int) -> dict:
    mesh_shape = checks.validate(cfg, jax.device_count())
    mesh = sharding.make_mesh(mesh_shape)
    run = setup(cfg, mesh)
    state = init_state(cfg, run)
    train_step = make_train_step(cfg, run)
    t = cfg.train
    data = make_train_iterator(
        dict(cfg.data.mixture), seq_len=t.seq_len, global_batch_size=t.global_batch_size, seed=0,
        cache_dir=cfg.data.cache_dir or None,
    )
    batches = [to_global(next(data), run.batch_sharding(True), t.grad_accum_steps) for _ in range(steps + 1)]
    with jax.set_mesh(mesh):
        memory = train_step.lower(state, batches[0]).compile().memory_analysis()
        start = time.perf_counter()
        state, _ = train_step(state, batches[0])
        jax.block_until_ready(state)
        compile_s = time.perf_counter() - start
        times = []
        for batch in batches[1:]:
            start = time.perf_counter()
            state, metrics = train_step(state, batch)
            jax.block_until_ready(metrics)
            times.append(time.perf_counter() - start)
    step_s = float(np.median(times))
    tokens_per_sec = t.global_batch_size * t.seq_len / step_s
    flops_tok = flops_per_token(cfg.model, t.seq_len)
    return {
        "params_total": param_counts(cfg.model)["total"],
        "params_active": param_counts(cfg.model)["active"],
        "global_batch_size": t.global_batch_size,
        "seq_len": t.seq_len,
        "compile_and_first_step_s": compile_s,
        "step_time_s": step_s,
        "tokens_per_sec": tokens_per_sec,
        "flops_per_token": flops_tok,
        "achieved_gflops": flops_tok * tokens_per_sec / 1e9,
        "peak_memory_mib": _peak_bytes(memory) / 2**20,
    }


def _peak_bytes(memory) -> float:
    """Arguments + outputs + temporaries, with donated (aliased) buffers counted once."""
    if memory is None:
        return float("nan")
    return float(memory.argument_size_in_bytes + memory.output_size_in_bytes
                 - memory.alias_size_in_bytes + memory.temp_size_in_bytes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", default="tiny,small")
    parser.add_argument("--backends", default="dropless,capacity")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--small-batch", type=int, default=8)
    parser.add_argument("--small-seq", type=int, default=512)
    parser.add_argument("--out", default="results/step_time.json")
    args = parser.parse_args()

    peak = matmul_peak_flops()
    print(f"matmul peak (jitted 1024x1024 float32, this process): {peak / 1e9:.0f} GFLOP/s")
    rows = []
    for name in args.configs.split(","):
        for backend in args.backends.split(","):
            if name == "small" and jax.default_backend() == "cpu":
                cfg = small_moe.cpu_benchmark_config(args.small_batch, args.small_seq)
            else:
                cfg = {"tiny": tiny_moe, "small": small_moe}[name].get_config()
            cfg.model.moe.backend = backend
            row = {"config": name, "backend": backend, "platform": jax.default_backend(),
                   "devices": jax.device_count(), **measure(cfg, args.steps)}
            row["fraction_of_matmul_peak"] = row["achieved_gflops"] * 1e9 / peak
            rows.append(row)
            print(
                f"{name:6s} {backend:9s} batch {row['global_batch_size']:3d}x{row['seq_len']:<5d} "
                f"step {row['step_time_s'] * 1e3:8.1f} ms  {row['tokens_per_sec']:9.0f} tok/s  "
                f"{row['achieved_gflops']:7.1f} GFLOP/s = {row['fraction_of_matmul_peak']:4.0%} of peak  "
                f"peak mem {row['peak_memory_mib']:7.0f} MiB  (compile {row['compile_and_first_step_s']:.1f} s)",
                flush=True,
            )
    write_json(args.out, {"rows": rows, "matmul_peak_flops": peak, "machine": machine()})


if __name__ == "__main__":
    main()
