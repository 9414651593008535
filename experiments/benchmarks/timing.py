"""Timing helpers shared by the benchmarks: interleaved rounds, medians, the matmul peak, JSON out.

The CPU machines are shared and noisy, so every benchmark times its candidates in interleaved
rounds (one call of each per round, after a warm-up call that also compiles) and keeps the median
per candidate: load from other processes hits all candidates alike, and ratios between candidates
of one run are what the benchmarks report. Absolute numbers from a busy machine are not.

Every result file is written by :func:`write_json`, which adds the ``host`` it was measured on
(:func:`host`): the same 2-core size comes as different CPUs, and every speed ratio moves with the
CPU model and its ISA (AVX-512, AMX), so a figure without its host cannot be compared.
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


def interleaved_times(fns: dict[str, Callable[[], object]], rounds: int, warmup: int = 1) -> dict[str, list[float]]:
    """Seconds of every call of each zero-argument function, timed in interleaved rounds (entry r of
    each list is round r, so two candidates pair by round).

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
    return times


def interleaved(fns: dict[str, Callable[[], object]], rounds: int, warmup: int = 1) -> dict[str, float]:
    """Median seconds per call of each function, timed in interleaved rounds (:func:`interleaved_times`)."""
    return {name: statistics.median(ts) for name, ts in interleaved_times(fns, rounds, warmup).items()}


def matmul_peak_flops(size: int = 1024, dtype=jnp.float32, rounds: int = 20) -> float:
    """The measured FLOP/s of a jitted ``size x size`` matmul (the roofline the steps are held to)."""
    a = jnp.ones((size, size), dtype)
    b = jnp.ones((size, size), dtype)
    matmul = jax.jit(lambda a, b: a @ b)
    secs = interleaved({"mm": lambda: jax.block_until_ready(matmul(a, b))}, rounds, warmup=3)["mm"]
    return 2.0 * size**3 / secs


# CPU features that change which matmul kernels XLA:CPU (Eigen, oneDNN, XNNPACK) can use.
ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile")


def _cpuinfo() -> tuple[str, set[str]]:
    """The CPU's model name and flags from /proc/cpuinfo (Linux); else platform's name, no flags."""
    model, flags = "", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and not model:
                    model = value.strip()
                elif key in ("flags", "Features") and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    return model or platform.processor() or platform.machine(), flags


def host() -> dict:
    """The host a figure was measured on: CPU model, the ISA flags that matter (``ISA_FLAGS``:
    true/false each), cores, the load average (1, 5, 15 min), jax/jaxlib versions and XLA_FLAGS."""
    import jaxlib

    model, flags = _cpuinfo()
    return {
        "cpu_model": model,
        "isa": {flag: flag in flags for flag in ISA_FLAGS},
        "cpu_count": os.cpu_count(),
        "load_avg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "platform": jax.default_backend(),
    }


def host_line(info: dict | None = None) -> str:
    """One line for LOG.md's rows: ``<cpu model>, <cores> cores, <ISA flags present>, load <1 min>``."""
    info = info or host()
    isa = ",".join(flag for flag, present in info["isa"].items() if present) or "no AVX2"
    load = f"{info['load_avg'][0]:.1f}" if info["load_avg"] else "?"
    return f"{info['cpu_model']}, {info['cpu_count']} cores, {isa}, load {load}"


def machine() -> dict:
    """What the numbers were measured on."""
    return {
        "platform": jax.default_backend(), "devices": jax.device_count(), "cpu_count": os.cpu_count(),
        "machine": platform.machine(), "jax": jax.__version__,
        "load_avg_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "allocator": allocator.active(),  # launch.sh preloads mimalloc: faster CPU steps (LOG.md, change 6)
    }


def write_json(path, payload: dict, *, indent: int = 2, announce: bool = True) -> None:
    """Write a benchmark's result with its ``host`` (:func:`host`; a payload that already has one,
    from the run that measured it, keeps it)."""
    payload = {**payload, "host": payload.get("host") or host()}
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(payload, f, indent=indent)
    if announce:
        print(f"wrote {path} (host: {host_line(payload['host'])})")
