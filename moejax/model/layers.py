"""Dense building blocks: parameter helper, RMSNorm, RoPE, grouped-query attention, SwiGLU MLP."""

from __future__ import annotations

import math
from typing import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from moejax.model import platform
from moejax.sharding import constrain

# Query block of causal_attention: key blocks above the diagonal are skipped. Larger blocks skip
# less, smaller ones add per-block overhead (the sizes compared: experiments/benchmarks/LOG.md,
# section 2, change 1). Longer sequences use at most MAX_ATTENTION_BLOCKS blocks (compile time
# grows with their square).
ATTENTION_BLOCK = 64
MAX_ATTENTION_BLOCKS = 8


def attention_block(seq_len: int) -> int:
    """The query block of :func:`causal_attention` for a sequence of ``seq_len`` tokens."""
    return max(ATTENTION_BLOCK, -(-seq_len // MAX_ATTENTION_BLOCKS))


def linear(x: jax.Array, w: jax.Array, contract: int = 1) -> jax.Array:
    """``x``'s last ``contract`` dims times ``w``'s first ``contract`` dims, as one 2-D matmul.

    ``linear(x_btd, w_dnh)`` is ``einsum("btd,dnh->btnh")`` and ``linear(o_btnh, w_nhd, 2)`` is
    ``einsum("btnh,nhd->btd")``, but the operands are first flattened to [rows, K] x [K, cols]
    (free reshapes of row-major arrays). XLA:CPU runs the backward of the multi-dimensional
    einsum (the weight gradient contracts over batch and sequence) slower than the same matmul
    on flattened operands (the A/B: experiments/benchmarks/LOG.md, section 2, change 2). On
    GPU/TPU the reshapes are free.
    """
    k_shape = w.shape[:contract]
    if x.shape[x.ndim - contract:] != k_shape:
        raise ValueError(f"linear: x {x.shape} and w {w.shape} do not share {contract} contracted dims")
    y = x.reshape(-1, math.prod(k_shape)) @ w.reshape(math.prod(k_shape), -1)
    return y.reshape(*x.shape[: x.ndim - contract], *w.shape[contract:])


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
    """Rotary position embedding (rotate-half form) at the given per-token positions.

    Written as ``x * cos + rotate_half(x) * sin`` with full-width cos/sin tables (each half of a
    head gets the same products as the split-and-concatenate form, so the numbers are identical):
    one elementwise expression that XLA fuses with the surrounding projection and layout change,
    in the backward pass too.
    """
    half = x_btnh.shape[-1] // 2
    inv_freq_h = theta ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angle_bth = positions_bt[..., None].astype(jnp.float32) * inv_freq_h
    cos_bth, sin_bth = jnp.cos(angle_bth), jnp.sin(angle_bth)
    cos_bt1h = jnp.concatenate([cos_bth, cos_bth], axis=-1)[:, :, None, :]
    sin_bt1h = jnp.concatenate([-sin_bth, sin_bth], axis=-1)[:, :, None, :]
    x = x_btnh.astype(jnp.float32)
    rotated = jnp.concatenate([x[..., half:], x[..., :half]], axis=-1)
    return (x * cos_bt1h + rotated * sin_bt1h).astype(x_btnh.dtype)


def causal_attention(
    q_btnh: jax.Array, k_btkh: jax.Array, v_btkh: jax.Array, segment_ids_bt: jax.Array, block: int = 64
) -> jax.Array:
    """softmax(q k^T / sqrt(h) + mask) v over the causal, same-document keys; grouped-query heads.

    The queries are cut into blocks of ``block`` positions and block i attends only to keys
    [0, (i + 1) * block): the key blocks above the diagonal, masked out entirely, are never
    computed (about half of the score matrix at long sequences; 10 of 16 blocks at T = 4 *
    block). Each query row's softmax is still over all its visible keys at once (no running
    max), so the result is ``jax.nn.dot_product_attention`` with the causal and document mask
    up to float reassociation. Used on CPU only (GPU/TPU keep the fused kernels of
    ``jax.nn.dot_product_attention``). On XLA:CPU this is faster forward and backward than
    ``jax.nn.dot_product_attention`` (which computes and masks the whole [T, T] matrix); see
    experiments/benchmarks/LOG.md, section 2, change 1. Scores and softmax run in float32.

    Shapes: q [b, t, n, h], k and v [b, t, k, h] with n a multiple of k; returns [b, t, n, h].
    """
    b, t, n, h = q_btnh.shape
    kv = k_btkh.shape[2]
    g = n // kv
    scale = h**-0.5
    # Heads first, so each (batch, head) is one contiguous matrix for the batched matmuls.
    q_bkgth = (q_btnh.reshape(b, t, kv, g, h) * jnp.asarray(scale, q_btnh.dtype)).transpose(0, 2, 3, 1, 4)
    k_bksh = k_btkh.transpose(0, 2, 1, 3)
    v_bksh = v_btkh.transpose(0, 2, 1, 3)
    block = max(1, min(block, t))
    outs = []
    for start in range(0, t, block):
        stop = min(start + block, t)
        q_blk = q_bkgth[:, :, :, start:stop]
        scores = jnp.einsum("bkgqh,bksh->bkgqs", q_blk, k_bksh[:, :, :stop], preferred_element_type=jnp.float32)
        causal_qs = jnp.arange(start, stop)[:, None] >= jnp.arange(stop)[None, :]
        same_doc_bqs = segment_ids_bt[:, start:stop, None] == segment_ids_bt[:, None, :stop]
        visible = (causal_qs & same_doc_bqs)[:, None, None]
        scores = jnp.where(visible, scores, jnp.finfo(jnp.float32).min)
        probs = jax.nn.softmax(scores, axis=-1).astype(v_bksh.dtype)
        outs.append(jnp.einsum("bkgqs,bksh->bkgqh", probs, v_bksh[:, :, :stop]))
    o_bkgth = jnp.concatenate(outs, axis=3) if len(outs) > 1 else outs[0]
    return o_bkgth.transpose(0, 3, 1, 2, 4).reshape(b, t, n, h)


class Attention(nnx.Module):
    """Grouped-query causal self-attention; attention never crosses document (segment) boundaries."""

    def __init__(self, cfg, *, out_std: float, rngs: nnx.Rngs, dtype, param_dtype):
        d, n, k, h = cfg.d_model, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        std = cfg.init_std
        self.w_q_dnh = param(rngs, (d, n, h), ("embed", "heads", "head_dim"), std, param_dtype)
        self.w_k_dkh = param(rngs, (d, k, h), ("embed", "kv_heads", "head_dim"), std, param_dtype)
        self.w_v_dkh = param(rngs, (d, k, h), ("embed", "kv_heads", "head_dim"), std, param_dtype)
        self.w_o_nhd = param(rngs, (n, h, d), ("heads", "head_dim", "embed"), out_std, param_dtype)
        # Optional q/k/v biases (Qwen2-MoE); zero-initialised and, like all biases, never decayed.
        bias = lambda shape, axes: nnx.Param(jnp.zeros(shape, param_dtype), axes=axes, decay=False)
        self.b_q_nh = bias((n, h), ("heads", "head_dim")) if cfg.attn_bias else None
        self.b_k_kh = bias((k, h), ("kv_heads", "head_dim")) if cfg.attn_bias else None
        self.b_v_kh = bias((k, h), ("kv_heads", "head_dim")) if cfg.attn_bias else None
        # Optional per-head RMSNorm of q and k over the head dimension, before RoPE (Qwen3-MoE).
        self.q_norm = RMSNorm(h, cfg.norm_eps, param_dtype) if cfg.qk_norm else None
        self.k_norm = RMSNorm(h, cfg.norm_eps, param_dtype) if cfg.qk_norm else None
        self.rope_theta = cfg.rope_theta
        self.dtype = dtype

    def project_qkv(self, x_btd, positions_bt):
        """Queries and keys (RoPE applied) and values of ``x_btd``; shared by every attention path.

        Order, as in Qwen2/3-MoE: projection, + bias (if any), per-head RMSNorm (if any), RoPE.
        """
        dt = self.dtype

        def project(w, b, norm):
            y = linear(x_btd, w[...].astype(dt))
            y = y if b is None else y + b[...].astype(dt)
            return y if norm is None else norm(y)

        q_btnh = project(self.w_q_dnh, self.b_q_nh, self.q_norm)
        k_btkh = project(self.w_k_dkh, self.b_k_kh, self.k_norm)
        v_btkh = project(self.w_v_dkh, self.b_v_kh, None)
        q_btnh = constrain(rope(q_btnh, positions_bt, self.rope_theta), ("batch", "seq", "act_heads", None))
        k_btkh = rope(k_btkh, positions_bt, self.rope_theta)
        return q_btnh, k_btkh, v_btkh

    def __call__(self, x_btd, positions_bt, segment_ids_bt):
        dt = self.dtype
        q_btnh, k_btkh, v_btkh = self.project_qkv(x_btd, positions_bt)
        if platform.current() == "cpu":
            o_btnh = causal_attention(q_btnh, k_btkh, v_btkh, segment_ids_bt, attention_block(x_btd.shape[1]))
        else:  # GPU/TPU: XLA's or cuDNN's fused attention kernels
            t = x_btd.shape[1]
            causal_ts = jnp.tril(jnp.ones((t, t), bool))
            same_doc_bts = segment_ids_bt[:, :, None] == segment_ids_bt[:, None, :]
            o_btnh = jax.nn.dot_product_attention(q_btnh, k_btkh, v_btkh, mask=(causal_ts & same_doc_bts)[:, None])
        return linear(o_btnh, self.w_o_nhd[...].astype(dt), 2)

    def decode(self, x_btd, k_bskh, v_bskh, index_b):
        """Attention of T new tokens per row over a key/value cache (one document per row).

        Row b's new tokens take positions ``index_b[b] + [0, T)``: their keys and values are
        written there and each attends to every cached position up to its own. Prefill is T =
        prompt length at index 0; a decode step is T = 1. Returns the output and the updated
        cache; positions past a row's own are never read, so stale entries there are harmless.
        """
        dt = self.dtype
        b, t = x_btd.shape[:2]
        positions_bt = index_b[:, None] + jnp.arange(t, dtype=index_b.dtype)
        q_btnh, k_btkh, v_btkh = self.project_qkv(x_btd, positions_bt)
        rows_bt = jnp.broadcast_to(jnp.arange(b)[:, None], (b, t))
        k_bskh = k_bskh.at[rows_bt, positions_bt].set(k_btkh.astype(k_bskh.dtype))
        v_bskh = v_bskh.at[rows_bt, positions_bt].set(v_btkh.astype(v_bskh.dtype))
        visible_bts = jnp.arange(k_bskh.shape[1])[None, None, :] <= positions_bt[:, :, None]
        o_btnh = jax.nn.dot_product_attention(
            q_btnh, k_bskh.astype(dt), v_bskh.astype(dt), mask=visible_bts[:, None]
        )
        return linear(o_btnh, self.w_o_nhd[...].astype(dt), 2), k_bskh, v_bskh


class MLP(nnx.Module):
    """SwiGLU: (silu(x W_gate) * x W_up) W_down."""

    def __init__(self, d: int, f: int, *, std: float, out_std: float, rngs: nnx.Rngs, dtype, param_dtype):
        self.w_gate_df = param(rngs, (d, f), ("embed", "mlp"), std, param_dtype)
        self.w_up_df = param(rngs, (d, f), ("embed", "mlp"), std, param_dtype)
        self.w_down_fd = param(rngs, (f, d), ("mlp", "embed"), out_std, param_dtype)
        self.dtype = dtype

    def __call__(self, x_btd: jax.Array) -> jax.Array:
        dt = self.dtype
        gate_btf = linear(x_btd, self.w_gate_df[...].astype(dt))
        up_btf = linear(x_btd, self.w_up_df[...].astype(dt))
        h_btf = constrain(jax.nn.silu(gate_btf) * up_btf, ("batch", "seq", "act_mlp"))
        return linear(h_btf, self.w_down_fd[...].astype(dt))
