"""Expert-parallel dispatch equals dropless (values and grads) on real meshes, drops exactly what its
bounded buffers cannot hold (counted globally), keeps memory static under extreme imbalance, and
trains like dropless on one device."""

import contextlib
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from moejax import sharding
from moejax.checks import validate
from moejax.config import default_config
from moejax.errors import ConfigError
from moejax.model.dispatch import dispatch
from moejax.model.expert_parallel import pair_capacity
from moejax.model.moe import MoE
from moejax.schema import DispatchConfig, MoEConfig
from tests.test_sharding import ONE, tiny_cfg, train_losses

G, T, D, F, E, K = 16, 8, 8, 8, 8, 2
TOL = dict(rtol=1e-5, atol=1e-5)
NAMES = ["y", "dx", "dw_gtk", "dw_gate", "dw_up", "dw_down"]
DROPLESS = 64.0  # ep_capacity_factor >= every mesh's expert size here: nothing can be dropped


def _mesh(**shape):
    full = {axis: shape.get(axis, 1) for axis in ("data", "fsdp", "expert", "tensor")}
    return sharding.make_mesh(full, jax.devices()[: math.prod(full.values())])


def _args(idx_gtk=None, w_gtk=None, g=G):
    keys = jax.random.split(jax.random.key(0), 5)
    x_gtd = jax.random.normal(keys[0], (g, T, D))
    if idx_gtk is None:
        w_gtk, idx_gtk = jax.lax.top_k(jax.random.normal(keys[1], (g, T, E)), K)
        w_gtk, idx_gtk = jax.nn.softmax(w_gtk, axis=-1), idx_gtk.astype(jnp.int32)
    w_gate_edf = jax.random.normal(keys[2], (E, D, F)) / D**0.5
    w_up_edf = jax.random.normal(keys[3], (E, D, F)) / D**0.5
    w_down_efd = jax.random.normal(keys[4], (E, F, D)) / F**0.5
    return x_gtd, idx_gtk, w_gtk, w_gate_edf, w_up_edf, w_down_efd


COTANGENT_GTD = jax.random.normal(jax.random.key(9), (G, T, D))


def _run(mesh, *args, **kw):
    """Output, stats and the grads w.r.t. x, the combine weights and the expert weights, one jit."""
    run = functools.partial(dispatch, cfg=DispatchConfig(impl="tiled", tile_size=4, **kw))

    def loss(*a):
        y_gtd, stats = run(*a)
        return jnp.sum(y_gtd * COTANGENT_GTD[: y_gtd.shape[0]]), (y_gtd, stats)

    grad_fn = jax.jit(jax.value_and_grad(loss, argnums=(0, 2, 3, 4, 5), has_aux=True))
    with contextlib.nullcontext() if mesh is None else jax.set_mesh(mesh):
        (_, (y_gtd, stats)), grads = grad_fn(*args)
    return (y_gtd, *grads), stats


def _assert_close(actual, expected, names=NAMES):
    for name, a, b in zip(names, actual, expected, strict=True):
        np.testing.assert_allclose(a, b, **TOL, err_msg=name)


@functools.cache
def _dropless():
    return _run(None, *_args(), backend="dropless")


@pytest.mark.parametrize(
    "shape, comm",
    [
        (dict(expert=2), "all_to_all"),
        (dict(expert=4), "all_gather"),
        (dict(expert=8), "all_to_all"),
        (dict(expert=8), "all_gather"),
        (dict(data=2, fsdp=2, expert=2), "all_to_all"),
        (dict(data=2, fsdp=2, expert=2), "all_gather"),
        (dict(fsdp=2, expert=4), "all_to_all"),
        (dict(data=4, expert=2), "all_gather"),
        (dict(data=2, expert=2, tensor=2), "all_to_all"),
        (dict(data=2, expert=2, tensor=2), "all_gather"),
    ],
    ids=lambda v: v if isinstance(v, str) else "-".join(f"{a}{n}" for a, n in v.items()),
)
def test_matches_dropless_values_and_grads(shape, comm):
    # The output cotangent differs per position, so any token or slot mix-up shows in the grads.
    outputs, stats = _run(
        _mesh(**shape), *_args(), backend="expert_parallel", ep_comm=comm, ep_capacity_factor=DROPLESS
    )
    ref_outputs, ref_stats = _dropless()
    _assert_close(outputs, ref_outputs)
    assert float(stats["drop_rate"]) == 0.0
    np.testing.assert_array_equal(stats["tokens_per_expert_e"], ref_stats["tokens_per_expert_e"])


