"""Where a train step's time goes on CPU: the step, and each of its parts timed alone.

    python -m experiments.benchmarks.profile_step [--arch peer|tiny|small] [--backend dropless] [--rounds 7]

``small`` is experiments/configs/small_moe.py at the batch step_time.py uses on CPU (8 x 512, float32).

The parts are jitted on their own at the step's real shapes, forward and forward+backward
(``jax.value_and_grad`` of the sum of the output), and timed in interleaved rounds with the whole
step (medians; see :mod:`experiments.benchmarks.timing`), so their shares of the step are ratios
measured under the same load:

- ``step``: the jitted train step (forward, backward, AdamW, balancing and metric updates);
- ``fwd``: the loss alone; ``fwd_bwd``: loss and gradients, no optimizer; ``optimizer``: the
  AdamW update with clipping on gradient-shaped inputs;
- per layer, x the number of layers: ``attention`` (pre-norm + attention with its projections),
  ``moe`` (pre-norm + router + dispatch), and within the MoE ``experts`` (the grouped SwiGLU on
  already sorted rows), ``sort_unsort`` (the argsort, gather and unsort-combine around it) and
  ``router`` (pre-norm + router: logits, softmax, top-k); beside them ``dense_mlp``, the MoE
  layer's equal-FLOP dense counterpart (pre-norm + one SwiGLU of width top_k x expert_dim);
- ``head``: final norm, output projection and cross-entropy.

XLA fuses across part boundaries inside the real step, so the parts need not sum to the step;
the remainder is reported. Also prints the compiled step's FLOP count (XLA cost analysis) and
the matmul peak measured in the same process. Writes JSON (``--out``).
"""

from __future__ import annotations

import argparse
import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from experiments.benchmarks import peer_arch
from experiments.benchmarks.timing import interleaved, machine, matmul_peak_flops, write_json
from experiments.configs import small_moe
from moejax import checks, sharding
from moejax.config import default_config
from moejax.model import dispatch as dispatch_lib
from moejax.model.grouped_matmul import grouped_ffn
from moejax.model.layers import MLP, Attention, RMSNorm
from moejax.model.moe import MoE
from moejax.model.transformer import flops_per_token
from moejax.schema import IMPLS, MoEConfig
from moejax.train.state import init_state, setup
from moejax.train.step import forward_loss, make_train_step


def arch_config(arch: str, backend: str):
    """The config of ``arch``; ``backend="dense"``: the same model with every MoE layer a dense
    SwiGLU (for ``peer``, of the routed experts' active width: equal active FLOPs)."""
    if arch == "peer":
        return peer_arch.moejax_config("dropless", dense=True) if backend == "dense" else peer_arch.moejax_config(backend)
    if arch in ("tiny", "small"):
        c = default_config() if arch == "tiny" else small_moe.cpu_benchmark_config()
        if backend == "dense":
            c.model.first_k_dense = c.model.num_layers
        else:
            c.model.moe.backend = backend
        return c
    raise ValueError(f"--arch must be peer, tiny or small, got {arch!r}")


def random_batch(cfg, seed: int = 0) -> dict[str, jax.Array]:
    """One global batch [1, B, T] of uniformly random tokens, one document per row."""
    t = cfg.train
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, cfg.model.vocab_size, size=(1, t.global_batch_size, t.seq_len + 1), dtype=np.int32)
    shape = (1, t.global_batch_size, t.seq_len)
    return {
        "inputs": jnp.asarray(tokens[..., :-1]), "targets": jnp.asarray(tokens[..., 1:]),
        "segment_ids": jnp.ones(shape, jnp.int32),
        "positions": jnp.broadcast_to(jnp.arange(t.seq_len, dtype=jnp.int32), shape),
        "loss_mask": jnp.ones(shape, jnp.float32),
    }


def _fwd_and_grad(fn, *args):
    """(forward, forward+backward) jitted callables of ``sum(fn(*args))`` w.r.t. every arg."""
    loss = lambda *a: jnp.sum(jax.tree.leaves(fn(*a))[0])
    fwd = jax.jit(loss)
    grad = jax.jit(jax.value_and_grad(loss, argnums=tuple(range(len(args)))))
    return (lambda: jax.block_until_ready(fwd(*args))), (lambda: jax.block_until_ready(grad(*args)))


