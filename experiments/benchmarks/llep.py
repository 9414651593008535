"""LLEP vs standard expert parallelism under balanced, Zipf-skewed and adversarial routing.

    ./launch.sh python -m experiments.benchmarks.llep [--rounds 5] [--out results/llep.json]

One process, 8 fake CPU devices (``jax_num_cpu_devices``; on GPU/TPU the real devices), mesh
expert=8. The same tokens and expert weights go through jitted ``value_and_grad`` of the dispatch
(forward + backward: grads w.r.t. tokens, combine weights and the three expert weights) for each
variant:

- ``drop cf=2``: standard EP (``ep_balance="drop"``, all_to_all) at the default factor 2: bounded
  memory, drops what the per-pair buffers cannot hold. The baseline of the ratios.
- ``drop cf=2 gather``: the same in the all_gather form, the token movement LLEP uses.
- ``drop cf=P``: standard EP with ``ep_capacity_factor = mesh.expert``: never drops, buffers as
  large as every assignment of the device (what dropless standard EP costs with static shapes).
- ``llep``: ``ep_balance="llep"`` with the default imbalance threshold (``ep_llep_threshold`` 1.3),
  ``ep_comm="all_to_all"``, native factor 1, 2 spill slots of factor 1: under the threshold it is
  standard EP (all_to_all) at factor 1.3 exactly, which then drops nothing; at or above it, or when
  a device pair would overflow, it spills (2 slots of q rows are enough for any routing at 16
  experts over 8 devices: S >= E/P + 1/spill factor).
- ``llep always``: threshold 1 (spills at every step, the behaviour before the threshold), all_gather,
  native factor 1, 2 spill slots of factor 1.

Routings (16 experts, top-2): ``balanced`` (top-2 of Gaussian logits); ``zipf`` (experts drawn
without replacement with probability ~ 1 / rank^1.2); RepetitionCurse-style repetitive prompts,
whose hidden states are token embeddings routed by a random linear router, so every token of one id
picks the same two experts: ``pattern`` (a repeated two-token pattern: at most 4 experts busy) and
``adversarial`` (one token repeated: every token on the same 2 experts). One compiled program per variant serves all
routings (the routing is data, not shape), so its temp memory (``compiled.memory_analysis()``) is
the same for every routing by construction.

Reported per (routing, variant): the load per device, as assignments its experts are asked for
(``asked``: standard EP before dropping) and as rows it actually computes (``computed``: kept
assignments, for LLEP after spilling), both as max / mean with mean = assignments / devices; the
drop rate; temp MiB per device; median step time of interleaved rounds; ratios of time, temp
memory and computed max load to ``drop cf=2``.

The CPU timings are only indicative: the 8 "devices" share the host's cores (2 on the dev
machines) and the collectives are memory copies, so the compute balance LLEP buys (every device
finishing at about the same time) cannot show as speed here: one host runs all devices' work in
turn, so time follows the total rows computed plus overheads, not the largest device's rows. On
GPU/TPU run the same script on the real devices (``jax_num_cpu_devices`` only affects the CPU
backend; the grouped matmul is then ``ragged_dot``); there a step waits for the most-loaded
device, which ``computed max/mean`` predicts.
"""

from __future__ import annotations

import argparse
import time

import jax

jax.config.update("jax_num_cpu_devices", 8)  # before any device is touched; CPU only

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import functools  # noqa: E402

from experiments.benchmarks.expert_parallel import place  # noqa: E402
from experiments.benchmarks.timing import machine, write_json  # noqa: E402
from moejax import sharding  # noqa: E402
from moejax.model import llep  # noqa: E402
from moejax.model.dispatch import dispatch  # noqa: E402
from moejax.model.expert_parallel import pair_capacity  # noqa: E402
from moejax.schema import DispatchConfig  # noqa: E402

ROUTINGS = ("balanced", "zipf", "pattern", "adversarial")
BASELINE = "drop cf=2"


def make_inputs(tokens, seq, d, f, e, k, routing):
    keys = jax.random.split(jax.random.key(0), 8)
    g = tokens // seq
    x_gtd = jax.random.normal(keys[0], (g, seq, d))
    if routing == "balanced":
        logits_gte = jax.random.normal(keys[1], (g, seq, e))
    elif routing == "zipf":  # Gumbel top-k: sampling without replacement, p ~ 1 / rank^1.2
        logits_gte = jax.random.gumbel(keys[1], (g, seq, e)) - 1.2 * jnp.log(jnp.arange(1, e + 1))
    elif routing in ("pattern", "adversarial"):  # repeated tokens, embedded, through a linear router
        embed_vd = jax.random.normal(keys[6], (2, d))
        period = 2 if routing == "pattern" else 1
        x_gtd = embed_vd[jnp.arange(g * seq).reshape(g, seq) % period]
        logits_gte = x_gtd @ jax.random.normal(keys[7], (d, e))
    else:
        raise ValueError(f"routing must be one of {ROUTINGS}, got {routing!r}")
    w_gtk, idx_gtk = jax.lax.top_k(logits_gte, k)
    return (
        x_gtd, idx_gtk.astype(jnp.int32), jax.nn.softmax(w_gtk, axis=-1),
        jax.random.normal(keys[2], (e, d, f)) / d**0.5,
        jax.random.normal(keys[3], (e, d, f)) / d**0.5,
        jax.random.normal(keys[4], (e, f, d)) / f**0.5,
        jax.random.normal(keys[5], (g, seq, d)),  # output cotangent
    )