@pytest.mark.parametrize(
    "shape, g", [(None, G), (dict(data=8), G), (dict(data=2, expert=4), 2)], ids=["no-mesh", "data8", "2-groups"]
)
def test_computes_as_dropless_without_an_expert_axis_or_an_even_split(shape, g):
    # No mesh; a mesh without expert parallelism; 2 groups cannot split over 8 batch shards.
    args = _args(g=g)
    mesh = None if shape is None else _mesh(**shape)
    outputs, stats = _run(mesh, *args, backend="expert_parallel", ep_capacity_factor=1.0)
    ref_outputs = _dropless()[0] if g == G else _run(None, *args, backend="dropless")[0]
    _assert_close(outputs, ref_outputs)
    assert float(stats["drop_rate"]) == 0.0


def _kept_reference(idx_gtk, shards, peers, factor):
    """Which assignments fit, by the documented rule, computed assignment by assignment.

    Each batch shard holds G / shards consecutive groups; it walks its assignments choice-major
    (all first choices in token order, then all second choices) and keeps an assignment while its
    destination peer (expert // experts per peer) has a free one of its c slots.
    """
    idx_gtk = np.asarray(idx_gtk)
    g, t, k = idx_gtk.shape
    groups = g // shards
    q = groups * t * k
    c = min(q, max(1, math.ceil(factor * q / peers)))
    kept_gtk = np.zeros(idx_gtk.shape, bool)
    for shard in range(shards):
        used_p = np.zeros(peers, int)
        for choice in range(k):
            for group in range(shard * groups, (shard + 1) * groups):
                for token in range(t):
                    dest = idx_gtk[group, token, choice] // (E // peers)
                    if used_p[dest] < c:
                        kept_gtk[group, token, choice] = True
                        used_p[dest] += 1
    return kept_gtk


@pytest.mark.parametrize("comm", ["all_to_all", "all_gather"])
def test_drops_exactly_the_assignments_past_the_slots(comm):
    # Random routing, factor 1: some (source, destination) pairs overflow their c slots.
    args = _args()
    outputs, stats = _run(
        _mesh(data=2, expert=4), *args, backend="expert_parallel", ep_comm=comm, ep_capacity_factor=1.0
    )
    kept_gtk = _kept_reference(args[1], shards=8, peers=4, factor=1.0)
    assert 0 < (~kept_gtk).sum()
    assert float(stats["drop_rate"]) == pytest.approx((~kept_gtk).mean(), abs=1e-7)
    np.testing.assert_array_equal(stats["tokens_per_expert_e"], np.bincount(np.ravel(args[1]), minlength=E))
    # Kept assignments are computed as dropless; dropped ones contribute zero.
    masked_args = (args[0], args[1], args[2] * kept_gtk, *args[3:])
    ref_outputs, _ = _run(None, *masked_args, backend="dropless")
    without_dw_gtk = lambda o: o[:2] + o[3:]
    _assert_close(without_dw_gtk(outputs), without_dw_gtk(ref_outputs), without_dw_gtk(NAMES))
    # A dropped assignment's combine weight has no effect: its gradient is zero.
    np.testing.assert_allclose(outputs[2], ref_outputs[2] * kept_gtk, **TOL)


def _all_to_experts_0_and_1():
    idx_gtk = jnp.broadcast_to(jnp.array([0, 1], jnp.int32), (G, T, K))
    return _args(idx_gtk, jnp.full((G, T, K), 0.5, jnp.float32))


@pytest.mark.parametrize("comm", ["all_to_all", "all_gather"])
def test_extreme_imbalance_drops_the_overflow_and_stays_finite(comm):
    # Every token picks experts 0 and 1, which live on peers 0 and 1 of an 8-way expert axis.
    # Each device holds 16 tokens, q = 32 assignments, c = ceil(1 * 32 / 8) = 4 slots per peer:
    # the first 4 tokens of each device keep both choices, the other 12 lose both.
    args = _all_to_experts_0_and_1()
    outputs, stats = _run(
        _mesh(expert=8), *args, backend="expert_parallel", ep_comm=comm, ep_capacity_factor=1.0
    )
    kept_gtk = _kept_reference(args[1], shards=8, peers=8, factor=1.0)
    kept_st = np.tile(np.arange(16) < 4, 8).reshape(G, T)
    np.testing.assert_array_equal(kept_gtk, np.repeat(kept_st[..., None], K, axis=-1))
    assert all(np.isfinite(o).all() for o in outputs)
    assert float(stats["drop_rate"]) == 0.75
    np.testing.assert_array_equal(stats["tokens_per_expert_e"], [G * T, G * T, 0, 0, 0, 0, 0, 0])
    np.testing.assert_array_equal(outputs[0][~kept_st], 0.0)
    ref_outputs, _ = _run(None, args[0], args[1], args[2] * kept_gtk, *args[3:], backend="dropless")
    np.testing.assert_allclose(outputs[0], ref_outputs[0], **TOL)


