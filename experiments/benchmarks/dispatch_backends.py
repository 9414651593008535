"""MoE layer forward+backward per dispatch backend, against a dense SwiGLU of equal active FLOPs and
against computing every expert for every token.

    python -m experiments.benchmarks.dispatch_backends [--experts 64 --top-k 4] [--out ...]

One MoE layer's experts (router output fixed: a fresh router's top-k on random tokens, so the
groups are of random size like at the start of training), ``jax.value_and_grad`` of the sum of
the output with respect to the tokens and all expert weights, timed in interleaved rounds
(medians, :mod:`experiments.benchmarks.timing`). Candidates:

- ``dropless_hybrid``: sort + each expert's first even-share rows batched, the rest tiled (the CPU
  default from 256 rows per expert);
- ``dropless_tiled``: sort + a loop over 64-row tiles of each expert's rows, SwiGLU per tile (the
  CPU default under 256 rows per expert, as here with the defaults: 128);
- ``dropless_ragged``: sort + ``jax.lax.ragged_dot`` (the GPU/TPU default; dense on XLA:CPU);
- ``capacity``: GShard one-hot dispatch, capacity factor 1.25 (drops tokens);
- ``dense_equal_active``: a dense SwiGLU of width top_k * expert_dim (the same active FLOPs);
- ``all_experts_dense``: every expert on every token, combined by the (mostly zero) routing
  weights: what an MoE costs without any dispatch.

Expert-parallel dispatch needs a mesh of devices: ``experiments/benchmarks/expert_parallel.py``.
Ratios are to ``all_experts_dense`` (how much dispatch saves) and to ``dense_equal_active`` (how
close to a dense model of the same active FLOPs).
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp

from experiments.benchmarks.timing import interleaved, machine, matmul_peak_flops, write_json
from moejax.model.dispatch import dispatch
from moejax.schema import DispatchConfig


def candidates(b, t, d, e, k, f, seed=0):
    keys = jax.random.split(jax.random.key(seed), 6)
    x_btd = jax.random.normal(keys[0], (b, t, d), jnp.float32)
    logits = jax.random.normal(keys[1], (b, t, e))
    top_w, idx_btk = jax.lax.top_k(jax.nn.softmax(logits), k)
    w_btk = top_w / jnp.sum(top_w, -1, keepdims=True)
    scale = d**-0.5
    w = (jax.random.normal(keys[2], (e, d, f)) * scale, jax.random.normal(keys[3], (e, d, f)) * scale,
         jax.random.normal(keys[4], (e, f, d)) * f**-0.5)
    dense_w = (w[0][:k].transpose(1, 0, 2).reshape(d, k * f), w[1][:k].transpose(1, 0, 2).reshape(d, k * f),
               w[2][:k].reshape(k * f, d))

    def backend(name, impl="auto"):
        return lambda x, wg, wu, wd: dispatch(x, idx_btk, w_btk, wg, wu, wd, cfg=DispatchConfig(backend=name, impl=impl))[0]

    def dense(x, wg, wu, wd):
        return (jax.nn.silu(x @ wg) * (x @ wu)) @ wd

    def all_experts(x, wg, wu, wd):
        gates_bte = jnp.sum(jax.nn.one_hot(idx_btk, e) * w_btk[..., None], axis=2)
        h = jax.nn.silu(jnp.einsum("btd,edf->btef", x, wg)) * jnp.einsum("btd,edf->btef", x, wu)
        return jnp.einsum("btef,efd,bte->btd", h, wd, gates_bte)

    fns = {
        "dropless_hybrid": (backend("dropless", "hybrid"), w),
        "dropless_tiled": (backend("dropless", "tiled"), w),
        "dropless_ragged": (backend("dropless", "ragged"), w),
        "capacity": (backend("capacity"), w),
        "dense_equal_active": (dense, dense_w),
        "all_experts_dense": (all_experts, w),
    }
    out = {}
    for name, (fn, weights) in fns.items():
        grad = jax.jit(jax.value_and_grad(lambda x, *ws, fn=fn: jnp.sum(fn(x, *ws)), argnums=(0, 1, 2, 3)))
        out[name] = lambda grad=grad, weights=weights: jax.block_until_ready(grad(x_btd, *weights))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--experts", type=int, default=64)
    parser.add_argument("--top-k", type=int, default=4)
    parser.add_argument("--expert-dim", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--skip", default="", help="comma-separated candidates to leave out")
    parser.add_argument("--out", default="results/dispatch_backends.json")
    args = parser.parse_args()
    b, t, d, e, k, f = args.batch, args.seq, args.d_model, args.experts, args.top_k, args.expert_dim
    fns = {n: fn for n, fn in candidates(b, t, d, e, k, f).items() if n not in args.skip.split(",")}
    secs = interleaved(fns, args.rounds)
    peak = matmul_peak_flops()
    active_flops = 3 * 2 * 3 * b * t * d * k * f  # fwd + bwd of three matmuls over the active experts
    print(f"MoE layer fwd+bwd, {b}x{t} tokens, d={d}, {e} experts top-{k} of width {f}; "
          f"matmul peak {peak / 1e9:.0f} GFLOP/s")
    print(f"{'candidate':20s} {'ms':>8s} {'active GFLOP/s':>15s} {'x all-dense':>12s} {'x dense-equal':>14s}")
    rows = []
    for name, s in secs.items():
        row = {"candidate": name, "seconds": s, "active_gflops": active_flops / s / 1e9,
               "speedup_vs_all_experts_dense": secs["all_experts_dense"] / s if "all_experts_dense" in secs else None,
               "speedup_vs_dense_equal_active": secs["dense_equal_active"] / s if "dense_equal_active" in secs else None}
        rows.append(row)
        fmt = lambda v: f"{v:.2f}" if v is not None else "-"
        print(f"{name:20s} {s * 1e3:8.1f} {row['active_gflops']:15.1f} "
              f"{fmt(row['speedup_vs_all_experts_dense']):>12s} {fmt(row['speedup_vs_dense_equal_active']):>14s}")
    write_json(args.out, {"rows": rows, "shape": dict(batch=b, seq=t, d_model=d, experts=e, top_k=k, expert_dim=f),
                          "matmul_peak_flops": peak, "machine": machine()})


if __name__ == "__main__":
    main()