def variants(peers: int, tile_size: int) -> dict[str, dict]:
    common = dict(backend="expert_parallel", impl="auto", tile_size=tile_size)
    spill = dict(ep_balance="llep", ep_spill_slots=2, ep_spill_capacity_factor=1.0)
    return {
        BASELINE: dict(ep_comm="all_to_all", ep_capacity_factor=2.0, **common),
        "drop cf=2 gather": dict(ep_comm="all_gather", ep_capacity_factor=2.0, **common),
        f"drop cf={peers}": dict(ep_comm="all_to_all", ep_capacity_factor=float(peers), **common),
        "llep": dict(ep_comm="all_to_all", ep_capacity_factor=1.0, **spill, **common),
        "llep always": dict(ep_comm="all_gather", ep_capacity_factor=1.0, ep_llep_threshold=1.0, **spill, **common),
    }


def step_fn(**dispatch_kw):
    """Jitted (inputs) -> ((loss, (drop rate, llep engaged)), grads): forward and backward of the dispatch."""
    run = functools.partial(dispatch, cfg=DispatchConfig(**dispatch_kw))

    def loss(x_gtd, idx_gtk, w_gtk, w_gate_edf, w_up_edf, w_down_efd, cotangent_gtd):
        y_gtd, stats = run(x_gtd, idx_gtk, w_gtk, w_gate_edf, w_up_edf, w_down_efd)
        engaged = stats.get("llep_engaged", jnp.zeros((), jnp.float32))
        return jnp.sum(y_gtd * cotangent_gtd), (stats["drop_rate"], engaged)

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 2, 3, 4, 5), has_aux=True))


