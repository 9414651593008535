"""Timing helpers shared by the benchmarks: interleaved rounds, medians, the matmul peak, JSON out.

The CPU machines are shared and noisy, so every benchmark times its candidates in interleaved
rounds (one call of each per round, after a warm-up call that also compiles) and keeps the median
per candidate: load from other processes hits all candidates alike, and ratios between candidates
of one run are what the benchmarks report. Absolute numbers from a busy machine are not.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from typing import Callable

import jax
import jax.numpy as jnp

from moejax import allocator


def interleaved(fns: dict[str, Callable[[], object]], rounds: int, warmup: int = 1) -> dict[str, float]:
    """Median seconds per call of each zero-argument function, timed in interleaved rounds.

    Each function must block until its result is ready (wrap jitted calls with
    ``jax.block_until_ready``).
    """
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(ts) for name, ts in times.items()}


def matmul_peak_flops(size: int = 1024, dtype=jnp.float32, rounds: int = 20) -> float:
    """The measured FLOP/s of a jitted ``size x size`` matmul (the roofline the steps are held to)."""
    a = jnp.ones((size, size), dtype)
    b = jnp.ones((size, size), dtype)
    matmul = jax.jit(lambda a, b: a @ b)
    secs = interleaved({"mm": lambda: jax.block_until_ready(matmul(a, b))}, rounds, warmup=3)["mm"]
    return 2.0 * size**3 / secs


def machine() -> dict:
    """What the numbers were measured on."""
    return {
        "platform": jax.default_backend(), "devices": jax.device_count(), "cpu_count": os.cpu_count(),
        "machine": platform.machine(), "jax": jax.__version__,
        "load_avg_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "allocator": allocator.active(),  # launch.sh preloads mimalloc: faster CPU steps (LOG.md, change 6)
    }


def write_json(path: str, payload: dict) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump(payload, f, indent=2)
    print(f"wrote {path}")
