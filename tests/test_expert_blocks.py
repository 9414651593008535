"""The dropless dispatch in per-expert blocks equals the sorted-rows dispatch; its gathers transpose to gathers."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from moejax.model.dispatch import dispatch
from moejax.model.expert_blocks import gather_rows
from moejax.model.grouped_matmul import hybrid_capacity
from moejax.schema import DispatchConfig


def test_gather_rows_gradient_is_the_scatter_add_of_take():
    # Rows 0 and 2 are read twice, row 3 never, and two outputs read the fill row (index 4).
    x_nd = jax.random.normal(jax.random.key(0), (4, 3))
    src_j = jnp.array([2, 0, 4, 2, 1, 0, 4], jnp.int32)
    dst_nk = jnp.array([[1, 5], [4, 7], [0, 3], [7, 7]], jnp.int32)  # 7 = len(src_j): nothing
    dy_jd = jax.random.normal(jax.random.key(1), (7, 3))

    y_jd, vjp = jax.vjp(lambda x: gather_rows(x, src_j, dst_nk), x_nd)
    expected_y, expected_vjp = jax.vjp(lambda x: jnp.take(x, src_j, axis=0, mode="fill", fill_value=0), x_nd)
    np.testing.assert_array_equal(y_jd, expected_y)
    np.testing.assert_array_equal(y_jd[2], 0.0)
    np.testing.assert_allclose(vjp(dy_jd)[0], expected_vjp(dy_jd)[0], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("e, k, skew", [(16, 2, False), (16, 2, True), (8, 8, False)])
def test_blocks_equal_hybrid_and_tiled_values_and_grads(e, k, skew):
    # 4 x 32 tokens; with skew, expert 0 is every token's first choice (its rows overflow the
    # blocks by far); (8, 8): every expert gets every token, each exactly its block.
    g, t, d, f = 4, 32, 16, 24
    keys = jax.random.split(jax.random.key(0), 6)
    x_gtd = jax.random.normal(keys[0], (g, t, d))
    logits_gte = jax.random.normal(keys[1], (g, t, e)) + (jnp.arange(e) == 0) * 10.0 * skew
    w_gtk, idx_gtk = jax.lax.top_k(logits_gte, k)
    w_gtk = jax.nn.softmax(w_gtk, axis=-1)
    weights = (
        jax.random.normal(keys[2], (e, d, f)) / d**0.5,
        jax.random.normal(keys[3], (e, d, f)) / d**0.5,
        jax.random.normal(keys[4], (e, f, d)) / f**0.5,
    )
    cotangent_gtd = jax.random.normal(keys[5], (g, t, d))
    sizes_e = np.bincount(np.ravel(idx_gtk), minlength=e)
    c = hybrid_capacity(g * t * k, e)
    assert sizes_e.max() > c if e == 16 else np.all(sizes_e == c)  # overflow, or blocks exactly full

    results = {}
    for impl in ("tiled", "hybrid", "blocks"):
        run = functools.partial(dispatch, cfg=DispatchConfig(backend="dropless", impl=impl, tile_size=8))

        def loss(x, w, *ws, run=run):
            return jnp.sum(run(x, idx_gtk.astype(jnp.int32), w, *ws)[0] * cotangent_gtd)

        y_gtd, stats = jax.jit(run)(x_gtd, idx_gtk.astype(jnp.int32), w_gtk, *weights)
        grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3, 4)))(x_gtd, w_gtk, *weights)
        results[impl] = (y_gtd, stats["tokens_per_expert_e"], *grads)
    names = ["y", "tokens_per_expert", "dx", "dw_gtk", "dw_gate", "dw_up", "dw_down"]
    for name, a, b, ref in zip(names, results["blocks"], results["hybrid"], results["tiled"], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5, err_msg=name)
        np.testing.assert_allclose(a, ref, rtol=1e-5, atol=1e-5, err_msg=name)
    np.testing.assert_array_equal(results["blocks"][1], sizes_e)