def test_memory_is_set_by_the_factor_not_by_the_routing():
    # The buffers' shapes depend on the factor only: one compiled program serves any routing, and
    # its temp memory (what XLA reserves) grows with the factor. The extreme routing runs in it.
    mesh = _mesh(expert=8)
    run = lambda factor: functools.partial(
        dispatch, cfg=DispatchConfig(backend="expert_parallel", ep_capacity_factor=factor, impl="tiled", tile_size=4)
    )
    with jax.set_mesh(mesh):
        compiled = {f: jax.jit(run(f)).lower(*_args()).compile() for f in (1.0, 8.0)}
        temp = {f: c.memory_analysis().temp_size_in_bytes for f, c in compiled.items()}
        y_gtd, stats = compiled[1.0](*_all_to_experts_0_and_1())
    assert temp[1.0] < temp[8.0]
    assert np.isfinite(y_gtd).all() and float(stats["drop_rate"]) == 0.75
    # 16 tokens x 2 choices per device: 4 slots per peer (32 buffer rows), 32 when dropless.
    assert pair_capacity(32, 8, 1.0) == 4 and pair_capacity(32, 8, 8.0) == 32


def test_pair_capacity():
    assert pair_capacity(32, 8, 1.0) == 4
    assert pair_capacity(32, 8, 1.25) == 5
    assert pair_capacity(10, 1, 1.1) == 10  # capped at q
    assert pair_capacity(100, 10, 1.1) == 11  # not 12 from 1.1 * 10 = 11.000000000000002
    assert pair_capacity(4, 64, 1.0) == 1  # at least one slot
    assert pair_capacity(32, 8, 100.0) == 32  # never more than every assignment


def _moe_outputs(factor, mesh):
    """The MoE block with a zero router (every token ties and picks experts 0 and 1), jitted."""
    cfg = tiny_cfg("expert_parallel").model
    cfg.moe.num_experts, cfg.moe.ep_capacity_factor = E, factor
    moe = MoE(cfg.d_model, MoEConfig.from_config(cfg.moe), std=cfg.init_std, out_std=0.02, rngs=nnx.Rngs(0),
              dtype=jnp.float32, param_dtype=jnp.float32)
    moe.router.w_de[...] = jnp.zeros_like(moe.router.w_de[...])
    x_btd = jax.random.normal(jax.random.key(1), (G, T, cfg.d_model))
    run = nnx.jit(lambda moe, x: moe(x))
    with contextlib.nullcontext() if mesh is None else jax.set_mesh(mesh):
        return run(moe, x_btd)


def test_moe_block_passes_the_config_knobs():
    # Factor 1 on 8 devices: 4 of each device's 16 tokens keep their slots (see above).
    y_btd, aux = _moe_outputs(1.0, _mesh(expert=8))
    assert float(aux["drop_rate"]) == 0.75
    y_ref_btd, aux_ref = _moe_outputs(8.0, None)  # no mesh: dropless
    kept_bt = np.tile(np.arange(16) < 4, 8).reshape(G, T)
    np.testing.assert_allclose(y_btd[kept_bt], y_ref_btd[kept_bt], **TOL)
    assert float(aux_ref["drop_rate"]) == 0.0


@pytest.mark.slow  # two train-step compiles: about 30 s of CPU time
def test_trains_like_dropless_on_one_device():
    cfg = tiny_cfg("expert_parallel")
    cfg.model.moe.ep_capacity_factor = 4.0  # = mesh.expert: dropless
    ref_losses, ref_params = train_losses(tiny_cfg("dropless"), ONE, jax.devices()[:1])
    losses, params = train_losses(cfg, {"data": 2, "fsdp": 1, "expert": 4, "tensor": 1}, jax.devices())
    np.testing.assert_allclose(losses, ref_losses, rtol=2e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=2e-5), params, ref_params)


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("ep_comm", "ring", r"'model.moe.ep_comm' has value 'ring'; allowed: all_to_all \| all_gather"),
        ("ep_capacity_factor", 0.0, r"'model.moe.ep_capacity_factor' has value 0.0; allowed: a positive value"),
        ("backend", "ep", r"allowed: dropless \| capacity \| expert_parallel"),
    ],
)
def test_config_rejects_bad_values(key, value, message):
    cfg = default_config()
    cfg.model.moe[key] = value
    with pytest.raises(ConfigError, match=message):
        validate(cfg, 8)


def test_bad_arguments_raise_clear_errors():
    args = _args()
    with pytest.raises(ValueError, match=r"ep_comm must be one of \('all_to_all', 'all_gather'\), got 'ring'"):
        dispatch(*args, cfg=DispatchConfig(backend="expert_parallel", ep_comm="ring"))
    with pytest.raises(ValueError, match="ep_capacity_factor must be a finite number > 0, got 0"):
        dispatch(*args, cfg=DispatchConfig(backend="expert_parallel", ep_capacity_factor=0))