def part_fns(cfg) -> dict:
    """The parts of one layer and of the head, as timed callables (see the module docstring)."""
    m, t = cfg.model, cfg.train
    b, s, d = t.global_batch_size, t.seq_len, m.d_model
    rngs = nnx.Rngs(0)
    x_btd = jax.random.normal(jax.random.key(1), (b, s, d), jnp.float32)
    positions_bt = jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32), (b, s))
    segments_bt = jnp.ones((b, s), jnp.int32)
    fns = {}

    norm, attn = RMSNorm(d, m.norm_eps, jnp.float32), Attention(m, out_std=0.02, rngs=rngs, dtype=jnp.float32, param_dtype=jnp.float32)
    gdef, params = nnx.split((norm, attn))

    def attention(params, x_btd):
        norm, attn = nnx.merge(gdef, params)
        return attn(norm(x_btd), positions_bt, segments_bt)

    fns["attention/fwd"], fns["attention/fwd_bwd"] = _fwd_and_grad(attention, params, x_btd)
    if m.first_k_dense >= m.num_layers:  # the dense model: its MLP is timed in the trace breakdown
        return fns | head_fns(cfg, norm, x_btd)

    moe = MoE(d, MoEConfig.from_config(m.moe), std=m.init_std, out_std=0.02, rngs=rngs, dtype=jnp.float32,
              param_dtype=jnp.float32)
    gdef_moe, params_moe = nnx.split((norm, moe))

    # The equal-FLOP dense layer: one SwiGLU of the routed experts' active width (top_k x expert_dim).
    width = m.moe.experts_per_token * m.moe.expert_dim
    mlp = MLP(d, width, std=m.init_std, out_std=0.02, rngs=rngs, dtype=jnp.float32, param_dtype=jnp.float32)
    gdef_mlp, params_mlp = nnx.split((norm, mlp))

    def dense_block(params, x_btd):
        norm, mlp = nnx.merge(gdef_mlp, params)
        return mlp(norm(x_btd))

    fns["dense_mlp/fwd"], fns["dense_mlp/fwd_bwd"] = _fwd_and_grad(dense_block, params_mlp, x_btd)
    gdef_router, params_router = nnx.split((norm, moe.router))

    def router_block(params, x_btd):
        norm, router = nnx.merge(gdef_router, params)
        r = router(norm(x_btd))
        return jnp.sum(r.weight_btk) + jnp.sum(r.probs_bte)

    fns["router/fwd"], fns["router/fwd_bwd"] = _fwd_and_grad(router_block, params_router, x_btd)

    def moe_block(params, x_btd):
        norm, moe = nnx.merge(gdef_moe, params)
        return moe(norm(x_btd))[0]

    fns["moe/fwd"], fns["moe/fwd_bwd"] = _fwd_and_grad(moe_block, params_moe, x_btd)

    # The experts alone, on rows already sorted by expert, with the routing a fresh router gives.
    routing = moe.router(norm(x_btd))
    idx_a = routing.idx_btk.reshape(-1)
    order_m = jnp.argsort(idx_a, stable=True)
    x_md = x_btd.reshape(b * s, d)[order_m // m.moe.experts_per_token]
    sizes_e = jnp.bincount(idx_a, length=m.moe.num_experts).astype(jnp.int32)
    w = (moe.w_gate_edf[...], moe.w_up_edf[...], moe.w_down_efd[...])
    impl, ts = m.moe.grouped_matmul, m.moe.tile_size

    if m.moe.backend == "dropless":
        # Integer inputs travel as float arguments (zero gradient), not closure constants, so XLA
        # cannot constant-fold the group sizes or the sort out of the timed program.
        as_int = lambda a: jax.lax.stop_gradient(a).astype(jnp.int32)
        experts = lambda x_md, wg, wu, wd, sizes_e: grouped_ffn(x_md, wg, wu, wd, as_int(sizes_e), impl=impl, tile_size=ts)
        fns["experts/fwd"], fns["experts/fwd_bwd"] = _fwd_and_grad(experts, x_md, *w, sizes_e.astype(jnp.float32))

        # Sort, gather, unsort and combine around an identity "expert": the dispatch's data movement.
        def sort_unsort(x_btd, w_btk, idx_btk):
            ident = lambda x_md, *_, **__: x_md
            orig, dispatch_lib.grouped_ffn = dispatch_lib.grouped_ffn, ident
            try:
                return dispatch_lib.dropless_dispatch(x_btd, as_int(idx_btk), w_btk, *w, impl, ts)[0]
            finally:
                dispatch_lib.grouped_ffn = orig

        fns["sort_unsort/fwd"], fns["sort_unsort/fwd_bwd"] = _fwd_and_grad(
            sort_unsort, x_btd, routing.weight_btk, routing.idx_btk.astype(jnp.float32))
    return fns | head_fns(cfg, norm, x_btd)


def impl_moe_fns(cfg, impl: str) -> dict:
    """The ``moe`` part (pre-norm + router + dispatch + experts + combine) with
    ``model.moe.grouped_matmul = impl``, as ``moe[impl]/fwd`` and ``moe[impl]/fwd_bwd``: the same
    weights and input as ``moe`` (the same seeds), so implementations compare in one run."""
    m, t = cfg.model, cfg.train
    b, s, d = t.global_batch_size, t.seq_len, m.d_model
    rngs = nnx.Rngs(0)
    x_btd = jax.random.normal(jax.random.key(1), (b, s, d), jnp.float32)
    norm = RMSNorm(d, m.norm_eps, jnp.float32)
    Attention(m, out_std=0.02, rngs=rngs, dtype=jnp.float32, param_dtype=jnp.float32)  # keep the rng stream of part_fns
    moe_cfg = MoEConfig.from_config(m.moe)
    moe_cfg = dataclasses.replace(moe_cfg, dispatch=dataclasses.replace(moe_cfg.dispatch, impl=impl))
    moe = MoE(d, moe_cfg, std=m.init_std, out_std=0.02, rngs=rngs, dtype=jnp.float32, param_dtype=jnp.float32)
    gdef_moe, params_moe = nnx.split((norm, moe))

    def moe_block(params, x_btd):
        norm, moe = nnx.merge(gdef_moe, params)
        return moe(norm(x_btd))[0]

    fwd, fwd_bwd = _fwd_and_grad(moe_block, params_moe, x_btd)
    return {f"moe[{impl}]/fwd": fwd, f"moe[{impl}]/fwd_bwd": fwd_bwd}


def head_fns(cfg, norm, x_btd) -> dict:
    """Final norm, output projection and cross-entropy, timed fwd and fwd+bwd."""
    m, t = cfg.model, cfg.train
    b, s, d = t.global_batch_size, t.seq_len, m.d_model
    fns = {}
    head_vd = jax.random.normal(jax.random.key(2), (d, m.vocab_size), jnp.float32) * 0.02
    targets_bt = jax.random.randint(jax.random.key(3), (b, s), 0, m.vocab_size)

    def head(x_btd, head_dv):
        logits = jnp.einsum("btd,dv->btv", norm(x_btd), head_dv)
        return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, targets_bt))

    fns["head/fwd"], fns["head/fwd_bwd"] = _fwd_and_grad(head, x_btd, head_vd)
    return fns


