"""Least-Loaded Expert Parallelism (``model.moe.ep_balance = "llep"``): the plan follows its rule
(checked against an assignment-by-assignment reference), LLEP equals dropless in values and
gradients on real meshes for balanced, Zipf-skewed and all-to-two-experts routing when the spill
capacity suffices, drops exactly the least the slots allow when it does not, bad configs fail
before compile, and generation/evaluation under repetitive (RepetitionCurse-style) prompts lose no
tokens.

Compile time is the cost: one jitted forward + backward per mesh serves every routing (the routing
is data, not shape)."""

import contextlib
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from moejax import sharding
from moejax.checks import validate
from moejax.config import default_config
from moejax.errors import ConfigError
from moejax.model import llep
from moejax.model.dispatch import dispatch
from moejax.schema import DispatchConfig

G, T, D, F, E, K = 16, 8, 8, 8, 8, 2  # 128 tokens, 256 assignments
TOL = dict(rtol=1e-5, atol=1e-5)
NAMES = ["y", "dx", "dw_gtk", "dw_gate", "dw_up", "dw_down"]


def _mesh(**shape):
    full = {axis: shape.get(axis, 1) for axis in ("data", "fsdp", "expert", "tensor")}
    return sharding.make_mesh(full, jax.devices()[: math.prod(full.values())])


def _weights():
    keys = jax.random.split(jax.random.key(0), 4)
    return (
        jax.random.normal(keys[0], (G, T, D)),
        jax.random.normal(keys[1], (E, D, F)) / D**0.5,
        jax.random.normal(keys[2], (E, D, F)) / D**0.5,
        jax.random.normal(keys[3], (E, F, D)) / F**0.5,
    )


def _routing(kind: str):
    """idx_gtk, w_gtk: ``balanced`` (top-2 of Gaussian logits), ``zipf`` (experts drawn without
    replacement with probability ~ 1 / rank^1.5: a few experts take most tokens), ``extreme``
    (every token picks experts 0 and 1)."""
    key_l, key_w = jax.random.split(jax.random.key(1))
    w_gtk = jax.nn.softmax(jax.random.normal(key_w, (G, T, K)), axis=-1)
    if kind == "extreme":
        return jnp.broadcast_to(jnp.array([0, 1], jnp.int32), (G, T, K)), w_gtk
    logits_gte = jax.random.normal(key_l, (G, T, E))
    if kind == "zipf":  # Gumbel top-k = sampling without replacement from softmax(log p)
        logits_gte = jax.random.gumbel(key_l, (G, T, E)) - 1.5 * jnp.log(jnp.arange(1, E + 1))
    return jax.lax.top_k(logits_gte, K)[1].astype(jnp.int32), w_gtk


COTANGENT_GTD = jax.random.normal(jax.random.key(9), (G, T, D))


@functools.cache
def _compiled(mesh_items, **kw):
    """jit(value_and_grad) of the dispatch on the mesh ``dict(mesh_items)`` (None: no mesh)."""
    run = functools.partial(dispatch, cfg=DispatchConfig(impl="tiled", tile_size=4, **kw))

    def loss(x_gtd, idx_gtk, w_gtk, *w):
        y_gtd, stats = run(x_gtd, idx_gtk, w_gtk, *w)
        return jnp.sum(y_gtd * COTANGENT_GTD), (y_gtd, stats)

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 2, 3, 4, 5), has_aux=True))


def _run(mesh_shape, idx_gtk, w_gtk, **kw):
    x_gtd, *w = _weights()
    mesh_items = None if mesh_shape is None else tuple(sorted(mesh_shape.items()))
    fn = _compiled(mesh_items, **kw)
    with contextlib.nullcontext() if mesh_shape is None else jax.set_mesh(_mesh(**mesh_shape)):
        (_, (y_gtd, stats)), grads = fn(x_gtd, idx_gtk, w_gtk, *w)
    return (y_gtd, *grads), stats


