"""Forward + backward time of the MoE dispatch: expert_parallel (both comm forms) vs dropless.

    python -m experiments.benchmarks.expert_parallel [--rounds 8] [--out results/expert_parallel.json]

One process, 8 fake CPU devices (``jax_num_cpu_devices``; on GPU/TPU the real devices). The same
tokens, routing and expert weights go through jitted ``value_and_grad`` of the dispatch (grads
w.r.t. tokens, combine weights and the three expert weights) for each variant:

- ``dropless 1dev``: the dropless backend on one device, no mesh (the reference);
- ``dropless dp``: the dropless backend on a data-parallel mesh over all devices (weights
  replicated, no token exchange): what the fake devices alone cost;
- ``dropless mesh``: the dropless backend on the expert mesh, left to the compiler (GSPMD) to
  partition;
- ``ep all_to_all`` / ``ep all_gather``: the expert_parallel backend on the mesh, with the
  default ``ep_capacity_factor`` (2) and with ``ep_capacity_factor`` = mesh.expert (dropless).

Two routings: ``random`` (top-k of Gaussian logits: nearly balanced) and ``skewed`` (every token
picks experts 0 and 1, which live on two devices: extreme imbalance). Variants are compiled first,
then timed interleaved, one call of each per round in a rotated order, so the load of a shared
machine hits all alike. Reported: median time per call, its ratio to ``dropless 1dev`` and to
``dropless mesh``, the drop rate, and the temp memory XLA reserves per device
(``compiled.memory_analysis()``).

The CPU numbers are only indicative: the 8 "devices" share the host's cores (2 on the dev
machines) and the collectives are memory copies, so expert parallelism cannot speed anything up
here; what they show is its overhead (slots, sorting, collectives) and that imbalance does not
cost memory or time beyond the buffer. Real speedups need real devices.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import time

import jax

jax.config.update("jax_num_cpu_devices", 8)  # before any device is touched; CPU only

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402

from experiments.benchmarks.timing import write_json  # noqa: E402
from moejax import sharding  # noqa: E402
from moejax.model.dispatch import dispatch  # noqa: E402
from moejax.schema import DispatchConfig  # noqa: E402


def make_inputs(tokens: int, seq: int, d: int, f: int, e: int, k: int, routing: str):
    keys = jax.random.split(jax.random.key(0), 6)
    g = tokens // seq
    x_gtd = jax.random.normal(keys[0], (g, seq, d))
    if routing == "random":
        w_gtk, idx_gtk = jax.lax.top_k(jax.random.normal(keys[1], (g, seq, e)), k)
    else:
        idx_gtk = jnp.broadcast_to(jnp.arange(k), (g, seq, k))
        w_gtk = jnp.ones((g, seq, k))
    return (
        x_gtd, idx_gtk.astype(jnp.int32), jax.nn.softmax(w_gtk, axis=-1),
        jax.random.normal(keys[2], (e, d, f)) / d**0.5,
        jax.random.normal(keys[3], (e, d, f)) / d**0.5,
        jax.random.normal(keys[4], (e, f, d)) / f**0.5,
        jax.random.normal(keys[5], (g, seq, d)),  # output cotangent
    )


def place(mesh, inputs):
    """Inputs with the shardings the model gives them: batch over (data, fsdp, expert), weights by RULES."""
    tokens = sharding.logical_to_spec(("batch", None, None))
    w_in = sharding.logical_to_spec(("experts", "embed", "expert_mlp"))
    w_out = sharding.logical_to_spec(("experts", "expert_mlp", "embed"))
    specs = (tokens, tokens, tokens, w_in, w_in, w_out, tokens)
    return tuple(jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip(inputs, specs))


def step_fn(**dispatch_kw):
    """Jitted (inputs) -> (loss, drop rate, grads): one forward and backward of the dispatch."""
    run = functools.partial(dispatch, cfg=DispatchConfig(**dispatch_kw))

    def loss(x_gtd, idx_gtk, w_gtk, w_gate_edf, w_up_edf, w_down_efd, cotangent_gtd):
        y_gtd, stats = run(x_gtd, idx_gtk, w_gtk, w_gate_edf, w_up_edf, w_down_efd)
        return jnp.sum(y_gtd * cotangent_gtd), stats["drop_rate"]

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 2, 3, 4, 5), has_aux=True))


def variants(peers: int, tile_size: int):
    common = dict(impl="auto", tile_size=tile_size)
    out = {name: dict(backend="dropless", **common) for name in ("dropless 1dev", "dropless dp", "dropless mesh")}
    for comm in ("all_to_all", "all_gather"):
        for factor in (2.0, float(peers)):
            out[f"ep {comm} cf={factor:g}"] = dict(
                backend="expert_parallel", ep_comm=comm, ep_capacity_factor=factor, **common
            )
    return out


def measure(args, mesh, routing: str) -> list[dict]:
    inputs = make_inputs(args.tokens, args.seq, args.d_model, args.expert_dim, args.experts, args.top_k, routing)
    specs = variants(mesh.shape["expert"], args.tile_size)
    fns = {name: step_fn(**kw) for name, kw in specs.items()}
    dp_mesh = sharding.make_mesh({"data": jax.device_count(), "fsdp": 1, "expert": 1, "tensor": 1})
    meshes = {name: dp_mesh if name == "dropless dp" else mesh for name in specs}
    meshes["dropless 1dev"] = None
    placed = {name: jax.device_put(inputs, jax.devices()[0]) if m is None else place(m, inputs)
              for name, m in meshes.items()}

    compiled = {}
    for name, m in meshes.items():
        with contextlib.nullcontext() if m is None else jax.set_mesh(m):
            compiled[name] = fns[name].lower(*placed[name]).compile()
    temp_bytes = {name: c.memory_analysis().temp_size_in_bytes for name, c in compiled.items()}
    call = lambda name: compiled[name](*placed[name])

    names = list(specs)
    drop = {}
    for name in names:  # warm up
        (_, drop[name]), _ = jax.block_until_ready(call(name))
        jax.block_until_ready(call(name))
    samples = {name: [] for name in names}
    for rnd in range(args.rounds):
        for name in names[rnd % len(names):] + names[:rnd % len(names)]:
            start = time.perf_counter()
            jax.block_until_ready(call(name))
            samples[name].append(time.perf_counter() - start)

    median = {name: float(np.median(s)) for name, s in samples.items()}
    return [
        {"routing": routing, "variant": name, **specs[name], "median_s": median[name],
         "vs_dropless_1dev": median[name] / median["dropless 1dev"],
         "vs_dropless_mesh": median[name] / median["dropless mesh"], "drop_rate": float(drop[name]),
         "temp_bytes_per_device": temp_bytes[name]}
        for name in names
    ]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=8, help="timed calls per variant, interleaved")
    p.add_argument("--tokens", type=int, default=4096, help="tokens per call (over all devices)")
    p.add_argument("--seq", type=int, default=256, help="tokens per group (sequence)")
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--expert-dim", type=int, default=512)
    p.add_argument("--experts", type=int, default=16)
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--tile-size", type=int, default=64)
    p.add_argument("--data", type=int, default=1, help="mesh.data; mesh.expert takes the other devices")
    p.add_argument("--out", default="results/expert_parallel.json")
    args = p.parse_args()

    n = jax.device_count()
    mesh = sharding.make_mesh({"data": args.data, "fsdp": 1, "expert": n // args.data, "tensor": 1})
    print(f"{jax.default_backend()} x {n}, mesh {dict(mesh.shape)}: {args.tokens} tokens, d={args.d_model}, "
          f"f={args.expert_dim}, {args.experts} experts, top-{args.top_k}; forward + backward", flush=True)
    rows = []
    for routing in ("random", "skewed"):
        for row in measure(args, mesh, routing):
            rows.append(row)
            print(f"{routing:7s} {row['variant']:22s} {row['median_s'] * 1e3:8.1f} ms  "
                  f"x{row['vs_dropless_1dev']:5.2f} vs dropless 1dev  x{row['vs_dropless_mesh']:5.2f} vs mesh  "
                  f"drop {row['drop_rate']:.3f}  temp {row['temp_bytes_per_device'] / 2**20:6.1f} MiB/device",
                  flush=True)
    write_json(args.out, {"platform": jax.default_backend(), "devices": n, "mesh": dict(mesh.shape),
                          "args": vars(args), "rows": rows}, announce=False)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
