"""Dense building blocks: parameter helper, RMSNorm, RoPE, grouped-query attention, SwiGLU MLP."""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from moejax.sharding import constrain


def param(
    rngs: nnx.Rngs, shape: Sequence[int], axes: Sequence[str | None], std: float, dtype: jnp.dtype
) -> nnx.Param:
    """A normal(0, std) parameter tagged with logical axis names (see ``moejax.sharding.RULES``)."""
    value = std * jax.random.normal(rngs.params(), tuple(shape), jnp.float32)
    return nnx.Param(value.astype(dtype), axes=tuple(axes))


class RMSNorm(nnx.Module):
    """y = x / rms(x) * scale, computed in float32."""

    def __init__(self, dim: int, eps: float, param_dtype: jnp.dtype):
        self.scale = nnx.Param(jnp.ones((dim,), param_dtype), axes=("norm",))
        self.eps = eps

    def __call__(self, x_btd: jax.Array) -> jax.Array:
        x32 = x_btd.astype(jnp.float32)
        y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return (y * self.scale[...].astype(jnp.float32)).astype(x_btd.dtype)


def rope(x_btnh: jax.Array, positions_bt: jax.Array, theta: float) -> jax.Array:
    """Rotary position embedding (rotate-half form) at the given per-token positions."""
    half = x_btnh.shape[-1] // 2
    inv_freq_h = theta ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angle_bth = positions_bt[..., None].astype(jnp.float32) * inv_freq_h
    sin, cos = jnp.sin(angle_bth)[:, :, None, :], jnp.cos(angle_bth)[:, :, None, :]
    x1, x2 = jnp.split(x_btnh.astype(jnp.float32), 2, axis=-1)
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x_btnh.dtype)


class Attention(nnx.Module):
    """Grouped-query causal self-attention; attention never crosses document (segment) boundaries."""

    def __init__(self, cfg, *, out_std: float, rngs: nnx.Rngs, dtype, param_dtype):
        d, n, k, h = cfg.d_model, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        std = cfg.init_std
        self.w_q_dnh = param(rngs, (d, n, h), ("embed", "heads", "head_dim"), std, param_dtype)
        self.w_k_dkh = param(rngs, (d, k, h), ("embed", "kv_heads", "head_dim"), std, param_dtype)
        self.w_v_dkh = param(rngs, (d, k, h), ("embed", "kv_heads", "head_dim"), std, param_dtype)
        self.w_o_nhd = param(rngs, (n, h, d), ("heads", "head_dim", "embed"), out_std, param_dtype)
        self.rope_theta = cfg.rope_theta
        self.dtype = dtype

    def __call__(self, x_btd, positions_bt, segment_ids_bt):
        dt = self.dtype
        q_btnh = jnp.einsum("btd,dnh->btnh", x_btd, self.w_q_dnh[...].astype(dt))
        k_btkh = jnp.einsum("btd,dkh->btkh", x_btd, self.w_k_dkh[...].astype(dt))
        v_btkh = jnp.einsum("btd,dkh->btkh", x_btd, self.w_v_dkh[...].astype(dt))
        q_btnh = constrain(rope(q_btnh, positions_bt, self.rope_theta), ("batch", "seq", "act_heads", None))
        k_btkh = rope(k_btkh, positions_bt, self.rope_theta)
        t = x_btd.shape[1]
        causal_ts = jnp.tril(jnp.ones((t, t), bool))
        same_doc_bts = segment_ids_bt[:, :, None] == segment_ids_bt[:, None, :]
        mask_b1ts = (causal_ts & same_doc_bts)[:, None]
        o_btnh = jax.nn.dot_product_attention(q_btnh, k_btkh, v_btkh, mask=mask_b1ts)
        return jnp.einsum("btnh,nhd->btd", o_btnh, self.w_o_nhd[...].astype(dt))


class MLP(nnx.Module):
    """SwiGLU: (silu(x W_gate) * x W_up) W_down."""

    def __init__(self, d: int, f: int, *, std: float, out_std: float, rngs: nnx.Rngs, dtype, param_dtype):
        self.w_gate_df = param(rngs, (d, f), ("embed", "mlp"), std, param_dtype)
        self.w_up_df = param(rngs, (d, f), ("embed", "mlp"), std, param_dtype)
        self.w_down_fd = param(rngs, (f, d), ("mlp", "embed"), out_std, param_dtype)
        self.dtype = dtype

    def __call__(self, x_btd: jax.Array) -> jax.Array:
        dt = self.dtype
        gate_btf = jnp.einsum("btd,df->btf", x_btd, self.w_gate_df[...].astype(dt))
        up_btf = jnp.einsum("btd,df->btf", x_btd, self.w_up_df[...].astype(dt))
        h_btf = constrain(jax.nn.silu(gate_btf) * up_btf, ("batch", "seq", "act_mlp"))
        return jnp.einsum("btf,fd->btd", h_btf, self.w_down_fd[...].astype(dt))