def profile(cfg, rounds: int, trace: bool = True, parts_only: bool = False, impls: tuple[str, ...] = ()) -> dict:
    """``parts_only``: time only the layer parts (no step, no trace), interleaved in one run; with
    ``impls``, the MoE layer once more per grouped matmul implementation (``moe[impl]/...``)."""
    if parts_only:
        fns = part_fns(cfg)
        for impl in impls:
            fns |= impl_moe_fns(cfg, impl)
        secs = interleaved(fns, rounds)
        return {"seconds": secs, "layers": cfg.model.num_layers}
    mesh = sharding.make_mesh(checks.validate(cfg, 1))
    run = setup(cfg, mesh)
    state = init_state(cfg, run)
    step = make_train_step(cfg, run)
    batch = random_batch(cfg)
    micro = jax.tree.map(lambda x: x[0], batch)
    loss_fn = lambda p, bal: forward_loss(
        p, bal, micro, graphdef=run.graphdef, balancer=run.balancer, logits_z_loss=cfg.model.logits_z_loss
    )[0]
    fwd = jax.jit(loss_fn)
    fwd_bwd = jax.jit(jax.grad(loss_fn))
    # The step donates its state: the other parts get their own copies.
    params, balance, opt_state = jax.tree.map(jnp.copy, (state["params"], state["balance"], state["opt_state"]))
    grads = jax.tree.map(jnp.ones_like, params)

    @jax.jit
    def optimizer(grads, opt_state, params):
        updates, opt_state = run.optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    holder = {"state": state}

    def run_step():
        holder["state"], metrics = step(holder["state"], batch)
        jax.block_until_ready(metrics)

    with jax.set_mesh(mesh):
        compiled = step.lower(state, batch).compile()
        cost = compiled.cost_analysis()
        cost = cost[0] if isinstance(cost, (list, tuple)) else cost
        fns = {
            "step": run_step,
            "fwd": lambda: jax.block_until_ready(fwd(params, balance)),
            "fwd_bwd": lambda: jax.block_until_ready(fwd_bwd(params, balance)),
            "optimizer": lambda: jax.block_until_ready(optimizer(grads, opt_state, params)),
            **part_fns(cfg),
        }
        secs = interleaved(fns, rounds)
        parts, extra = trace_breakdown(step, holder["state"], batch) if trace else ({}, {})
    peak = matmul_peak_flops()
    t = cfg.train
    tokens = t.global_batch_size * t.seq_len
    return {
        "seconds": secs, "tokens_per_sec": tokens / secs["step"],
        "model_flops_per_step": flops_per_token(cfg.model, t.seq_len) * tokens,
        "xla_flops_per_step": float(cost.get("flops", float("nan"))), "matmul_peak_flops": peak,
        "layers": cfg.model.num_layers, "trace_ms_per_step": parts, "trace_top_ops_ms": extra.get("top_ops", {}),
    }


