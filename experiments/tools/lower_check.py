"""Lower the real train, eval and generation steps for GPU (``cuda``) and TPU on this CPU-only machine.

    python -m experiments.tools.lower_check [--cases tiny_dropless,deepseek_16b] [--platforms cuda,tpu] [--json out.json]

For each case (a shipped config with a few keys changed: :data:`CASES`) it builds the run on 8
fake CPU devices (the config's mesh and shardings), traces the train step, the eval step and the
generation steps (prefill and one decode step) with abstract inputs (``jax.ShapeDtypeStruct``
with the run's shardings; nothing is allocated) *as they are traced on the target platform*
(:func:`moejax.model.platform.lowering_for`: ``grouped_matmul="auto"`` resolves to tokamax or
``ragged_dot`` and attention to ``jax.nn.dot_product_attention``, as on a GPU/TPU), and lowers each
trace with ``.lower(lowering_platforms=(platform,))``. A case fails, naming the op, when

- an op has no lowering for the platform (JAX names the primitive: "MLIR translation rule for
  primitive 'x' not found for platform cuda"), or
- the lowered module calls a custom call the platform does not implement (a CPU-only library
  call such as LAPACK or oneDNN) or a host callback (``pure_callback``/``io_callback``, which runs
  on the host in the middle of the step): its target and the JAX op that made it are named.

**What a pass proves**: every op of the three steps has a StableHLO lowering for that platform,
the custom calls in it are ones that platform implements, and the shardings (the mesh, every
parameter's and activation's partitioning, the ``shard_map`` of expert parallelism) are
consistent enough for JAX to lower them. **What it does not prove**: nothing is compiled by the
GPU/TPU backend (XLA:GPU's or XLA:TPU's own passes, the SPMD partitioner's collectives, Triton or
Mosaic kernel compilation can still fail there), nothing is run (no numerics), and nothing is said
about speed or whether the step fits the device's memory (experiments/tools/compile_check.py
estimates that on CPU).

tokamax (``model.moe.grouped_matmul="tokamax"``, and ``"auto"`` on GPU/TPU when installed) picks
its kernel from the device it is traced on, and on this CPU host it would fall back to its XLA
reference. So that the lowering holds its real kernels, the tool traces it as a GPU/TPU host would
(:func:`tokamax_kernels`): for ``cuda`` with tokamax's own cross-compilation switch
(``tokamax.config.cross_compile``), which lowers its Triton kernel (on Hopper and Blackwell GPUs
tokamax prefers its Mosaic GPU kernel, which picks its tiling from the GPU's architecture at trace
time and cannot be traced without one: not checked here); for ``tpu`` with its Mosaic TPU kernel
told that the device is a TPU v5p (tokamax reads the TPU generation at trace time and has no
cross-compilation switch for it), which lowers to ``tpu_custom_call``. Where a kernel declines a
shape (tokamax's TPU kernel wants at least 128 rows, e.g. not a decode step's few), tokamax falls
back to its XLA reference, as it would on the device; the custom calls listed per step show which.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import logging
import math
import re
import sys
import time
from collections.abc import Callable, Iterator

import jax

STEPS = ("train", "eval", "prefill", "decode")
PLATFORMS = ("cuda", "tpu")

# Custom call targets each platform implements (the GPU's Triton and Mosaic kernels, cuDNN's fused
# attention; TPU's Mosaic kernels), and those of every platform (sharding annotations, host
# offloading markers). Any other target is reported.
PORTABLE_TARGETS = ("Sharding", "SPMDFullToShardShape", "SPMDShardToFullShape", "MoveToHost", "MoveToDevice",
                    "annotate_device_placement", "xla.sdy.")
PLATFORM_TARGETS = {
    "cuda": ("__gpu$xla.gpu.triton", "mosaic_gpu", "__cudnn$"),
    "rocm": ("__gpu$xla.gpu.triton",),
    "tpu": ("tpu_custom_call",),
}
HOST_CALLBACK = "callback"  # xla_python_cpu_callback, xla_ffi_python_gpu_callback, ...


LLEP = {"model.moe.backend": "expert_parallel", "model.moe.ep_balance": "llep", "mesh.expert": 4}
# name -> (a shipped config, the keys changed). grouped_matmul "auto" (the configs' default) takes
# tokamax, when installed, on one device and ragged_dot on several. Every case runs on all devices
# but tiny_one_device (mesh.data=1).
CASES: dict[str, tuple[str, dict]] = {
    "tiny_dropless": ("tiny_moe", {}),
    "tiny_one_device": ("tiny_moe", {"mesh.data": 1}),
    "tiny_capacity": ("tiny_moe", {"model.moe.backend": "capacity"}),
    "tiny_llep": ("tiny_moe", LLEP),
    "tiny_l3": ("tiny_moe", {"model.l3.after_layers": (0,)}),
    # The ~16B-parameter config with its own mesh (expert=8) on 8 devices: abstract, nothing allocated.
    "deepseek_16b": ("deepseek_16b", {}),
}


def case_config(name: str, overrides: dict | None = None):
    """The config of case ``name`` (:data:`CASES`), with ``overrides`` ({dotted key: value}) on top."""
    from moejax import config as config_lib

    config, keys = CASES[name]
    return config_lib.load(config, {**keys, **(overrides or {})})[0]


def may_use_tokamax(cfg, num_devices: int) -> bool:
    """Whether the config's grouped matmul resolves to tokamax on a GPU/TPU (then the cuda and tpu
    traces differ: its kernels are per platform). tokamax serves on one device only."""
    from moejax.model.grouped_matmul import tokamax_installed

    moe = cfg.model.moe
    return (tokamax_installed() and moe.grouped_matmul in ("auto", "tokamax") and moe.num_experts > 1
            and moe.backend != "capacity" and num_devices == 1)


@contextlib.contextmanager
def tokamax_kernels(platform: str) -> Iterator[None]:
    """Trace tokamax's GPU (``cuda``: Triton) or TPU (Mosaic, as on a TPU v5p) kernels on this host;
    see the module docstring. Only for lowering: nothing traced here may run."""
    from unittest import mock

    import tokamax
    from jax._src.pallas.mosaic import tpu_info
    from tokamax._src.ops.ragged_dot import pallas_mosaic_tpu

    with contextlib.ExitStack() as stack:
        if platform == "cuda":
            stack.enter_context(tokamax.config.cross_compile(True))
        elif platform == "tpu":
            v5p = lambda: tpu_info.get_tpu_info_for_chip(tpu_info.ChipVersion.TPU_V5P, 1)
            stack.enter_context(mock.patch.dict(tpu_info.registry, {jax.devices()[0].device_kind: v5p}))
            stack.enter_context(mock.patch.object(pallas_mosaic_tpu.PallasMosaicTpuRaggedDot, "supported_on",
                                                  lambda self, device: True))
        # tokamax warns of an "autotuning cache miss" for every kernel it configures by its
        # heuristics (what it does on any machine without a tuned cache): kept quiet here.
        absl_log = logging.getLogger("absl")
        stack.callback(absl_log.setLevel, absl_log.level)
        absl_log.setLevel(logging.ERROR)
        yield


def abstract_batch(cfg, run, accum: bool) -> dict:
    from experiments.tools.compile_check import abstract_batch as train_batch
    from moejax.train.state import BATCH_KEYS

    if accum:
        return train_batch(cfg, run)
    t = cfg.train
    shape = (t.global_batch_size // t.grad_accum_steps, t.seq_len)
    return {key: jax.ShapeDtypeStruct(shape, jax.numpy.float32 if key == "loss_mask" else jax.numpy.int32,
                                      sharding=run.batch_sharding(accum=False)) for key in BATCH_KEYS}


def step_tracers(cfg, run, steps=STEPS) -> dict[str, Callable]:
    """step name -> a function tracing the run's real step on abstract inputs (for the current target)."""
    from moejax.eval.generator import Generator
    from moejax.train.step import make_eval_step, make_train_step

    state = run.abstract_state
    rows = max(run.mesh.size, 8)
    generate = functools.cache(lambda: Generator(run, cfg, max_len=32).trace(
        state["params"], state["balance"], batch=rows, prompt_len=16))
    tracers = {
        "train": lambda: make_train_step(cfg, run).trace(state, abstract_batch(cfg, run, accum=True)),
        "eval": lambda: make_eval_step(cfg, run).trace(state["params"], abstract_batch(cfg, run, accum=False),
                                                       state["balance"]),
        "prefill": lambda: generate()["prefill"],
        "decode": lambda: generate()["decode"],
    }
    return {step: tracers[step] for step in steps}