def device_loads(idx_gtk, spec: dict, peers: int, experts: int, engaged: bool) -> tuple[np.ndarray, np.ndarray]:
    """(asked, computed) assignments per device of the expert axis, on the host, by the documented
    rules: standard EP (and LLEP when it did not engage) keeps min(count, c) of each (source,
    destination) pair; LLEP follows its plan."""
    g, t, k = idx_gtk.shape
    e = experts // peers
    idx_pvk = np.asarray(idx_gtk).reshape(peers, g * t // peers, k)  # device i holds consecutive groups
    dest_pq = np.swapaxes(idx_pvk, 1, 2).reshape(peers, -1) // e  # choice-major, as the backend
    q = dest_pq.shape[1]
    asked_p = np.bincount(dest_pq.ravel(), minlength=peers)
    if spec.get("ep_balance", "drop") == "drop" or not engaged:
        c = pair_capacity(q, peers, spec["ep_capacity_factor"])
        counts_pp = np.stack([np.bincount(row, minlength=peers) for row in dest_pq])  # [source, dest]
        return asked_p, np.minimum(counts_pp, c).sum(axis=0)
    expert_w = np.swapaxes(idx_pvk, 1, 2).transpose(1, 0, 2).reshape(-1)  # (choice, device, token)
    the_plan = llep.plan(
        jnp.asarray(expert_w), peers=peers, local_experts=e,
        native_rows=llep.buffer_rows(q, peers, spec["ep_capacity_factor"]),
        spill_slots=spec["ep_spill_slots"], spill_rows=llep.buffer_rows(q, peers, spec["ep_spill_capacity_factor"]),
    )
    return asked_p, np.asarray(the_plan.load_p)


def measure(args, mesh) -> list[dict]:
    peers = mesh.shape["expert"]
    specs = variants(peers, args.tile_size)
    inputs = {r: make_inputs(args.tokens, args.seq, args.d_model, args.expert_dim, args.experts, args.top_k, r)
              for r in ROUTINGS}
    placed = {r: place(mesh, inputs[r]) for r in ROUTINGS}
    compiled, temp_bytes = {}, {}
    with jax.set_mesh(mesh):
        for name, kw in specs.items():
            compiled[name] = step_fn(**kw).lower(*placed[ROUTINGS[0]]).compile()
            temp_bytes[name] = compiled[name].memory_analysis().temp_size_in_bytes
            print(f"compiled {name}: temp {temp_bytes[name] / 2**20:.1f} MiB/device", flush=True)

    rows = []
    for routing in ROUTINGS:
        call = lambda name: compiled[name](*placed[routing])
        drop, engaged = {}, {}
        for name in specs:  # warm up
            (_, (drop[name], engaged[name])), _ = jax.block_until_ready(call(name))
        samples = {name: [] for name in specs}
        names = list(specs)
        for rnd in range(args.rounds):
            for name in names[rnd % len(names):] + names[:rnd % len(names)]:
                start = time.perf_counter()
                jax.block_until_ready(call(name))
                samples[name].append(time.perf_counter() - start)
        mean_load = args.tokens * args.top_k / peers
        by_name = {}
        for name, spec in specs.items():
            asked_p, computed_p = device_loads(inputs[routing][1], spec, peers, args.experts, bool(engaged[name]))
            by_name[name] = {
                "routing": routing, "variant": name, **spec, "median_s": float(np.median(samples[name])),
                "asked_max_over_mean": float(asked_p.max() / mean_load),
                "computed_max_over_mean": float(computed_p.max() / mean_load),
                "computed_per_device": computed_p.tolist(), "drop_rate": float(drop[name]),
                "llep_engaged": float(engaged[name]), "samples_s": samples[name],
                "temp_bytes_per_device": int(temp_bytes[name]),
            }
        base = by_name[BASELINE]
        for row in by_name.values():
            row["time_vs_drop"] = row["median_s"] / base["median_s"]
            row["temp_vs_drop"] = row["temp_bytes_per_device"] / base["temp_bytes_per_device"]
            row["max_load_vs_drop"] = row["computed_max_over_mean"] / base["computed_max_over_mean"]
            rows.append(row)
            print(f"{routing:11s} {row['variant']:16s} engaged {row['llep_engaged']:.0f}  asked max/mean {row['asked_max_over_mean']:5.2f}  computed "
                  f"max/mean {row['computed_max_over_mean']:5.2f}  drop {row['drop_rate']:.3f}  temp "
                  f"{row['temp_bytes_per_device'] / 2**20:6.1f} MiB  {row['median_s'] * 1e3:7.1f} ms  vs drop cf=2: "
                  f"time x{row['time_vs_drop']:.2f} temp x{row['temp_vs_drop']:.2f} "
                  f"max load x{row['max_load_vs_drop']:.2f}", flush=True)
    return rows


def markdown(rows: list[dict]) -> str:
    lines = [
        "| routing | variant | spilled | asked max/mean | computed max/mean | drop rate | temp MiB / device "
        "| ms / step | time vs drop cf=2 | temp vs drop cf=2 |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['routing']} | {r['variant']} | {'yes' if r['llep_engaged'] else 'no'} | {r['asked_max_over_mean']:.2f} | {r['computed_max_over_mean']:.2f} "
            f"| {r['drop_rate']:.3f} | {r['temp_bytes_per_device'] / 2**20:.1f} | {r['median_s'] * 1e3:.0f} "
            f"| {r['time_vs_drop']:.2f} | {r['temp_vs_drop']:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=5, help="timed calls per variant and routing, interleaved")
    p.add_argument("--tokens", type=int, default=4096, help="tokens per call (over all devices)")
    p.add_argument("--seq", type=int, default=256, help="tokens per group (sequence)")
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--expert-dim", type=int, default=512)
    p.add_argument("--experts", type=int, default=16)
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--tile-size", type=int, default=64)
    p.add_argument("--out", default="results/llep.json")
    args = p.parse_args()

    n = jax.device_count()
    mesh = sharding.make_mesh({"data": 1, "fsdp": 1, "expert": n, "tensor": 1})
    print(f"{jax.default_backend()} x {n}, mesh {dict(mesh.shape)}: {args.tokens} tokens, d={args.d_model}, "
          f"f={args.expert_dim}, {args.experts} experts, top-{args.top_k}; forward + backward", flush=True)
    before = machine()
    rows = measure(args, mesh)
    print(markdown(rows))
    pick = {(r["routing"], r["variant"]): r for r in rows}
    targets = {
        "balanced: llep time / drop cf=2 (target <= 1.1)": pick["balanced", "llep"]["time_vs_drop"],
        "balanced: llep always time / drop cf=2 (before the threshold)": pick["balanced", "llep always"]["time_vs_drop"],
        "adversarial: llep drop rate (target 0)": pick["adversarial", "llep"]["drop_rate"],
        "adversarial: llep temp / llep always temp": (pick["adversarial", "llep"]["temp_bytes_per_device"]
                                                      / pick["adversarial", "llep always"]["temp_bytes_per_device"]),
    }
    for what, value in targets.items():
        print(f"{what}: {value:.3f}")
    write_json(args.out, {"platform": jax.default_backend(), "devices": n, "mesh": dict(mesh.shape),
                          "machine_before": before, "machine_after": machine(), "args": vars(args),
                          "targets": targets, "rows": rows})


if __name__ == "__main__":
    main()