def print_table(result: dict) -> None:
    secs, layers = result["seconds"], result["layers"]
    step = secs["step"]
    print(f"step {step * 1e3:.1f} ms = {result['tokens_per_sec']:.0f} tokens/s; "
          f"model FLOPs {result['model_flops_per_step'] / 1e9:.2f} G/step "
          f"(XLA counts {result['xla_flops_per_step'] / 1e9:.2f} G) -> "
          f"{result['model_flops_per_step'] / step / 1e9:.1f} GFLOP/s = "
          f"{result['model_flops_per_step'] / step / result['matmul_peak_flops']:.0%} of the "
          f"{result['matmul_peak_flops'] / 1e9:.0f} GFLOP/s matmul peak")
    print(f"{'part':28s} {'ms':>9s} {'x count':>8s} {'share of step':>14s}")
    counts = {"attention": layers, "moe": layers, "experts": layers, "sort_unsort": layers, "dense_mlp": layers,
              "router": layers, "head": 1}
    for name, s in secs.items():
        count = counts.get(name.split("/")[0], 1)
        print(f"{name:28s} {s * 1e3:9.2f} {count:8d} {count * s / step:14.0%}")
    if result["trace_ms_per_step"]:
        print_breakdown(result["trace_ms_per_step"])


# --- per-op breakdown from a jax.profiler trace -------------------------------------------------

# Innermost moejax/optax function of an op's stack -> the part of the step it belongs to.
PART_OF_FUNCTION = (
    ("row_tile_loop", "experts: tile loop (tiled, hybrid overflow)"),
    ("swiglu", "experts: SwiGLU"),
    ("_hybrid", "experts: hybrid gathers and batched part"),
    ("grouped_ffn", "experts: SwiGLU activation"),
    ("grouped_matmul", "experts: grouped matmul"),
    ("dropless_dispatch", "dispatch: sort, gather, unsort, combine"),
    ("capacity_dispatch", "dispatch: capacity one-hot einsums"),
    ("_swiglu_gecd", "experts: capacity SwiGLU einsums"),
    ("Router", "router"),
    ("balanc", "balancing losses/state"),
    ("switch", "balancing losses/state"),
    ("expert_load", "routing statistics"),
    ("routing_entropy", "routing statistics"),
    ("rope", "attention: RoPE"),
    ("causal_attention", "attention: softmax(QK)V"),
    ("dot_product_attention", "attention: softmax(QK)V"),
    ("Attention", "attention: projections, mask, softmax(QK)V"),
    ("RMSNorm", "RMSNorm"),
    ("MLP", "dense MLP"),
    ("Transformer.logits", "head: output projection"),
    ("Transformer.embed", "embedding"),
    ("softmax_cross_entropy", "loss: cross-entropy"),
    ("forward_loss", "loss: cross-entropy"),
    ("adam", "optimizer: AdamW"),
    ("scale_by", "optimizer: AdamW"),
    ("clip", "optimizer: clipping and norm"),
    ("tree_norm", "optimizer: clipping and norm"),
    ("norm", "optimizer: clipping and norm"),
    ("apply_updates", "optimizer: AdamW"),
    ("routing_health", "routing statistics"),
    ("global_load", "routing statistics"),
    ("train_step", "step: non-finite guard, accumulation, metrics"),
)