def custom_call_problems(module_text: str, platform: str) -> list[str]:
    """The custom calls of a lowered module (``.as_text(debug_info=True)``) that ``platform`` does
    not implement, or that call back to the host, each with the JAX op that made it."""
    locs = dict(re.findall(r'^(#loc\d+) = loc\((.*)\)$', module_text, re.M))

    def where(loc: str) -> str:
        for _ in range(8):  # follow loc aliases to a named location
            name = re.match(r'"([^"]+)"', loc)
            if name:
                return name.group(1)
            ref = re.search(r"(#loc\d+)", loc)
            if not ref or ref.group(1) not in locs:
                break
            loc = locs[ref.group(1)]
        return "?"

    problems = []
    allowed = PORTABLE_TARGETS + PLATFORM_TARGETS.get(platform, ())
    for target, loc in re.findall(r'stablehlo\.custom_call @([\w$.\-]+)\(.*?loc\(([^)]*)\)\s*$', module_text, re.M):
        if HOST_CALLBACK in target.lower():
            problems.append(f"host callback {target} (from {where(loc)}) runs on the host in the middle of the step")
        elif not target.startswith(allowed):
            problems.append(f"custom call {target} (from {where(loc)}) is not one {platform} implements")
    return sorted(set(problems))


CALLBACK_PRIMITIVES = ("pure_callback", "io_callback", "debug_callback", "callback")


