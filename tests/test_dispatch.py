"""Grouped matmuls and the MoE dispatch backends agree with naive references, values and grads."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from moejax.model.dispatch import BACKENDS, dispatch, expert_capacity
from moejax.model.grouped_matmul import (
    IMPLS,
    grouped_ffn,
    grouped_matmul,
    hybrid_capacity,
    resolve_impl,
    row_tiles,
)
from moejax.schema import DispatchConfig

G, T, D, F, E, K = 2, 16, 8, 12, 4, 2
TOL = dict(rtol=1e-5, atol=1e-5)
NO_DROPS = E / K  # capacity_factor giving C = T: nothing can be dropped


def _expert_weights(seed, e=E, d=D, f=F, dtype=jnp.float32):
    k_gate, k_up, k_down = jax.random.split(jax.random.key(seed), 3)
    return (
        (jax.random.normal(k_gate, (e, d, f)) / d**0.5).astype(dtype),
        (jax.random.normal(k_up, (e, d, f)) / d**0.5).astype(dtype),
        (jax.random.normal(k_down, (e, f, d)) / f**0.5).astype(dtype),
    )


def _routing(seed, g=G, t=T, e=E, k=K):
    """Top-k of random logits: distinct experts per token, softmax-normalised float32 weights."""
    logits_gte = jax.random.normal(jax.random.key(seed), (g, t, e))
    w_gtk, idx_gtk = jax.lax.top_k(logits_gte, k)
    return idx_gtk.astype(jnp.int32), jax.nn.softmax(w_gtk, axis=-1)


def _reference_moe(x_gtd, idx_gtk, w_gtk, w_gate_edf, w_up_edf, w_down_efd):
    """Token by token: each selected expert's SwiGLU, weighted and summed over the k choices."""

    def one_token(x_d, idx_k, w_k):
        gate_kf = jnp.einsum("d,kdf->kf", x_d, w_gate_edf[idx_k])
        up_kf = jnp.einsum("d,kdf->kf", x_d, w_up_edf[idx_k])
        return jnp.einsum("k,kf,kfd->d", w_k, jax.nn.silu(gate_kf) * up_kf, w_down_efd[idx_k])

    return jax.vmap(jax.vmap(one_token))(x_gtd, idx_gtk, w_gtk)


def _assert_all_close(actual, expected, names, **tol):
    for name, a, b in zip(names, actual, expected, strict=True):
        np.testing.assert_allclose(a, b, **(tol or TOL), err_msg=name)


# ---------------------------------------------------------------------------------------------
# grouped_matmul / grouped_ffn

GROUP_CASES = [
    # (group sizes, rows, tile size): empty groups, sizes not divisible by the tile, a tile
    # larger than every group, and rows past the groups' total (they must give zeros). For
    # "hybrid" (8 rows per expert in its batched part here) the first two overflow into its tiled
    # part (9 > 8 and 13 > 8 rows), the last two do not.
    ([0, 5, 9, 0, 3], 17, 4),
    ([7, 0, 0, 13], 20, 8),
    ([3, 1, 2], 6, 64),
    ([2, 0, 6], 11, 4),
]


def _numpy_grouped_matmul(x_md, w_edf, group_sizes_e, dy_mf):
    """Per-row reference for y = x @ w[expert of row] and the grads of sum(y * dy)."""
    expert_of_row = np.repeat(np.arange(len(group_sizes_e)), group_sizes_e)
    y_mf = np.zeros((x_md.shape[0], w_edf.shape[2]), np.float64)
    dx_md = np.zeros(x_md.shape, np.float64)
    dw_edf = np.zeros(w_edf.shape, np.float64)
    for i, e in enumerate(expert_of_row):
        y_mf[i] = x_md[i] @ w_edf[e]
        dx_md[i] = dy_mf[i] @ w_edf[e].T
        dw_edf[e] += np.outer(x_md[i], dy_mf[i])
    return y_mf, dx_md, dw_edf