def _assert_close(actual, expected, names=NAMES):
    for name, a, b in zip(names, actual, expected, strict=True):
        np.testing.assert_allclose(a, b, **TOL, err_msg=name)


def _llep(mesh_shape, idx_gtk, w_gtk, *, native=1.0, slots=None, spill=1.0):
    """LLEP with native rows = q; by default S = E / P + 1 slots of q rows: enough for any routing."""
    p = mesh_shape["expert"]
    slots = E // p + 1 if slots is None else slots
    return _run(
        mesh_shape, idx_gtk, w_gtk, backend="expert_parallel", ep_comm="all_gather", ep_balance="llep",
        ep_capacity_factor=native, ep_spill_slots=slots, ep_spill_capacity_factor=spill,
    )


# ---------------------------------------------------------------------------------------------
# The plan against an independent, assignment-by-assignment reference of the documented rule.


def _plan_reference(expert_w, p, e, n, slots, c):
    """(device, row) per assignment, each slot's expert, and loads, by the rule in moejax.model.llep."""
    expert_w = np.asarray(expert_w)
    num_experts = p * e
    device_w = np.full(len(expert_w), p)
    row_w = np.full(len(expert_w), n + slots * c)
    used_p, excess = np.zeros(p, int), {x: [] for x in range(num_experts)}
    for w, x in enumerate(expert_w):  # 1. native, in priority order
        home = x // e
        if used_p[home] < n:
            device_w[w], row_w[w] = home, used_p[home]
            used_p[home] += 1
        else:
            excess[x].append(w)
    load_p, hosted_p = used_p.copy(), [[] for _ in range(p)]
    slot_expert_ps = np.full((p, slots), num_experts)
    for _ in range(p * slots):  # 2. spill: largest excess to the least-loaded device with a free slot
        x = max(range(num_experts), key=lambda x: (len(excess[x]), -x))
        if not excess[x]:
            break
        dev = min((j for j in range(p) if len(hosted_p[j]) < slots), key=lambda j: (load_p[j], j))
        slot = len(hosted_p[dev])
        hosted_p[dev].append(x)
        slot_expert_ps[dev, slot] = x
        chunk, excess[x] = excess[x][:c], excess[x][c:]
        for i, w in enumerate(chunk):
            device_w[w], row_w[w] = dev, n + slot * c + i
        load_p[dev] += len(chunk)
    return device_w, row_w, slot_expert_ps, load_p


def _priority_ids(idx_gtk):
    """The group's expert ids in priority order (choice, device, token), for a pure-expert mesh."""
    return np.asarray(idx_gtk).reshape(G * T, K).T.reshape(-1)


