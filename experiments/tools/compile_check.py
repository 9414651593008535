"""Compile-only memory check: will this config fit on this mesh? Nothing is allocated.

    python -m experiments.tools.compile_check --config experiments/configs/deepseek_16b.py --devices 64 \\
        --budget_gib 80 [--config.train.remat=full] [--config.mesh.fsdp=8] [--json out.json]

Lowers and compiles the real train step (the one ``launch.sh`` runs) for ``--devices`` fake CPU
devices with abstract inputs (``jax.ShapeDtypeStruct`` with the run's shardings), then reports
per device:

- parameters and optimizer state: exact, from each array's shard shape under its sharding;
- activations and workspace: XLA's temporary buffers (``memory_analysis().temp_size_in_bytes``),
  which is what ``train.remat`` shrinks;
- peak: arguments + outputs - donated (aliased) buffers + temporaries.

It exits with status 1 and says what to change when the peak exceeds ``--budget_gib``. The
numbers come from XLA:CPU's buffer assignment for the SPMD-partitioned program: parameter and
optimizer figures are exact on any platform; temporaries are an estimate of what GPU/TPU
compilers allocate (their fusion and scheduling differ, and on CPU the dropless experts use the
tiled grouped matmul). Keep a margin.

``model.moe.grouped_matmul="auto"`` is compiled as ``"tiled"``: on the GPU/TPU the check stands in
for, ``"auto"`` is ``ragged_dot``, whose buffers are the rows themselves, and ``"tiled"``'s (the
rows, sliced tile by tile in a loop) are the closest on CPU; the CPU default ``"hybrid"`` also
holds a batched copy of each expert's first rows (moejax/model/grouped_matmul.py).
"""

from __future__ import annotations

import json
import math
import sys
import time

import jax
import jax.numpy as jnp
from absl import app, flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", "experiments/configs/deepseek_16b.py", "Experiment file.")
_DEVICES = flags.DEFINE_integer("devices", 64, "Fake CPU devices to compile for (the mesh's size).")
_BUDGET = flags.DEFINE_float("budget_gib", 80.0, "Per-device memory budget in GiB (H100/H200: 80/141).")
_JSON = flags.DEFINE_string("json", "", "Also write the report to this JSON file.")

GIB = 2**30


def shard_bytes(abstract_tree) -> int:
    """Bytes of one device's shards of a tree of ShapeDtypeStructs with shardings (the largest)."""
    total = 0
    for leaf in jax.tree.leaves(abstract_tree):
        shard = leaf.sharding.shard_shape(leaf.shape)
        total += math.prod(shard) * jnp.dtype(leaf.dtype).itemsize
    return total


def abstract_batch(cfg, run) -> dict[str, jax.ShapeDtypeStruct]:
    """The train step's batch [A, B/A, T] as abstract arrays with the training batch sharding."""
    from moejax.train.state import BATCH_KEYS

    t = cfg.train
    shape = (t.grad_accum_steps, t.global_batch_size // t.grad_accum_steps, t.seq_len)
    dtypes = {"loss_mask": jnp.float32}
    return {
        key: jax.ShapeDtypeStruct(shape, dtypes.get(key, jnp.int32), sharding=run.batch_sharding(accum=True))
        for key in BATCH_KEYS
    }


def compile_report(cfg) -> dict:
    """Lowers and compiles the train step of ``cfg`` on all visible devices; per-device bytes."""
    from moejax import checks, sharding
    from moejax.train.state import setup
    from moejax.train.step import make_train_step

    if cfg.model.moe.grouped_matmul == "auto":  # see the module docstring
        cfg = cfg.copy_and_resolve_references()
        cfg.model.moe.grouped_matmul = "tiled"
    mesh_shape = checks.validate(cfg, jax.device_count())
    run = setup(cfg, sharding.make_mesh(mesh_shape))
    train_step = make_train_step(cfg, run)
    start = time.perf_counter()
    with jax.set_mesh(run.mesh):
        compiled = train_step.lower(run.abstract_state, abstract_batch(cfg, run)).compile()
    compile_s = time.perf_counter() - start
    mem = compiled.memory_analysis()
    peak = (
        mem.argument_size_in_bytes + mem.output_size_in_bytes - mem.alias_size_in_bytes
        + mem.temp_size_in_bytes
    )
    return {
        "mesh": mesh_shape,
        "remat": cfg.train.remat,
        "grouped_matmul": cfg.model.moe.grouped_matmul,
        "global_batch_size": cfg.train.global_batch_size,
        "seq_len": cfg.train.seq_len,
        "params_bytes": shard_bytes(run.abstract_state["params"]),
        "opt_state_bytes": shard_bytes(run.abstract_state["opt_state"]),
        "arguments_bytes": mem.argument_size_in_bytes,
        "outputs_bytes": mem.output_size_in_bytes,
        "aliased_bytes": mem.alias_size_in_bytes,
        "activations_bytes": mem.temp_size_in_bytes,
        "peak_bytes": peak,
        "compile_s": compile_s,
    }


def format_report(report: dict, budget_gib: float) -> str:
    rows = [
        ("parameters", report["params_bytes"]),
        ("optimizer state", report["opt_state_bytes"]),
        ("activations + workspace (XLA temp)", report["activations_bytes"]),
        ("all arguments (state + batch)", report["arguments_bytes"]),
        ("peak (args + outputs - donated + temp)", report["peak_bytes"]),
    ]
    lines = [
        f"mesh {report['mesh']}, remat={report['remat']}, batch {report['global_batch_size']} x "
        f"{report['seq_len']}, compiled in {report['compile_s']:.0f} s",
        f"{'per device':<40}{'GiB':>10}",
    ]
    lines += [f"{name:<40}{value / GIB:>10.2f}" for name, value in rows]
    lines.append(f"{'budget':<40}{budget_gib:>10.2f}")
    return "\n".join(lines)


def main(argv) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}")
    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_num_cpu_devices", _DEVICES.value)
    cfg = _CONFIG.value
    from moejax.errors import ConfigError

    try:
        report = compile_report(cfg)
    except ConfigError as e:
        sys.exit(f"compile_check: error: {e}")
    report["budget_bytes"] = int(_BUDGET.value * GIB)
    print(format_report(report, _BUDGET.value))
    if _JSON.value:
        with open(_JSON.value, "w") as f:
            json.dump(report, f, indent=2)
    if report["peak_bytes"] > report["budget_bytes"]:
        sys.exit(
            f"compile_check: FAIL: {report['peak_bytes'] / GIB:.2f} GiB per device exceeds the budget of "
            f"{_BUDGET.value:.2f} GiB. Cut activations with --config.train.remat=full (or save_dots), "
            "split parameters and optimizer state over more devices (mesh.fsdp / mesh.expert), or lower "
            "train.global_batch_size per device / raise train.grad_accum_steps."
        )
    print("compile_check: OK, fits the budget")


if __name__ == "__main__":
    app.run(main)
