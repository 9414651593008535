"""Train-step cost of a Large Lookup Layer vs a dense SwiGLU layer of equal active FLOPs per token.

    python -m experiments.benchmarks.l3_step [--rounds 20] [--vocab 8192] [--rows-per-token 8]
        [--max-rows 16] [--out results/l3_step.json]

One process builds three train steps (``moejax.train.step.make_train_step``, the real one) for
the same small dense model (d_model 256, 4 layers, 8 x 256 tokens on CPU): ``base``, the model
alone, and two variants with one layer inserted after layer 1:

- ``l3``: an L3 layer (untied d_k = d_v = d_up = d_model, concat output, uniform allocation of
  ``rows_per_token`` rows per token, k = ``max_rows`` slots gathered per token);
- ``dense``: ``x + SwiGLU(RMSNorm(x))`` with hidden width f chosen so that its forward FLOPs per
  token, 6 d f, equal the L3 layer's: ``l3_forward_flops`` = 2 k (d_k + d_v) (scores and the
  weighted value sum over all k slots, masked or not) + 2 x (W_up + W_out + W_skip parameters).
  Both therefore do the same matmul FLOPs; what differs is the L3 layer's memory traffic (the
  gathered [B, T, k, d] rows, the scatter-add of their gradients into the tables) and the
  optimizer's update of the whole tables every step.

All compile first (excluded), then run interleaved, one step of each per round in an order
rotated from round to round, so the load of a shared machine hits all alike. Reported: median
step time, tokens/s, the ratio l3/dense of tokens/s (median of per-round ratios; target >= 0.8),
the inserted layer's own time (median per-round step time minus base's) for l3 and dense,
compiled temp memory and argument (state) memory from ``compiled.memory_analysis()``, and
parameter counts. Tokens are uniform random ids (the cost does not depend on which ids appear).
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import time
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from experiments.benchmarks.timing import write_json
from moejax import checks, config as config_lib, sharding
from moejax.model.l3 import l3_forward_flops
from moejax.model.layers import MLP, RMSNorm
from moejax.train import state as state_lib
from moejax.train.state import init_state, setup, to_global
from moejax.train.step import make_train_step


def base_config(args):
    cfg = config_lib.default_config()
    t, m, l3 = cfg.train, cfg.model, cfg.model.l3
    t.global_batch_size, t.seq_len, t.steps = args.batch, args.seq, 1000
    m.vocab_size, m.d_model, m.num_layers, m.first_k_dense, m.mlp_dim = args.vocab, 256, 4, 4, 1024
    m.num_heads, m.num_kv_heads, m.head_dim = 4, 2, 64
    l3.after_layers, l3.budget, l3.max_rows = (1,), args.vocab * args.rows_per_token, args.max_rows
    cfg.mesh.data = 1
    return cfg


class ResidualMLP(nnx.Module):
    """``x + SwiGLU(RMSNorm(x))``, called like an L3 layer (the token ids go unused)."""

    def __init__(self, cfg, mlp_dim: int, rngs: nnx.Rngs):
        out_std = cfg.init_std / math.sqrt(2 * cfg.num_layers)
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps, jnp.float32)
        self.mlp = MLP(cfg.d_model, mlp_dim, std=cfg.init_std, out_std=out_std, rngs=rngs,
                       dtype=jnp.float32, param_dtype=jnp.float32)

    def __call__(self, x_btd, tokens_bt):
        return x_btd + self.mlp(self.norm(x_btd))


def build(cfg, kind: str, dense_mlp_dim: int):
    """(run, state, jitted step) of the ``kind`` variant: base (no inserted layer), l3, or dense
    (the L3 layer replaced by a ResidualMLP of width ``dense_mlp_dim``)."""
    cfg = copy.deepcopy(cfg)
    if kind == "base":
        cfg.model.l3.after_layers = ()
    make_model = state_lib.make_model

    def with_dense_layer(cfg, seed, l3_offsets=None):
        model = make_model(cfg, seed, l3_offsets)
        model.l3[0] = ResidualMLP(cfg.model, dense_mlp_dim, nnx.Rngs(seed + 1))
        return model

    devices = jax.devices()[:1]
    mesh = sharding.make_mesh(checks.validate(cfg, len(devices)), devices)
    with mock.patch.object(state_lib, "make_model", with_dense_layer if kind == "dense" else make_model):
        run = setup(cfg, mesh)
        state = init_state(cfg, run)
    return run, state, make_train_step(cfg, run)


def random_batch(cfg, rng) -> dict:
    b, s = cfg.train.global_batch_size, cfg.train.seq_len
    tokens = rng.integers(0, cfg.model.vocab_size, (b, s + 1)).astype(np.int32)
    return {"inputs": tokens[:, :-1], "targets": tokens[:, 1:], "segment_ids": np.ones((b, s), np.int32),
            "positions": np.broadcast_to(np.arange(s, dtype=np.int32), (b, s)).copy(),
            "loss_mask": np.ones((b, s), np.float32)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=20, help="timed steps per variant, interleaved")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--rows-per-token", type=int, default=8, help="budget v = vocab x this (uniform allocation)")
    p.add_argument("--max-rows", type=int, default=16, help="k: row slots gathered per token")
    p.add_argument("--out", default="results/l3_step.json")
    args = p.parse_args()

    cfg = base_config(args)
    d = cfg.model.d_model
    l3_flops = l3_forward_flops(cfg.model)
    mlp_dim = round(l3_flops / (6 * d))
    variants = {kind: build(cfg, kind, mlp_dim) for kind in ("base", "dense", "l3")}
    rng = np.random.default_rng(0)
    rows, times = {}, {name: [] for name in variants}
    for name, (run, state, step) in variants.items():
        batch = to_global(random_batch(cfg, rng), run.batch_sharding(True), 1)
        with jax.set_mesh(run.mesh):
            compiled = step.lower(state, batch).compile()
            start = time.perf_counter()
            state, metrics = step(state, batch)
            jax.block_until_ready(metrics)
        memory = compiled.memory_analysis()
        params = sum(x.size for x in jax.tree.leaves(state["params"]))
        rows[name] = {"params": int(params), "temp_bytes": int(memory.temp_size_in_bytes),
                      "argument_bytes": int(memory.argument_size_in_bytes),
                      "first_step_s": time.perf_counter() - start}
        variants[name] = (run, state, step)
    batches = [random_batch(cfg, rng) for _ in range(4)]
    for i in range(args.rounds):
        names = list(variants)
        order = names[i % len(names):] + names[:i % len(names)]
        for name in order:
            run, state, step = variants[name]
            batch = to_global(batches[i % len(batches)], run.batch_sharding(True), 1)
            with jax.set_mesh(run.mesh):
                start = time.perf_counter()
                state, metrics = step(state, batch)
                jax.block_until_ready(metrics)
            times[name].append(time.perf_counter() - start)
            variants[name] = (run, state, step)
    tokens = cfg.train.global_batch_size * cfg.train.seq_len
    for name, row in rows.items():
        row["step_time_s"] = float(np.median(times[name]))
        row["tokens_per_sec"] = tokens / row["step_time_s"]
    times = {name: np.array(values) for name, values in times.items()}
    ratio = float(np.median(times["dense"] / times["l3"]))
    for name in ("dense", "l3"):
        rows[name]["layer_time_s"] = float(np.median(times[name] - times["base"]))
    l3 = cfg.model.l3
    result = {
        "platform": jax.default_backend(), "devices": 1, "cpu_count": os.cpu_count(), "rounds": args.rounds,
        "batch": cfg.train.global_batch_size, "seq_len": cfg.train.seq_len, "vocab": cfg.model.vocab_size,
        "d_model": d, "l3_budget": l3.budget, "l3_max_rows": l3.max_rows, "l3_forward_flops_per_token": l3_flops,
        "dense_mlp_dim": mlp_dim, "dense_forward_flops_per_token": 6.0 * d * mlp_dim,
        "variants": rows, "l3_over_dense_tokens_per_sec": ratio, "target": 0.8,
    }
    print(f"{jax.default_backend()}, batch {cfg.train.global_batch_size}x{cfg.train.seq_len}, vocab "
          f"{cfg.model.vocab_size}, L3 v={l3.budget} k={l3.max_rows} ({l3_flops / 1e3:.0f} kFLOP/token fwd) vs "
          f"SwiGLU f={mlp_dim} ({6 * d * mlp_dim / 1e3:.0f} kFLOP/token fwd); median of {args.rounds} rounds")
    print(f"{'variant':8s} {'params':>10s} {'step ms':>9s} {'layer ms':>9s} {'tokens/s':>10s} {'temp MiB':>9s} "
          f"{'state MiB':>10s}")
    for name, row in rows.items():
        layer = f"{row['layer_time_s'] * 1e3:9.1f}" if "layer_time_s" in row else f"{'-':>9s}"
        print(f"{name:8s} {row['params']:10,d} {row['step_time_s'] * 1e3:9.1f} {layer} {row['tokens_per_sec']:10.0f} "
              f"{row['temp_bytes'] / 2**20:9.1f} {row['argument_bytes'] / 2**20:10.1f}")
    print(f"l3 / dense tokens/s: {ratio:.3f} (target >= 0.8)")
    write_json(args.out, result)


if __name__ == "__main__":
    main()