def _stack_functions(hlo_text: str) -> dict[str, list[str]]:
    """HLO instruction name -> the function names of its stack, innermost first."""
    import re

    sections, current = {"FunctionNames": {}, "FileLocations": {}, "StackFrames": {}}, None
    for line in hlo_text.splitlines():
        if line in sections:
            current = line
            continue
        if current and not line.strip():
            current = None
            continue
        if current:
            key, _, rest = line.partition(" ")
            sections[current][int(key)] = rest
    funcs = {k: v.strip('"') for k, v in sections["FunctionNames"].items()}
    loc_func = {k: funcs[int(re.search(r"function_name_id=(\d+)", v).group(1))]
                for k, v in sections["FileLocations"].items()}
    frames = {}
    for k, v in sections["StackFrames"].items():
        loc, parent = (int(x) for x in re.findall(r"=(\d+)", v))
        frames[k] = (loc_func[loc], parent)

    def chain(frame_id: int) -> list[str]:
        out, seen = [], set()
        while frame_id in frames and frame_id not in seen:
            seen.add(frame_id)
            name, parent = frames[frame_id]
            out.append(name)
            frame_id = parent
        return out

    ops = {}
    for m in re.finditer(r"^\s*(?:ROOT )?%?([\w.\-]+) = .*?metadata=\{op_name=\"([^\"]*)\"(?: stack_frame_id=(\d+))?",
                         hlo_text, re.M):
        name, op_name, frame = m.group(1), m.group(2), m.group(3)
        ops[name] = (op_name, chain(int(frame)) if frame else [])
    return ops


def part_of(op_name: str, functions: list[str]) -> str:
    direction = "bwd" if "transpose(" in op_name else "fwd"
    for func in functions:
        for key, part in PART_OF_FUNCTION:
            if key in func:
                if part.startswith(("optimizer", "step", "routing statistics")):
                    return part
                return f"{part} [{direction}]"
    return f"other [{direction}]"


def trace_breakdown(step, state, batch, steps: int = 2) -> tuple[dict[str, float], dict]:
    """Thread-summed milliseconds per step of each part, from a ``jax.profiler`` trace of the
    compiled step's ops (loops are not counted themselves, only the ops inside them)."""
    import collections
    import glob
    import tempfile

    hlo = step.lower(state, batch).compile().as_text()
    ops = _stack_functions(hlo)
    for _ in range(2):
        state, metrics = step(state, batch)
        jax.block_until_ready(metrics)
    with tempfile.TemporaryDirectory() as tmp:
        jax.profiler.start_trace(tmp)
        for _ in range(steps):
            state, metrics = step(state, batch)
            jax.block_until_ready(metrics)
        jax.profiler.stop_trace()
        path = sorted(glob.glob(f"{tmp}/**/*.xplane.pb", recursive=True))[-1]
        data = jax.profiler.ProfileData.from_file(path)
        totals, op_totals = collections.Counter(), collections.Counter()
        for plane in data.planes:
            for line in plane.lines:
                for event in line.events:
                    stats = dict(event.stats)
                    name = stats.get("hlo_op")
                    if name is None or not str(stats.get("hlo_module", "")).startswith("jit_train_step"):
                        continue
                    if name.startswith(("while", "conditional", "call")):
                        continue  # containers: their bodies' ops are counted
                    op_name, functions = ops.get(name, ("", []))
                    part = part_of(op_name, functions)
                    totals[part] += event.duration_ns / 1e6 / steps
                    op_totals[f"{part} | {name} | {op_name.split('/')[-1]}"] += event.duration_ns / 1e6 / steps
    return dict(totals.most_common()), {"state": state, "top_ops": dict(op_totals.most_common(40))}


