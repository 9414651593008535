"""Decoder-only MoE transformer: embeddings, pre-norm blocks (attention + MLP or MoE), output head."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from moejax.model.layers import MLP, Attention, RMSNorm, param
from moejax.model.moe import MoE
from moejax.sharding import constrain

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def is_moe_layer(cfg, layer: int) -> bool:
    """First ``first_k_dense`` layers are dense; after them every ``moe_every``-th layer is MoE."""
    return layer >= cfg.first_k_dense and (layer - cfg.first_k_dense) % cfg.moe_every == 0


class Block(nnx.Module):
    def __init__(self, cfg, layer: int, *, rngs: nnx.Rngs, dtype, param_dtype):
        out_std = cfg.init_std / math.sqrt(2 * cfg.num_layers)
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps, param_dtype)
        self.attn = Attention(cfg, out_std=out_std, **kw)
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps, param_dtype)
        self.is_moe = is_moe_layer(cfg, layer)
        if self.is_moe:
            self.mlp = MoE(cfg, out_std=out_std, **kw)
        else:
            self.mlp = MLP(cfg.d_model, cfg.mlp_dim, std=cfg.init_std, out_std=out_std, **kw)

    def __call__(self, x_btd, positions_bt, segment_ids_bt, balancer=None, balance_state=None):
        x_btd = x_btd + self.attn(self.attn_norm(x_btd), positions_bt, segment_ids_bt)
        h_btd = self.mlp_norm(x_btd)
        if self.is_moe:
            y_btd, aux = self.mlp(h_btd, balancer, balance_state)
        else:
            y_btd, aux = self.mlp(h_btd), None
        x_btd = constrain(x_btd + y_btd, ("batch", "seq", "act_embed"))
        return x_btd, aux


class Transformer(nnx.Module):
    """Returns float32 logits [B, T, V] and auxiliary outputs stacked over the L MoE layers.

    ``balancer`` (static) and ``balance_state`` (its state, leaves [L, E]) apply the balancing
    objectives: layer l gets ``balance_state`` sliced at l. Without them, no objective applies.
    Auxiliary outputs (float32): ``load_le`` (assignment fractions), ``pbar_le`` (mean routing
    probabilities), ``drop_rate_l``, ``entropy_l`` (mean per-token routing entropy),
    ``balance_losses`` (objective -> loss summed over layers) and their sum ``balance_loss``.
    """

    def __init__(self, cfg, *, rngs: nnx.Rngs, compute_dtype: str = "float32", param_dtype: str = "float32"):
        dtype, pdtype = DTYPES[compute_dtype], DTYPES[param_dtype]
        self.embed_vd = param(rngs, (cfg.vocab_size, cfg.d_model), ("vocab", "embed"), cfg.init_std, pdtype)
        self.blocks = nnx.List(
            [Block(cfg, i, rngs=rngs, dtype=dtype, param_dtype=pdtype) for i in range(cfg.num_layers)]
        )
        self.final_norm = RMSNorm(cfg.d_model, cfg.norm_eps, pdtype)
        self.head_dv = (
            None if cfg.tie_embeddings
            else param(rngs, (cfg.d_model, cfg.vocab_size), ("embed", "vocab"), cfg.init_std, pdtype)
        )
        self.num_experts = cfg.moe.num_experts
        self.dtype = dtype

    def __call__(self, tokens_bt, positions_bt, segment_ids_bt, *, balancer=None, balance_state=None):
        embed_vd = self.embed_vd[...]
        x_btd = constrain(embed_vd.astype(self.dtype)[tokens_bt], ("batch", "seq", "act_embed"))
        auxes = []
        for block in self.blocks:
            layer_state = None
            if block.is_moe and balance_state:
                layer_state = jax.tree.map(lambda s, l=len(auxes): s[l], balance_state)
            x_btd, aux = block(x_btd, positions_bt, segment_ids_bt, balancer, layer_state)
            if aux is not None:
                auxes.append(aux)
        x_btd = self.final_norm(x_btd)
        head_dv = embed_vd.T if self.head_dv is None else self.head_dv[...]
        logits_btv = jnp.einsum("btd,dv->btv", x_btd, head_dv.astype(self.dtype)).astype(jnp.float32)
        return constrain(logits_btv, ("batch", "seq", "vocab")), self._stack(auxes)

    def _stack(self, auxes: list[dict]) -> dict:
        e = self.num_experts
        stack = lambda key, shape: (
            jnp.stack([a[key] for a in auxes]) if auxes else jnp.zeros((0, *shape), jnp.float32)
        )
        balance_losses = {
            name: sum(a["losses"][name] for a in auxes) for name in (auxes[0]["losses"] if auxes else {})
        }
        return {
            "load_le": stack("load_e", (e,)),
            "pbar_le": stack("pbar_e", (e,)),
            "drop_rate_l": stack("drop_rate", ()),
            "entropy_l": stack("entropy", ()),
            "balance_losses": balance_losses,
            "balance_loss": sum(balance_losses.values(), jnp.zeros((), jnp.float32)),
        }


def param_counts(cfg) -> dict[str, int]:
    """Total and active (per token) parameter counts, from the config alone."""
    d, v, moe = cfg.d_model, cfg.vocab_size, cfg.moe
    attn = d * cfg.head_dim * (2 * cfg.num_heads + 2 * cfg.num_kv_heads) + 2 * d
    dense_mlp = 3 * d * cfg.mlp_dim
    shared = 3 * d * moe.num_shared_experts * moe.shared_expert_dim
    routed_one = 3 * d * moe.expert_dim
    router = d * moe.num_experts
    total = active = v * d * (1 if cfg.tie_embeddings else 2) + d
    for layer in range(cfg.num_layers):
        if is_moe_layer(cfg, layer):
            total += attn + router + shared + moe.num_experts * routed_one
            active += attn + router + shared + moe.experts_per_token * routed_one
        else:
            total += attn + dense_mlp
            active += attn + dense_mlp
    return {"total": total, "active": active}


def flops_per_token(cfg, seq_len: int) -> float:
    """Training FLOPs per token: 6 x (active matmul params, incl. the output head) + attention.

    Attention scores and values cost 2 * 2 * T * n * h per token per layer forward, halved for the
    causal mask; x3 for forward + backward. Embedding lookups are free; norms are ignored.
    """
    counts = param_counts(cfg)
    d, v = cfg.d_model, cfg.vocab_size
    matmul_params = counts["active"] - v * d * (1 if cfg.tie_embeddings else 2) + v * d
    attention = cfg.num_layers * 2 * seq_len * cfg.num_heads * cfg.head_dim  # causal: half of 4*T*n*h
    return 6.0 * matmul_params + 3.0 * attention