def host_callbacks(jaxpr) -> list[str]:
    """The host callbacks of a (closed) jaxpr and its inner jaxprs, each with where it was made."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name in CALLBACK_PRIMITIVES:
            found.append(f"host callback {eqn.primitive.name} (from {eqn.source_info.name_stack or '?'}) runs on "
                         "the host in the middle of the step")
        for param in eqn.params.values():
            for inner in param if isinstance(param, (tuple, list)) else (param,):
                inner = getattr(inner, "jaxpr", inner)
                if hasattr(inner, "eqns"):
                    found += host_callbacks(inner)
    return found


def lower_one(traced, platform: str) -> dict:
    """Lower one trace for ``platform``: {"ok", "problems", "custom_calls", "seconds"}."""
    start = time.perf_counter()
    callbacks = sorted(set(host_callbacks(traced.jaxpr.jaxpr)))
    try:
        text = traced.lower(lowering_platforms=(platform,)).as_text(debug_info=True)
    except Exception as e:  # noqa: BLE001 - the point is to name what fails
        return {"ok": False, "problems": callbacks + [f"{type(e).__name__}: {_first_line(e)}"], "custom_calls": [],
                "seconds": time.perf_counter() - start}
    problems = sorted(set(callbacks + custom_call_problems(text, platform)))
    calls = sorted(set(re.findall(r"stablehlo\.custom_call @([\w$.\-]+)", text)))
    return {"ok": not problems, "problems": problems, "custom_calls": calls, "seconds": time.perf_counter() - start}


def lower_case(cfg, platforms=PLATFORMS, steps=STEPS) -> list[dict]:
    """Every step of ``cfg`` lowered for every platform: rows {case fields, step, platform, ok, ...}.

    Steps are traced once per platform family that traces alike: the cuda and tpu traces differ
    only where tokamax is used (its kernels are per platform), so without it one trace serves both.
    """
    from moejax import checks, sharding
    from moejax.model import platform as target
    from moejax.train.state import setup

    devices = jax.devices()
    if all(cfg.mesh[axis] > 0 for axis in cfg.mesh):  # a fixed mesh smaller than the machine
        devices = devices[: math.prod(cfg.mesh[axis] for axis in cfg.mesh)]
    mesh_shape = checks.validate(cfg, len(devices), notes=False)
    run = setup(cfg, sharding.make_mesh(mesh_shape, devices))
    rows: list[dict] = []
    traces: dict[tuple[str, str], object] = {}
    for platform in platforms:
        tokamax = may_use_tokamax(cfg, len(devices))
        key = platform if tokamax else "accelerator"
        for step, trace in step_tracers(cfg, run, steps).items():
            start = time.perf_counter()
            if (key, step) not in traces:
                kernels = tokamax_kernels(platform) if tokamax else contextlib.nullcontext()
                with target.lowering_for(platform), kernels, jax.set_mesh(run.mesh):
                    try:
                        traces[key, step] = trace()
                    except Exception as e:  # noqa: BLE001 - failing to trace for the platform is a finding too
                        traces[key, step] = f"tracing for {platform}: {type(e).__name__}: {_first_line(e)}"
            trace_s = time.perf_counter() - start
            traced = traces[key, step]
            if isinstance(traced, str):
                result = {"ok": False, "problems": [traced], "custom_calls": [], "seconds": 0.0}
            else:
                with jax.set_mesh(run.mesh):
                    result = lower_one(traced, platform)
            rows.append({"step": step, "platform": platform, "mesh": mesh_shape, "trace_s": trace_s, **result})
    return rows


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else ""


def format_rows(rows: list[dict]) -> str:
    lines = [f"{'case':24s} {'step':8s} {'platform':8s} {'result':8s} custom calls / problems"]
    for r in rows:
        detail = "; ".join(r["problems"]) if r["problems"] else ", ".join(r["custom_calls"]) or "-"
        lines.append(f"{r['case']:24s} {r['step']:8s} {r['platform']:8s} {'ok' if r['ok'] else 'FAIL':8s} {detail}")
    return "\n".join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, from: {', '.join(CASES)}")
    p.add_argument("--platforms", default=",".join(PLATFORMS), help="comma-separated lowering platforms (cuda, rocm, tpu)")
    p.add_argument("--devices", type=int, default=8, help="fake CPU devices (the mesh's size)")
    p.add_argument("--json", default="", help="also write the rows to this JSON file")
    args = p.parse_args(argv)
    cases = args.cases.split(",")
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        p.error(f"--cases: unknown {', '.join(unknown)}; allowed: {', '.join(CASES)}")
    platforms = tuple(args.platforms.split(","))
    bad = [x for x in platforms if x not in ("cuda", "rocm", "tpu", "cpu")]
    if bad:
        p.error(f"--platforms: unknown {', '.join(bad)}; allowed: cuda, rocm, tpu, cpu")
    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_num_cpu_devices", args.devices)
    rows = []
    for case in cases:
        rows += [{"case": case, **r} for r in lower_case(case_config(case), platforms)]
    print(format_rows(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    failed = sorted({(r["case"], r["platform"]) for r in rows if not r["ok"]})
    if failed:
        sys.exit("lower_check: FAIL: " + ", ".join(f"{c} on {pl}" for c, pl in failed))
    print(f"lower_check: OK, every step of {len(cases)} case(s) lowers for {', '.join(platforms)}")


if __name__ == "__main__":
    main()
