"""Incremental decoding: the fixed-size key/value cache and next-token selection.

The cache holds every layer's keys and values for ``max_len`` positions of ``B`` rows; row ``b``
has filled positions ``[0, index_b[b])``. One fixed shape for the whole generation means the
one-token decode step compiles once, however many tokens follow. Rows may hold prompts of
different lengths (right-padded): a row's queries only see keys at positions up to their own,
so whatever a padding token wrote beyond a row's length stays invisible until a real token
overwrites it (:meth:`moejax.model.layers.Attention.decode`).

Dimension letters as in :mod:`moejax.model`, plus ``s`` the cache positions (``max_len``).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class KVCache(NamedTuple):
    k_lbskh: jax.Array  # keys after RoPE, [layers, B, max_len, kv_heads, head_dim]
    v_lbskh: jax.Array  # values, same shape


def init_cache(model_cfg, batch: int, max_len: int, dtype=jnp.float32) -> KVCache:
    """An empty (zero) cache for ``batch`` rows of up to ``max_len`` tokens."""
    shape = (model_cfg.num_layers, batch, max_len, model_cfg.num_kv_heads, model_cfg.head_dim)
    return KVCache(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype))


def top_p_mask(logits_bv: jax.Array, top_p: jax.Array) -> jax.Array:
    """True on the nucleus: the most probable tokens whose probabilities first sum to >= top_p.

    A token is kept when the mass of the tokens strictly more probable than it is below
    ``top_p``, so the most probable token is always kept and ``top_p = 1`` keeps everything.
    Ties at the boundary are all kept (a tie is not an order the model expressed).
    """
    probs_bv = jax.nn.softmax(logits_bv.astype(jnp.float32), axis=-1)
    sorted_bv = jnp.sort(probs_bv, axis=-1)[:, ::-1]
    mass_before_bv = jnp.cumsum(sorted_bv, axis=-1) - sorted_bv
    # The smallest probability still inside the nucleus; everything at least as likely is kept.
    threshold_b = jnp.min(jnp.where(mass_before_bv < top_p, sorted_bv, jnp.inf), axis=-1)
    return probs_bv >= threshold_b[:, None]


def next_token(logits_bv: jax.Array, key: jax.Array, temperature: jax.Array, top_p: jax.Array) -> jax.Array:
    """The next token of each row: argmax when ``temperature == 0``, else a sample of
    ``softmax(logits / temperature)`` restricted to the top-p nucleus. int32 [B].

    ``temperature`` and ``top_p`` are traced scalars, so changing them does not recompile.
    """
    greedy_b = jnp.argmax(logits_bv, axis=-1)
    scaled_bv = logits_bv.astype(jnp.float32) / jnp.maximum(temperature, 1e-6)
    kept_bv = top_p_mask(scaled_bv, top_p)
    sampled_b = jax.random.categorical(key, jnp.where(kept_bv, scaled_bv, -jnp.inf), axis=-1)
    return jnp.where(temperature > 0, sampled_b, greedy_b).astype(jnp.int32)
