"""The MoE block: router, routed experts through a dispatch backend, optional shared experts."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from moejax.model.dispatch import dispatch
from moejax.model.layers import MLP, param
from moejax.model.router import Router, expert_load, switch_aux_loss, z_loss


class MoE(nnx.Module):
    """y = routed_scaling * sum_k w_k Expert_{i_k}(x) + SharedExperts(x).

    Each sequence is one dispatch group (capacity is counted per sequence). The shared experts are
    fused into one SwiGLU of width ``num_shared_experts * shared_expert_dim`` (as DeepSeek does).
    Returns the output and per-layer statistics: expert load, drop rate and the weighted balancing
    losses (Switch auxiliary loss and router z-loss).
    """

    def __init__(self, cfg, *, out_std: float, rngs: nnx.Rngs, dtype, param_dtype):
        moe = cfg.moe
        d, e, f, std = cfg.d_model, moe.num_experts, moe.expert_dim, cfg.init_std
        self.router = Router(d, moe, std=std, rngs=rngs)
        self.w_gate_edf = param(rngs, (e, d, f), ("experts", "embed", "expert_mlp"), std, param_dtype)
        self.w_up_edf = param(rngs, (e, d, f), ("experts", "embed", "expert_mlp"), std, param_dtype)
        self.w_down_efd = param(rngs, (e, f, d), ("experts", "expert_mlp", "embed"), out_std, param_dtype)
        shared_f = moe.num_shared_experts * moe.shared_expert_dim
        self.shared = (
            MLP(d, shared_f, std=std, out_std=out_std, rngs=rngs, dtype=dtype, param_dtype=param_dtype)
            if shared_f else None
        )
        self.num_experts = e
        self.backend = moe.backend
        self.capacity_factor = moe.capacity_factor
        self.impl = moe.grouped_matmul
        self.tile_size = moe.tile_size
        self.aux_loss_weight = moe.aux_loss_weight
        self.router_z_loss_weight = moe.router_z_loss_weight
        self.dtype = dtype

    def __call__(self, x_btd: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
        dt = self.dtype
        routing = self.router(x_btd)
        y_btd, stats = dispatch(
            x_btd, routing.idx_btk, routing.weight_btk,
            self.w_gate_edf[...].astype(dt), self.w_up_edf[...].astype(dt), self.w_down_efd[...].astype(dt),
            backend=self.backend, capacity_factor=self.capacity_factor, impl=self.impl,
            tile_size=self.tile_size,
        )
        if self.shared is not None:
            y_btd = y_btd + self.shared(x_btd)
        aux = {
            "load_e": expert_load(routing.idx_btk, self.num_experts),
            "drop_rate": stats["drop_rate"],
            "balance_loss": self.aux_loss_weight * switch_aux_loss(routing)
            + self.router_z_loss_weight * z_loss(routing.logits_bte),
        }
        return y_btd, aux