def print_breakdown(parts: dict[str, float]) -> None:
    total = sum(parts.values())
    print(f"per-op trace, thread-summed {total:.0f} ms per step:")
    for part, ms in parts.items():
        print(f"  {part:52s} {ms:9.1f} ms {ms / total:6.1%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", default="peer", choices=("peer", "tiny", "small"))
    parser.add_argument("--backend", default="dropless",
                        help="dropless | capacity | dense (the equal-FLOP dense model), or several, comma-separated: "
                             "each profiled in turn in one process, then their steps timed against each other interleaved")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--no-trace", action="store_true", help="skip the per-op profiler trace")
    parser.add_argument("--parts-only", action="store_true",
                        help="time only the layer parts (MoE pieces and the equal-FLOP dense SwiGLU) in one interleaved run")
    parser.add_argument("--grouped-matmul", default="",
                        help="with --parts-only: comma-separated model.moe.grouped_matmul values (e.g. tiled,hybrid), "
                             "each timing the MoE layer once more as moe[impl] in the same interleaved run")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    impls = tuple(i for i in args.grouped_matmul.split(",") if i)
    bad_impl = [i for i in impls if i not in IMPLS]
    if bad_impl:
        parser.error(f"--grouped-matmul {args.grouped_matmul!r}: {bad_impl[0]!r} is not one of {', '.join(IMPLS)}")
    if impls and not args.parts_only:
        parser.error("--grouped-matmul needs --parts-only (the whole step takes the config's value)")
    backends = args.backend.split(",")
    bad = [b for b in backends if b not in ("dropless", "capacity", "dense")]
    if bad:
        parser.error(f"--backend {args.backend!r}: {bad[0]!r} is not one of dropless, capacity, dense")
    if args.parts_only:
        result = profile(arch_config(args.arch, backends[0]), args.rounds, parts_only=True, impls=impls)
        result.update(arch=args.arch, backend=backends[0], machine={**machine(), "uptime": os.popen("uptime").read().strip()})
        dense = result["seconds"].get("dense_mlp/fwd_bwd")
        for name, s in result["seconds"].items():
            print(f"{name:24s} {s * 1e3:9.2f} ms" + (f"  x{s / dense:.2f} of dense_mlp/fwd_bwd" if dense else ""))
        write_json(args.out or f"results/profile_parts_{args.arch}_{backends[0]}.json", result)
        return
    results = {}
    for backend in backends:
        result = profile(arch_config(args.arch, backend), args.rounds, trace=not args.no_trace)
        result.update(arch=args.arch, backend=backend, machine={**machine(), "uptime": os.popen("uptime").read().strip()})
        print(f"== {args.arch} {backend}")
        print_table(result)
        results[backend] = result
    if len(backends) == 1:
        write_json(args.out or f"results/profile_{args.arch}_{backends[0]}.json", results[backends[0]])
        return
    steps = interleaved_steps({b: arch_config(args.arch, b) for b in backends}, args.rounds)
    print("steps timed against each other, interleaved: " + ", ".join(
        f"{b} {s * 1e3:.0f} ms (x{s / steps[backends[-1]]:.2f} of {backends[-1]})" for b, s in steps.items()))
    write_json(args.out or f"results/profile_{args.arch}_{'_'.join(backends)}.json",
               {"parts": results, "steps_interleaved_s": steps,
                "machine": {**machine(), "uptime": os.popen("uptime").read().strip()}})


def interleaved_steps(cfgs: dict, rounds: int) -> dict[str, float]:
    """Median seconds per train step of each config, timed in interleaved rounds."""
    fns = {}
    for name, cfg in cfgs.items():
        run = setup(cfg, sharding.make_mesh(checks.validate(cfg, 1)))
        step, holder, batch = make_train_step(cfg, run), {"state": init_state(cfg, run)}, random_batch(cfg)

        def run_step(step=step, holder=holder, batch=batch):
            holder["state"], metrics = step(holder["state"], batch)
            jax.block_until_ready(metrics)

        fns[name] = run_step
    return interleaved(fns, rounds)


if __name__ == "__main__":
    main()
