"""Grouped matmul on CPU: ragged_dot vs the tiled kernel (per tile size) vs a dense einsum.

Forward only, float32, m rows split over e experts. Two routings per expert count:

- ``equal``: m / e rows per expert. The dense per-expert einsum ``'emd,edf->emf'`` computes the
  same product, so it is the ceiling a grouped kernel can reach.
- ``random``: each row picks an expert uniformly at random (group sizes m / e +- noise, like a
  freshly initialised router), so the tiled kernel pays for padding; the dense einsum cannot run.

Effective GFLOP/s counts only the useful 2 * m * d * f flops. The candidates are timed in
interleaved rounds (one call each per round, after warmup) and the median per candidate is kept,
so load from other processes hits them alike. Prints a table, writes JSON, and names the tile
size with the best worst-case GFLOP/s over all cases.

    python -m experiments.benchmarks.grouped_matmul --out results/grouped_matmul.json
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from experiments.benchmarks.timing import write_json
from moejax.model.grouped_matmul import grouped_matmul


def _dense_einsum(x_md, w_edf, group_sizes_e):
    del group_sizes_e  # equal groups: row i belongs to expert i // (m / e)
    e, d, f = w_edf.shape
    return jnp.einsum("emd,edf->emf", x_md.reshape(e, -1, d), w_edf).reshape(-1, f)


def _candidates(tile_sizes: list[int], equal_groups: bool) -> dict:
    fns = {}
    if equal_groups:
        fns["dense_einsum"] = jax.jit(_dense_einsum)
    fns["ragged"] = jax.jit(lambda x, w, gs: grouped_matmul(x, w, gs, impl="ragged"))
    for ts in tile_sizes:
        fns[f"tiled_{ts}"] = jax.jit(
            lambda x, w, gs, ts=ts: grouped_matmul(x, w, gs, impl="tiled", tile_size=ts)
        )
    return fns


def _group_sizes(routing: str, m: int, e: int, seed: int = 0) -> np.ndarray:
    if routing == "equal":
        if m % e:
            raise ValueError(f"equal routing needs --rows ({m}) divisible by experts ({e})")
        return np.full(e, m // e, np.int32)
    expert_of_row = np.random.default_rng(seed).integers(0, e, size=m)
    return np.bincount(expert_of_row, minlength=e).astype(np.int32)


def _median_ms(fns: dict, args: tuple, *, warmup: int, runs: dict) -> dict:
    """Median wall time per candidate in ms, timed in interleaved rounds after warmup."""
    for fn in fns.values():
        for _ in range(warmup):
            jax.block_until_ready(fn(*args))
    times = {name: [] for name in fns}
    for round_ in range(max(runs.values())):
        for name, fn in fns.items():
            if round_ < runs[name]:
                start = time.perf_counter()
                jax.block_until_ready(fn(*args))
                times[name].append((time.perf_counter() - start) * 1e3)
    return {name: statistics.median(ts) for name, ts in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="results/grouped_matmul.json")
    parser.add_argument("--experts", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--routings", nargs="+", default=["equal", "random"],
                        choices=["equal", "random"])
    parser.add_argument("--rows", type=int, default=8192)
    parser.add_argument("--d", type=int, default=256)
    parser.add_argument("--f", type=int, default=512)
    parser.add_argument("--tile-sizes", type=int, nargs="+", default=[32, 64, 128])
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--ragged-runs", type=int, default=3,
                        help="ragged_dot is dense over experts on CPU (seconds per call)")
    args = parser.parse_args()

    m, d, f = args.rows, args.d, args.f
    flops = 2 * m * d * f
    key_x, key_w = jax.random.split(jax.random.key(0))
    x_md = jax.random.normal(key_x, (m, d), jnp.float32)
    cases = [(e, routing) for e in args.experts for routing in args.routings]
    rows = []
    for e, routing in cases:
        w_edf = jax.random.normal(key_w, (e, d, f), jnp.float32) / d**0.5
        group_sizes_e = jnp.asarray(_group_sizes(routing, m, e))
        fns = _candidates(args.tile_sizes, equal_groups=routing == "equal")
        outputs = {name: fn(x_md, w_edf, group_sizes_e) for name, fn in fns.items()}
        runs = {name: args.ragged_runs if name == "ragged" else args.runs for name in fns}
        ms = _median_ms(fns, (x_md, w_edf, group_sizes_e), warmup=args.warmup, runs=runs)
        for name in fns:
            err = float(jnp.max(jnp.abs(outputs[name] - outputs["ragged"])))
            rows.append(dict(impl=name, experts=e, routing=routing, rows=m, d=d, f=f,
                             ms=ms[name], gflops=flops / ms[name] / 1e6,
                             max_abs_err_vs_ragged=err))
            print(f"  e={e:3d} {routing:6s} {name:13s} {ms[name]:9.2f} ms "
                  f"{flops / ms[name] / 1e6:7.1f} GFLOP/s", flush=True)

    def worst_gflops(tile_size: int) -> float:
        return min(r["gflops"] for r in rows if r["impl"] == f"tiled_{tile_size}")

    best_tile_size = max(args.tile_sizes, key=worst_gflops)

    print(f"\nforward grouped matmul GFLOP/s: m={m} d={d} f={f}, float32, "
          f"{jax.default_backend()}, {os.cpu_count()} cores, median of {args.runs} "
          f"(ragged: {args.ragged_runs})")
    columns = [f"e={e} {routing}" for e, routing in cases]
    print(f"{'impl':14s}" + "".join(f"{c:>14s}" for c in columns))
    for name in dict.fromkeys(r["impl"] for r in rows):
        cells = {f"e={r['experts']} {r['routing']}": r["gflops"] for r in rows if r["impl"] == name}
        print(f"{name:14s}" + "".join(
            f"{cells[c]:14.1f}" if c in cells else f"{'-':>14s}" for c in columns))
    print(f"best tile size (highest worst-case GFLOP/s): {best_tile_size}")

    write_json(args.out, dict(backend=jax.default_backend(), jax=jax.__version__, cpus=os.cpu_count(),
                              machine=platform.machine(), best_tile_size=best_tile_size, results=rows))


if __name__ == "__main__":
    main()
