"""The CPU fast paths give the numbers of the straightforward formulations they replace."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from moejax.model.layers import causal_attention, rope


def _reference_attention(q, k, v, segment_ids):
    t = q.shape[1]
    causal = jnp.tril(jnp.ones((t, t), bool))
    same_doc = segment_ids[:, :, None] == segment_ids[:, None, :]
    return jax.nn.dot_product_attention(q, k, v, mask=(causal & same_doc)[:, None])


@pytest.mark.parametrize("t,block,kv_heads", [(48, 16, 2), (50, 16, 4), (32, 64, 1)])
def test_block_causal_attention_matches_masked_full_attention(t, block, kv_heads):
    """Skipping the key blocks above the diagonal changes nothing: GQA, packed documents, a
    sequence that is not a multiple of the block, and a block longer than the sequence."""
    keys = jax.random.split(jax.random.key(0), 3)
    q = jax.random.normal(keys[0], (2, t, 4, 8))
    k = jax.random.normal(keys[1], (2, t, kv_heads, 8))
    v = jax.random.normal(keys[2], (2, t, kv_heads, 8))
    segments = jnp.asarray(np.stack([np.zeros(t), np.arange(t) // 13]).astype(np.int32))
    want = _reference_attention(q, k, v, segments)
    got = causal_attention(q, k, v, segments, block)
    np.testing.assert_allclose(got, want, atol=2e-6, rtol=1e-5)
    loss = lambda fn: lambda q, k, v: jnp.sum(jnp.sin(fn(q, k, v)))
    grads_want = jax.grad(loss(lambda q, k, v: _reference_attention(q, k, v, segments)), (0, 1, 2))(q, k, v)
    grads_got = jax.grad(loss(lambda q, k, v: causal_attention(q, k, v, segments, block)), (0, 1, 2))(q, k, v)
    for g, w in zip(grads_got, grads_want):
        np.testing.assert_allclose(g, w, atol=1e-5, rtol=1e-5)


def test_rope_matches_split_and_concatenate_form():
    x = jax.random.normal(jax.random.key(1), (2, 5, 3, 8))
    positions = jnp.asarray([[0, 1, 2, 3, 4], [7, 3, 0, 9, 100]])
    half = 4
    inv_freq = 1e4 ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angle = positions[..., None] * inv_freq
    sin, cos = jnp.sin(angle)[:, :, None], jnp.cos(angle)[:, :, None]
    x1, x2 = x[..., :half], x[..., half:]
    want = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    np.testing.assert_allclose(rope(x, positions, 1e4), want, atol=1e-6)
