"""The MoE block: router, routed experts through a dispatch backend, optional shared experts."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from moejax.model.balancing import Balancer, BalanceState
from moejax.model.dispatch import dispatch
from moejax.model.layers import MLP, param
from moejax.model.router import Router, expert_load, routing_entropy
from moejax.schema import MoEConfig


class MoE(nnx.Module):
    """y = routed_scaling * sum_k w_k Expert_{i_k}(x) + SharedExperts(x).

    Each sequence is one dispatch group (capacity is counted per sequence). The shared experts are
    fused into one SwiGLU of width ``num_shared_experts * shared_expert_dim`` (as DeepSeek does).
    With ``shared_gate`` their output is scaled per token by sigmoid(x . w_shared_gate_d), as in
    Qwen2-MoE. ``cfg`` (:class:`~moejax.schema.MoEConfig`) holds the layer's knobs, its dispatch's
    among them; ``d`` is the model width, ``std`` the init std of its input matrices.

    With a ``balancer`` and this layer's ``balance_state`` (leaves [E]), the objectives' selection
    bias moves the top-k choice and their losses are returned. Returns the output and float32
    per-layer statistics: ``load_e`` (assignment fractions), ``pbar_e`` (mean routing
    probabilities), ``drop_rate``, ``llep_engaged`` (with ``ep_balance="llep"`` only: 1.0
    when the layer spilled, 0.0 when it took standard EP's exchange), ``entropy`` (mean per-token routing entropy) and ``losses``
    (objective name -> weighted loss); per token, ``routing`` (the router's
    :class:`~moejax.model.router.Routing`) and ``router_input`` (what the router multiplies: the
    input in float32), which the Transformer drops unless asked.
    """

    def __init__(self, d: int, cfg: MoEConfig, *, std: float, out_std: float, rngs: nnx.Rngs, dtype, param_dtype):
        e, f = cfg.num_experts, cfg.expert_dim
        self.router = Router(d, cfg, std=std, rngs=rngs)
        self.w_gate_edf = param(rngs, (e, d, f), ("experts", "embed", "expert_mlp"), std, param_dtype)
        self.w_up_edf = param(rngs, (e, d, f), ("experts", "embed", "expert_mlp"), std, param_dtype)
        self.w_down_efd = param(rngs, (e, f, d), ("experts", "expert_mlp", "embed"), out_std, param_dtype)
        self.shared = (
            MLP(d, cfg.shared_dim, std=std, out_std=out_std, rngs=rngs, dtype=dtype, param_dtype=param_dtype)
            if cfg.shared_dim else None
        )
        self.w_shared_gate_d = param(rngs, (d,), ("embed",), std, param_dtype) if cfg.shared_gate else None
        self.num_experts = e
        self.dispatch_cfg = cfg.dispatch
        self.dtype = dtype

    def __call__(
        self, x_btd: jax.Array, balancer: Balancer | None = None, balance_state: BalanceState | None = None
    ) -> tuple[jax.Array, dict]:
        dt = self.dtype
        balancer = balancer or Balancer()
        balance_state = balance_state or {}
        routing = self.router(x_btd, balancer.selection_bias(balance_state))
        y_btd, stats = dispatch(
            x_btd, routing.idx_btk, routing.weight_btk,
            self.w_gate_edf[...].astype(dt), self.w_up_edf[...].astype(dt), self.w_down_efd[...].astype(dt),
            cfg=self.dispatch_cfg,
        )
        if self.shared is not None:
            y_btd = y_btd + self.shared_output(x_btd)
        aux = {
            "load_e": expert_load(routing.idx_btk, self.num_experts),
            "pbar_e": jax.lax.stop_gradient(jnp.mean(routing.probs_bte, axis=(0, 1))),
            "drop_rate": stats["drop_rate"],
            "entropy": jax.lax.stop_gradient(routing_entropy(routing.probs_bte)),
            "losses": balancer.losses(routing, balance_state),
            "routing": routing,  # per token; the Transformer drops it unless asked (evaluation)
            "router_input": x_btd.astype(jnp.float32),  # per token, dropped unless asked, as routing
        }
        if "llep_engaged" in stats:
            aux["llep_engaged"] = stats["llep_engaged"]
        return y_btd, aux

    def shared_output(self, x_btd: jax.Array) -> jax.Array:
        """The shared experts' output, gated per token when ``shared_gate`` is on."""
        y_btd = self.shared(x_btd)
        if self.w_shared_gate_d is None:
            return y_btd
        gate_bt = jax.nn.sigmoid(jnp.einsum("btd,d->bt", x_btd, self.w_shared_gate_d[...].astype(self.dtype)))
        return gate_bt[..., None] * y_btd