@pytest.mark.parametrize("kind", ["balanced", "zipf", "extreme"])
@pytest.mark.parametrize("p, n_factor, slots, c_factor", [(8, 1.0, 2, 1.0), (4, 1.25, 1, 0.5), (2, 1.0, 3, 0.3)])
def test_plan_follows_the_rule(kind, p, n_factor, slots, c_factor):
    expert_w = _priority_ids(_routing(kind)[0])
    q = len(expert_w) // p
    n, c = llep.buffer_rows(q, p, n_factor), llep.buffer_rows(q, p, c_factor)
    got = llep.plan(jnp.asarray(expert_w), peers=p, local_experts=E // p, native_rows=n, spill_slots=slots,
                    spill_rows=c)
    want = _plan_reference(expert_w, p, E // p, n, slots, c)
    for name, a, b in zip(("device_w", "row_w", "slot_expert_ps", "load_p"), got, want, strict=True):
        np.testing.assert_array_equal(a, b, err_msg=name)
    # Every kept assignment has its own row, on a device that hosts its expert.
    kept = want[0] < p
    assert len({(d, r) for d, r in zip(want[0][kept], want[1][kept])}) == kept.sum()
    np.testing.assert_array_equal(np.bincount(want[0][kept], minlength=p), want[3])


def test_plan_spreads_an_overloaded_expert_evenly():
    # 8 devices, every token on experts 0 and 1 (devices 0 and 1): q rows native each, 3 devices
    # help each overloaded expert with q rows: every device ends with exactly q = 32 rows.
    expert_w = _priority_ids(_routing("extreme")[0])
    the_plan = llep.plan(jnp.asarray(expert_w), peers=8, local_experts=1, native_rows=32, spill_slots=1,
                         spill_rows=32)
    np.testing.assert_array_equal(the_plan.load_p, [32] * 8)
    assert int(jnp.sum(the_plan.device_w < 8)) == 256
    np.testing.assert_array_equal(llep.standard_ep_load(jnp.asarray(expert_w), peers=8, local_experts=1),
                                  [128, 128, 0, 0, 0, 0, 0, 0])


def test_buffer_rows():
    assert llep.buffer_rows(32, 8, 1.0) == 32
    assert llep.buffer_rows(10, 8, 1.1) == 11  # not 12 from float rounding
    assert llep.buffer_rows(32, 8, 0.01) == 1  # at least one row
    assert llep.buffer_rows(32, 8, 100.0) == 256  # never more than the group's assignments


# ---------------------------------------------------------------------------------------------
# Exactness on meshes: LLEP == dropless in values and gradients when the spill capacity suffices.

ROUTINGS = ("balanced", "zipf", "extreme")


@functools.cache
def _dropless(kind):
    return _run(None, *_routing(kind), backend="dropless")


@pytest.mark.parametrize(
    "shape",
    [dict(expert=2), dict(expert=4), dict(expert=8), dict(data=2, fsdp=2, expert=2), dict(data=2, expert=2, tensor=2)],
    ids=lambda v: "-".join(f"{a}{n}" for a, n in v.items()),
)
def test_matches_dropless_values_and_grads(shape):
    for kind in ROUTINGS:  # one compiled program per mesh runs every routing
        outputs, stats = _llep(shape, *_routing(kind))
        ref_outputs, ref_stats = _dropless(kind)
        _assert_close(outputs, ref_outputs, [f"{kind}: {name}" for name in NAMES])
        assert float(stats["drop_rate"]) == 0.0, kind
        np.testing.assert_array_equal(stats["tokens_per_expert_e"], ref_stats["tokens_per_expert_e"])


def test_drop_mode_on_the_same_routing_loses_tokens():
    # The comparison that makes the above mean something: standard EP at its default factor 2
    # drops most of the extreme routing's assignments on 8 devices (c = 8 slots per device pair).
    _, stats = _run(dict(expert=8), *_routing("extreme"), backend="expert_parallel", ep_capacity_factor=2.0)
    assert float(stats["drop_rate"]) == 0.5


def test_too_little_spill_capacity_drops_the_least_and_reports_it():
    # 8 devices, experts 0 and 1 take every token: 128 assignments each, q = 32 native rows on
    # devices 0 and 1, 96 excess each. One slot of 16 rows per device: 8 slots place 128 of the 192
    # excess assignments, every slot full, so no plan with these buffers keeps more: 64 dropped.
    idx_gtk, w_gtk = _routing("extreme")
    outputs, stats = _llep(dict(expert=8), idx_gtk, w_gtk, slots=1, spill=0.5)
    assert float(stats["drop_rate"]) == pytest.approx(64 / 256)
    expert_w = _priority_ids(idx_gtk)
    device_w = _plan_reference(expert_w, 8, 1, 32, 1, 16)[0]
    kept_gtk = (device_w < 8).reshape(K, G * T).T.reshape(G, T, K)
    assert (~kept_gtk).sum() == 64
    # Kept assignments are computed as dropless; dropped ones contribute zero (grads included).
    ref_outputs, _ = _run(None, idx_gtk, w_gtk * kept_gtk, backend="dropless")
    without_dw_gtk = lambda o: o[:2] + o[3:]
    _assert_close(without_dw_gtk(outputs), without_dw_gtk(ref_outputs), without_dw_gtk(NAMES))
    np.testing.assert_allclose(outputs[2], ref_outputs[2] * kept_gtk, **TOL)


def test_one_compiled_program_serves_every_routing_with_static_memory():
    # Buffers are set by the config and the batch: the program compiled for one routing runs the
    # others, and its temp memory is what the compiled memory analysis says, whatever the routing.
    mesh = _mesh(expert=8)
    run = functools.partial(
        dispatch, cfg=DispatchConfig(
            backend="expert_parallel", ep_comm="all_gather", ep_balance="llep", ep_capacity_factor=1.0,
            ep_spill_slots=2, ep_spill_capacity_factor=1.0, impl="tiled", tile_size=4,
        ),
    )
    x_gtd, *w = _weights()
    with jax.set_mesh(mesh):
        compiled = jax.jit(run).lower(x_gtd, *_routing("balanced"), *w).compile()
        assert compiled.memory_analysis().temp_size_in_bytes > 0
        for kind in ROUTINGS:
            y_gtd, stats = compiled(x_gtd, *_routing(kind), *w)
            assert np.isfinite(y_gtd).all() and float(stats["drop_rate"]) == 0.0, kind


# ---------------------------------------------------------------------------------------------
# The imbalance threshold: standard EP's exchange under it, the spill at or above it.


def _round_robin():
    """Perfectly balanced routing: token i picks experts i and i + 1 (mod E), so every device pair
    of an expert=8 mesh exchanges exactly q / P assignments."""
    i_gt = jnp.arange(G * T, dtype=jnp.int32).reshape(G, T)
    return jnp.stack([i_gt % E, (i_gt + 1) % E], axis=-1), _routing("balanced")[1]


THRESHOLD_KW = dict(backend="expert_parallel", ep_comm="all_to_all", ep_capacity_factor=1.0)


def test_under_the_threshold_llep_is_standard_ep_exactly():
    # Balanced routing: LLEP takes standard EP's exchange (no plan, no weight ring, no spill rows)
    # with the threshold (default 1.3) as its capacity factor, so values and gradients are those of
    # standard EP at factor 1.3 bit for bit, and the step counts no engagement.
    idx_gtk, w_gtk = _round_robin()
    outputs, stats = _run(dict(expert=8), idx_gtk, w_gtk, ep_balance="llep", **THRESHOLD_KW)
    ref_outputs, ref_stats = _run(dict(expert=8), idx_gtk, w_gtk, ep_balance="drop",
                                  **{**THRESHOLD_KW, "ep_capacity_factor": 1.3})
    for name, a, b in zip(NAMES, outputs, ref_outputs, strict=True):
        np.testing.assert_array_equal(a, b, err_msg=name)
    assert float(stats["llep_engaged"]) == 0.0 and float(stats["drop_rate"]) == 0.0
    assert "llep_engaged" not in ref_stats


def test_over_the_threshold_llep_spills_and_drops_nothing():
    # Every token on experts 0 and 1: standard EP at factor 1 drops 3/4; the same LLEP program
    # spills (engaged in the one expert group) and matches dropless in values and gradients.
    idx_gtk, w_gtk = _routing("extreme")
    outputs, stats = _run(dict(expert=8), idx_gtk, w_gtk, ep_balance="llep", **THRESHOLD_KW)
    assert float(stats["llep_engaged"]) == 1.0 and float(stats["drop_rate"]) == 0.0
    _assert_close(outputs, _dropless("extreme")[0])
    _, drop_stats = _run(dict(expert=8), idx_gtk, w_gtk, ep_balance="drop", **THRESHOLD_KW)
    assert float(drop_stats["drop_rate"]) == 0.75


def test_one_imbalanced_expert_group_spills_the_whole_mesh():
    # data=2 x expert=4: one group's sequences route round-robin, the other's all to experts 0 and 1.
    # The branches run different collectives, so the mesh decides once: it spills (engaged = 1),
    # and the whole batch equals dropless.
    rr_idx, w_gtk = _round_robin()
    extreme_idx = _routing("extreme")[0]
    idx_gtk = jnp.concatenate([rr_idx[: G // 2], extreme_idx[G // 2:]])
    outputs, stats = _run(dict(data=2, expert=4), idx_gtk, w_gtk, ep_balance="llep", **THRESHOLD_KW)
    assert float(stats["llep_engaged"]) == 1.0 and float(stats["drop_rate"]) == 0.0
    _assert_close(outputs, _run(None, idx_gtk, w_gtk, backend="dropless")[0])


def test_pair_overflow_under_the_threshold_still_spills():
    # Threshold 2: device 0's tokens all pick experts 0 and 1, the other devices route round-robin.
    # Device loads stay under 2x the mean (44 of 32 at most), but device 0 sends 16 assignments to
    # each of devices 0 and 1, past the 8 slots per pair of standard EP at factor 2, which drops
    # them. LLEP spills instead: the threshold never trades an assignment for speed.
    rr_idx, w_gtk = _round_robin()
    idx_gtk = jnp.concatenate([_routing("extreme")[0][: G // 8], rr_idx[G // 8:]])
    _, stats = _run(dict(expert=8), idx_gtk, w_gtk, ep_balance="llep", ep_llep_threshold=2.0, **THRESHOLD_KW)
    assert float(stats["llep_engaged"]) == 1.0 and float(stats["drop_rate"]) == 0.0
    _, drop_stats = _run(dict(expert=8), idx_gtk, w_gtk, ep_balance="drop", **{**THRESHOLD_KW, "ep_capacity_factor": 2.0})
    assert float(drop_stats["drop_rate"]) == 16 / 256


# ---------------------------------------------------------------------------------------------
# Bad input: clear errors before compile.


def _llep_cfg(**changes):
    cfg = default_config()
    cfg.train.global_batch_size = 16
    moe = cfg.model.moe
    moe.backend, moe.ep_comm, moe.ep_balance, moe.ep_capacity_factor = "expert_parallel", "all_gather", "llep", 1.0
    cfg.mesh.data, cfg.mesh.expert = 1, 8
    for key, value in changes.items():
        section, name = key.rsplit(".", 1)
        functools.reduce(getattr, section.split("."), cfg)[name] = value
    return cfg


def test_a_good_llep_config_validates():
    assert validate(_llep_cfg(), 8)["expert"] == 8


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"model.moe.ep_balance": "spill"}, r"'model.moe.ep_balance' has value 'spill'; allowed: drop \| llep"),
        ({"model.moe.backend": "dropless"}, r"'model.moe.ep_balance' has value 'llep'; allowed: 'drop' with "
                                            r"model.moe.backend='dropless'"),
        ({"mesh.expert": 1, "mesh.data": 8}, r"'model.moe.ep_balance' has value 'llep'; allowed: 'drop' with "
                                             r"mesh.expert=1. LLEP needs an expert mesh axis"),
        ({"model.moe.ep_llep_threshold": 0.0},
         r"'model.moe.ep_llep_threshold' has value 0.0; allowed: a positive value"),
        ({"model.moe.ep_spill_slots": 0}, r"'model.moe.ep_spill_slots' has value 0; allowed: a positive value"),
        ({"model.moe.ep_spill_slots": 9}, r"'model.moe.ep_spill_slots' has value 9; allowed: at most "
                                          r"model.moe.num_experts=8 \(each slot hosts one expert's weights\)"),
        ({"model.moe.ep_spill_capacity_factor": 0.0},
         r"'model.moe.ep_spill_capacity_factor' has value 0.0; allowed: a positive value"),
        ({"model.moe.ep_capacity_factor": 8.0}, r"'model.moe.ep_capacity_factor' has value 8.0; allowed: less "
                                                r"than mesh.expert=8 with model.moe.ep_balance=llep"),
    ],
    ids=["unknown", "not-ep-backend", "no-expert-axis", "no-threshold", "no-slots", "too-many-slots",
         "no-spill-rows", "cf-too-large"],
)
def test_config_rejects_bad_llep_settings(changes, message):
    with pytest.raises(ConfigError, match=message):
        validate(_llep_cfg(**changes), 8)


def test_dispatch_rejects_bad_llep_arguments():
    x_gtd, *w = _weights()
    args = (x_gtd, *_routing("balanced"), *w)
    llep_kw = dict(backend="expert_parallel", ep_balance="llep", ep_comm="all_gather")
    with pytest.raises(ValueError, match=r"ep_balance must be one of \('drop', 'llep'\), got 'x'"):
        dispatch(*args, cfg=DispatchConfig(backend="expert_parallel", ep_balance="x"))
    with jax.set_mesh(_mesh(expert=8)):
        with pytest.raises(ValueError, match=r"ep_llep_threshold must be a finite number > 0, got -1.0"):
            dispatch(*args, cfg=DispatchConfig(**llep_kw, ep_llep_threshold=-1.0))
        with pytest.raises(ValueError, match=r"ep_spill_slots must be an int >= 1"):
            dispatch(*args, cfg=DispatchConfig(**llep_kw, ep_spill_slots=0))
        with pytest.raises(ValueError, match=r"ep_spill_capacity_factor must be a finite number > 0"):
            dispatch(*args, cfg=DispatchConfig(**llep_kw, ep_spill_capacity_factor=-1.0))


# ---------------------------------------------------------------------------------------------
# Adversarial (RepetitionCurse-style) prompts through evaluation and generation.


def repetitive_prompts(batch: int, length: int) -> np.ndarray:
    """Repetitive token patterns, the RepetitionCurse attack's shape: each row repeats one token or a
    two-token pattern, so every position has (nearly) the same hidden state and routes to the same
    experts. int32 [batch, length]."""
    rows = [np.full(length, 97) if b % 2 == 0 else np.tile([97, 98], length)[:length] for b in range(batch)]
    return np.stack(rows).astype(np.int32)


def _model_cfg(balance, backend="expert_parallel"):
    from tests.test_sharding import tiny_cfg

    cfg = tiny_cfg(backend)
    moe = cfg.model.moe
    moe.num_experts, moe.ep_comm, moe.ep_balance = 8, "all_gather", balance
    moe.ep_capacity_factor = 1.0 if balance == "llep" else 2.0  # drop: the default factor
    cfg.mesh.data, cfg.mesh.expert = 1, 8
    return cfg


@functools.cache
def _run_of(balance, backend="expert_parallel", expert=8):
    from moejax.train.state import setup

    cfg = _model_cfg(balance, backend)
    return cfg, setup(cfg, _mesh(expert=expert))


@functools.cache
def _params():
    """Parameters on the expert=8 mesh, experts 30x stronger than at init so that a lost assignment
    visibly changes the logits."""
    from moejax.train.state import init_state

    cfg, run = _run_of("llep")
    state = init_state(cfg, run)
    params = jax.tree_util.tree_map_with_path(
        lambda path, x: x * 30.0 if "w_down_efd" in jax.tree_util.keystr(path) else x, state["params"]
    )
    return params, state["balance"]


def _model(balance):
    return (*_run_of(balance), *_params())


def _reference_model():
    """The same parameters, dropless on one device."""
    params, balance = _params()
    return (*_run_of("drop", "dropless", 1), jax.device_get(params), jax.device_get(balance))


def _layer_stats(run, params, batch, key="drop_rate_l"):
    """Every MoE layer's ``key`` statistic in the model's forward (what evaluation runs, with its aux)."""
    from flax import nnx

    def forward(params, batch):
        model = nnx.merge(run.graphdef, params)
        return model(batch["inputs"], batch["positions"], batch["segment_ids"])[1][key]

    with jax.set_mesh(run.mesh):
        return np.asarray(jax.jit(forward)(params, batch))


def _eval_batch(tokens_bt):
    b, t = tokens_bt.shape
    return {
        "inputs": tokens_bt, "targets": np.roll(tokens_bt, -1, axis=1),
        "positions": np.broadcast_to(np.arange(t, dtype=np.int32), (b, t)).copy(),
        "segment_ids": np.ones((b, t), np.int32), "loss_mask": np.ones((b, t), np.float32),
    }


def _logprobs(cfg, run, params, balance, batch):
    from moejax.eval.forward import Scorer

    return Scorer(run, run.balancer, cfg.model.moe.num_experts)(params, balance, batch)["logprob_b"]


def test_evaluation_under_repetitive_prompts_loses_no_tokens_with_llep():
    batch = _eval_batch(repetitive_prompts(8, 32))
    ref = _logprobs(*_reference_model(), batch)
    # LLEP on 8 devices scores exactly as dropless on one device: no assignment was lost.
    np.testing.assert_allclose(_logprobs(*_model("llep"), batch), ref, rtol=1e-5, atol=1e-4)
    # Standard EP (default factor 2) on the same prompts: every device's 32 tokens crowd one
    # expert, and at least a quarter of the assignments drop in every MoE layer.
    _, drop_run, params, _ = _model("drop")
    assert np.all(_layer_stats(drop_run, params, batch) >= 0.25)
    # The model's statistics count the spill: every MoE layer engaged LLEP on these prompts.
    _, llep_run, params, _ = _model("llep")
    np.testing.assert_array_equal(_layer_stats(llep_run, params, batch, "llep_engaged_l"), 1.0)


def test_generation_under_repetitive_prompts_loses_no_tokens_with_llep():
    from moejax.eval.generator import Generator

    prompts = list(repetitive_prompts(8, 12))
    outputs = {}
    for name, (cfg, run, params, balance) in (("llep", _model("llep")), ("ref", _reference_model())):
        with jax.set_mesh(run.mesh):
            generator = Generator(run, cfg, max_len=32, balancer=run.balancer)
            outputs[name] = generator.generate(params, balance, prompts, max_new_tokens=6, return_logits=True)
    (rows, logits_sbv), (ref_rows, ref_logits_sbv) = outputs["llep"], outputs["ref"]
    np.testing.assert_allclose(logits_sbv, ref_logits_sbv, rtol=1e-5, atol=1e-4)
    assert [r.tolist() for r in rows] == [r.tolist() for r in ref_rows]


@pytest.mark.slow  # two train-step compiles: about 30 s of CPU time
def test_trains_like_dropless_through_spills():
    # Native rows of half a balanced share force spilling at every step; 2 slots of q rows are
    # enough for any routing (S >= E / P + 1), so training matches dropless on one device: the
    # helpers' weight gradients reach the owners.
    from tests.test_sharding import ONE, tiny_cfg, train_losses

    cfg = tiny_cfg("expert_parallel")
    moe = cfg.model.moe
    moe.ep_comm, moe.ep_balance, moe.ep_capacity_factor = "all_gather", "llep", 0.5
    moe.ep_spill_slots, moe.ep_spill_capacity_factor = 2, 1.0
    ref_losses, ref_params = train_losses(tiny_cfg("dropless"), ONE, jax.devices()[:1])
    losses, params = train_losses(cfg, {"data": 2, "fsdp": 1, "expert": 4, "tensor": 1}, jax.devices())
    np.testing.assert_allclose(losses, ref_losses, rtol=2e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=2e-5), params, ref_params)