@pytest.mark.parametrize("impl", ["ragged", "tiled", "hybrid"])
@pytest.mark.parametrize("group_sizes, m, tile_size", GROUP_CASES)
def test_grouped_matmul_matches_per_row_reference(impl, group_sizes, m, tile_size):
    rng = np.random.default_rng(0)
    x_md = rng.normal(size=(m, D)).astype(np.float32)
    w_edf = rng.normal(size=(len(group_sizes), D, F)).astype(np.float32)
    dy_mf = rng.normal(size=(m, F)).astype(np.float32)
    group_sizes_e = np.asarray(group_sizes, np.int32)

    matmul = functools.partial(grouped_matmul, impl=impl, tile_size=tile_size)
    y_mf = jax.jit(matmul)(x_md, w_edf, group_sizes_e)
    dx_md, dw_edf = jax.jit(
        jax.grad(lambda x, w: jnp.sum(matmul(x, w, group_sizes_e) * dy_mf), argnums=(0, 1))
    )(x_md, w_edf)

    _assert_all_close(
        (y_mf, dx_md, dw_edf),
        _numpy_grouped_matmul(x_md, w_edf, group_sizes_e, dy_mf),
        ["y", "dx", "dw"],
    )


@pytest.mark.parametrize("skip", [0, 2])
@pytest.mark.parametrize("group_sizes, m, tile_size", GROUP_CASES[:2])
def test_row_tiles_cover_each_experts_rows_past_skip_once(group_sizes, m, tile_size, skip):
    group_sizes_e = np.asarray(group_sizes, np.int32)
    expert_n, row0_n, end_n, num_used = row_tiles(jnp.asarray(group_sizes_e), m, skip, tile_size)
    tiles_e = -(-np.maximum(group_sizes_e - skip, 0) // tile_size)
    assert int(num_used) == tiles_e.sum() and len(expert_n) >= tiles_e.sum()
    np.testing.assert_array_equal(expert_n[:num_used], np.repeat(np.arange(len(group_sizes)), tiles_e))
    covered = np.concatenate([np.arange(r0, r1) for r0, r1 in zip(row0_n[:num_used], end_n[:num_used])])
    start_e = np.cumsum(group_sizes_e) - group_sizes_e
    expected = np.concatenate([np.arange(s + skip, s + n) for s, n in zip(start_e, group_sizes_e) if n > skip])
    np.testing.assert_array_equal(covered, expected)
    assert np.all(end_n[:num_used] - row0_n[:num_used] <= tile_size)


def test_grouped_ffn_ragged_and_tiled_match_per_row_reference():
    group_sizes_e = np.asarray([5, 0, 11, 2], np.int32)
    m = int(group_sizes_e.sum())
    x_md = jax.random.normal(jax.random.key(1), (m, D))
    weights = _expert_weights(2)
    # The per-token reference with one group of m tokens, each routed (top-1) to its row's expert.
    idx_1m1 = np.repeat(np.arange(E), group_sizes_e)[None, :, None]

    def loss(ffn, x_md, *weights):
        y_md = ffn(x_md, *weights)
        return jnp.sum(jnp.sin(y_md)), y_md

    def reference_ffn(x_md, *weights):
        return _reference_moe(x_md[None], idx_1m1, jnp.ones((1, m, 1)), *weights)[0]

    argnums = (0, 1, 2, 3)
    grads_ref, y_ref = jax.grad(functools.partial(loss, reference_ffn), argnums, has_aux=True)(
        x_md, *weights
    )
    for impl in ("ragged", "tiled", "hybrid"):  # hybrid: 8 rows per expert batched, 3 overflow
        ffn = lambda x, *w, impl=impl: grouped_ffn(x, *w, group_sizes_e, impl=impl, tile_size=4)
        grads, y_md = jax.jit(jax.grad(functools.partial(loss, ffn), argnums, has_aux=True))(
            x_md, *weights
        )
        names = [f"{impl} {name}" for name in ("y", "dx", "dw_gate", "dw_up", "dw_down")]
        _assert_all_close((y_md, *grads), (y_ref, *grads_ref), names)


# ---------------------------------------------------------------------------------------------
# dispatch

BACKEND_IMPLS = [("capacity", "auto"), ("dropless", "ragged"), ("dropless", "tiled"), ("dropless", "hybrid")]
GRAD_NAMES = ["dx", "dw_gtk", "dw_gate", "dw_up", "dw_down"]


def _loss(fn, cotangent_gtd, *args):
    """A cotangent that differs per position catches permutation mistakes a plain sum hides."""
    return jnp.sum(fn(*args) * cotangent_gtd)


def _grads(fn, cotangent_gtd, *args):
    """Gradients of _loss w.r.t. x, the combine weights and the three expert weights."""
    loss = functools.partial(_loss, fn)
    return jax.grad(loss, argnums=(1, 3, 4, 5, 6))(cotangent_gtd, *args)


@pytest.mark.parametrize("backend, impl", BACKEND_IMPLS)
def test_backends_match_per_token_reference_when_nothing_is_dropped(backend, impl):
    args = (jax.random.normal(jax.random.key(0), (G, T, D)), *_routing(1), *_expert_weights(2))
    cotangent_gtd = jax.random.normal(jax.random.key(3), (G, T, D))
    run = jax.jit(
        functools.partial(
            dispatch, cfg=DispatchConfig(backend=backend, capacity_factor=NO_DROPS, impl=impl, tile_size=4)
        )
    )

    y_gtd, stats = run(*args)
    np.testing.assert_allclose(y_gtd, _reference_moe(*args), **TOL)
    assert stats["drop_rate"].dtype == jnp.float32 and float(stats["drop_rate"]) == 0.0
    np.testing.assert_array_equal(
        stats["tokens_per_expert_e"], np.bincount(np.ravel(args[1]), minlength=E)
    )

    grads = jax.jit(functools.partial(_grads, lambda *a: run(*a)[0]))(cotangent_gtd, *args)
    grads_ref = _grads(_reference_moe, cotangent_gtd, *args)
    _assert_all_close(grads, grads_ref, GRAD_NAMES)


def test_capacity_drops_assignments_past_capacity_and_dropless_keeps_them():
    # One group of 4 tokens, top-1, capacity_factor 2 -> C = ceil(2 * 4 * 1 / 4) = 2 slots.
    # Tokens 0, 1, 2 pick expert 0: the third of them (token 2) finds no slot.
    x_gtd = jax.random.normal(jax.random.key(0), (1, 4, D))
    idx_gtk = jnp.array([[[0], [0], [0], [1]]], jnp.int32)
    w_gtk = jnp.array([[[0.9], [0.8], [0.7], [0.6]]], jnp.float32)
    weights = _expert_weights(1)
    assert expert_capacity(4, E, 1, 2.0) == 2

    y_gtd, stats = dispatch(x_gtd, idx_gtk, w_gtk, *weights, cfg=DispatchConfig(backend="capacity", capacity_factor=2))
    kept_gtk = jnp.array([[[1.0], [1.0], [0.0], [1.0]]])
    np.testing.assert_allclose(
        y_gtd, _reference_moe(x_gtd, idx_gtk, w_gtk * kept_gtk, *weights), **TOL
    )
    np.testing.assert_array_equal(y_gtd[0, 2], 0.0)
    assert float(stats["drop_rate"]) == pytest.approx(0.25)
    np.testing.assert_array_equal(stats["tokens_per_expert_e"], [3, 1, 0, 0])

    y_gtd, stats = dispatch(x_gtd, idx_gtk, w_gtk, *weights, cfg=DispatchConfig(backend="dropless", capacity_factor=2))
    np.testing.assert_allclose(y_gtd, _reference_moe(x_gtd, idx_gtk, w_gtk, *weights), **TOL)
    assert float(stats["drop_rate"]) == 0.0
    np.testing.assert_array_equal(stats["tokens_per_expert_e"], [3, 1, 0, 0])


def test_capacity_priority_is_choice_major():
    # 3 tokens, 3 experts, top-2, capacity_factor 1 -> C = 2. Expert 0 gets the first choices of
    # tokens 1 and 2 and the second choice of token 0; in choice-major order token 0's second
    # choice comes last and is the one dropped (token-major order would drop token 2's instead).
    x_gtd = jax.random.normal(jax.random.key(0), (1, 3, D))
    idx_gtk = jnp.array([[[1, 0], [0, 2], [0, 1]]], jnp.int32)
    w_gtk = jnp.array([[[0.6, 0.4], [0.7, 0.3], [0.5, 0.5]]], jnp.float32)
    weights = _expert_weights(1, e=3)

    y_gtd, stats = jax.jit(functools.partial(dispatch, cfg=DispatchConfig(backend="capacity", capacity_factor=1.0)))(
        x_gtd, idx_gtk, w_gtk, *weights
    )
    kept_gtk = jnp.array([[[1.0, 0.0], [1.0, 1.0], [1.0, 1.0]]])
    np.testing.assert_allclose(
        y_gtd, _reference_moe(x_gtd, idx_gtk, w_gtk * kept_gtk, *weights), **TOL
    )
    assert float(stats["drop_rate"]) == pytest.approx(1 / 6)
    np.testing.assert_array_equal(stats["tokens_per_expert_e"], [3, 2, 1])


def test_dropless_ragged_and_tiled_agree_on_skewed_routing():
    # Every token's first choice is expert 0; the second is expert 2 for every fifth token and
    # expert 1 otherwise; expert 3 gets nothing. Group sizes are not multiples of the tile.
    second_choice_gt = jnp.broadcast_to(jnp.where(jnp.arange(T) % 5 == 0, 2, 1), (G, T))
    idx_gtk = jnp.stack([jnp.zeros((G, T), jnp.int32), second_choice_gt], axis=-1)
    w_gtk = jax.nn.softmax(jax.random.normal(jax.random.key(1), (G, T, K)), axis=-1)
    args = (jax.random.normal(jax.random.key(0), (G, T, D)), idx_gtk, w_gtk, *_expert_weights(2))
    cotangent_gtd = jax.random.normal(jax.random.key(3), (G, T, D))

    results = {}
    for impl in ("ragged", "tiled", "hybrid"):  # hybrid: 16 rows per expert batched, expert 0's 16 overflow
        run = functools.partial(dispatch, cfg=DispatchConfig(backend="dropless", impl=impl, tile_size=8))
        y_gtd, stats = jax.jit(run)(*args)
        grads = jax.jit(functools.partial(_grads, lambda *a: run(*a)[0]))(cotangent_gtd, *args)
        results[impl] = (y_gtd, stats["tokens_per_expert_e"], *grads)
    _assert_all_close(results["tiled"], results["ragged"], ["y", "tokens_per_expert", *GRAD_NAMES])
    _assert_all_close(results["hybrid"], results["ragged"], ["y", "tokens_per_expert", *GRAD_NAMES])
    np.testing.assert_array_equal(results["tiled"][1], [2 * T, 2 * T - 8, 8, 0])


@pytest.mark.parametrize("backend, impl", BACKEND_IMPLS)
def test_dispatch_inside_shard_map_matches_unsharded(backend, impl):
    # Each data shard dispatches its own groups; the replicated expert weights get their grads
    # summed over the shards.
    mesh = jax.make_mesh((2,), ("data",), devices=jax.devices()[:2])
    args = (jax.random.normal(jax.random.key(0), (G, T, D)), *_routing(1), *_expert_weights(2))
    cotangent_gtd = jax.random.normal(jax.random.key(3), (G, T, D))
    run = functools.partial(
        dispatch, cfg=DispatchConfig(backend=backend, capacity_factor=NO_DROPS, impl=impl, tile_size=4)
    )

    specs = (P("data"),) * 3 + (P(),) * 3
    run_sharded = jax.shard_map(
        lambda *a: run(*a)[0], mesh=mesh, in_specs=specs, out_specs=P("data")
    )
    sharded_args = [jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip(args, specs)]
    sharded_cotangent = jax.device_put(cotangent_gtd, NamedSharding(mesh, P("data")))

    y_gtd = jax.jit(run_sharded)(*sharded_args)
    grads = jax.jit(functools.partial(_grads, run_sharded))(sharded_cotangent, *sharded_args)
    grads_ref = _grads(lambda *a: run(*a)[0], cotangent_gtd, *args)
    np.testing.assert_allclose(y_gtd, run(*args)[0], **TOL)
    _assert_all_close(grads, grads_ref, GRAD_NAMES)


@pytest.mark.parametrize("backend, impl", BACKEND_IMPLS)
def test_bfloat16_compute_keeps_dtype_with_float32_stats(backend, impl):
    x_gtd = jax.random.normal(jax.random.key(0), (G, T, D), jnp.bfloat16)
    idx_gtk, w_gtk = _routing(1)
    weights = _expert_weights(2, dtype=jnp.bfloat16)
    y_gtd, stats = dispatch(
        x_gtd, idx_gtk, w_gtk, *weights, cfg=DispatchConfig(backend=backend, capacity_factor=NO_DROPS, impl=impl)
    )
    assert y_gtd.dtype == jnp.bfloat16
    assert stats["drop_rate"].dtype == jnp.float32
    assert stats["tokens_per_expert_e"].dtype == jnp.float32
    weights_f32 = [w.astype(jnp.float32) for w in weights]
    reference = _reference_moe(x_gtd.astype(jnp.float32), idx_gtk, w_gtk, *weights_f32)
    np.testing.assert_allclose(y_gtd.astype(jnp.float32), reference, rtol=5e-2, atol=5e-2)


def test_expert_capacity():
    assert expert_capacity(16, 4, 2, 1.25) == 10
    assert expert_capacity(10, 1, 1, 1.1) == 11  # not 12 from 1.1 * 10 = 11.000000000000002
    assert expert_capacity(4, 64, 1, 1.0) == 1  # at least one slot
    assert expert_capacity(T, E, K, NO_DROPS) == T  # enough for any routing


def test_auto_impl_is_hybrid_on_cpu_where_ragged_dot_is_dense():
    assert jax.default_backend() == "cpu"
    assert resolve_impl("auto") == "hybrid"
    assert resolve_impl("auto", 8192, 16) == "hybrid" and resolve_impl("auto", 8192, 64) == "tiled"
    assert hybrid_capacity(8192, 8) == 1024 and hybrid_capacity(17, 5) == 8 and hybrid_capacity(6, 3) == 6


def test_bad_arguments_raise_clear_errors():
    args = (jnp.zeros((G, T, D)), *_routing(0), *_expert_weights(0))
    w_edf, x_md, sizes_e = args[3], jnp.zeros((4, D)), jnp.array([4, 0, 0, 0])
    assert BACKENDS == ("capacity", "dropless", "expert_parallel")
    assert IMPLS == ("auto", "ragged", "tokamax", "tiled", "hybrid")
    with pytest.raises(
        ValueError,
        match=r"backend must be one of \('capacity', 'dropless', 'expert_parallel'\), got 'sorted'",
    ):
        dispatch(*args, cfg=DispatchConfig(backend="sorted"))
    with pytest.raises(
        ValueError, match=r"impl must be one of \('auto', 'ragged', 'tokamax', 'tiled', 'hybrid'\), got 'pallas'"
    ):
        dispatch(*args, cfg=DispatchConfig(backend="dropless", impl="pallas"))
    with pytest.raises(ValueError, match=r"impl must be one of \('auto', 'ragged', 'tokamax', 'tiled', 'hybrid'\)"):
        grouped_matmul(x_md, w_edf, sizes_e, impl="dense")
    with pytest.raises(ValueError, match="tile_size must be a positive int, got 0"):
        grouped_matmul(x_md, w_edf, sizes_e, tile_size=0)
    with pytest.raises(ValueError, match="capacity_factor must be a finite number > 0, got 0"):
        dispatch(*args, cfg=DispatchConfig(backend="capacity", capacity_factor=0))
    with pytest.raises(ValueError, match=r"w_down_efd must have shape \(4, 12, 8\)"):
        dispatch(*args[:5], args[4], cfg=DispatchConfig(backend="capacity"))
    with pytest.raises(ValueError, match=r"group_sizes_e must have shape \(4,\)"):
        grouped_matmul(x_md, w_edf, jnp.array([4, 0]))


@pytest.mark.parametrize("e, k", [(8, 2), (128, 8)])
def test_capacity_slots_are_the_same_by_sort_and_by_one_hot_count(e, k):
    # The capacity backend counts slots with a one-hot cumsum for few experts and a stable sort per
    # group for many (cheaper as experts grow); both must give every assignment the same slot: the
    # number of earlier assignments (choice-major) to its expert in its group.
    from moejax.model import dispatch as dispatch_lib

    idx_gtk = jax.lax.top_k(jax.random.normal(jax.random.key(3), (3, 40, e)), k)[1].astype(jnp.int32)
    expert_gq = np.asarray(jnp.swapaxes(idx_gtk, 1, 2).reshape(3, k * 40))
    want_gq = np.array([[np.sum(row[:i] == row[i]) for i in range(len(row))] for row in expert_gq])
    want_gtk = np.swapaxes(want_gq.reshape(3, k, 40), 1, 2)
    np.testing.assert_array_equal(dispatch_lib._capacity_slots(idx_gtk, e), want_gtk)
    assert (e >= dispatch_lib.SORTED_SLOTS_FROM_EXPERTS) == (e == 128)
