"""phi-balancing as a routing adjustment (apply='bias' | 'both'): the bias moves only the top-k
selection, the default is unchanged, the rules match their formulas, a persistent skew is
driven to balance, the state is mesh-invariant and resumes exactly, bad options fail clearly."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from moejax import sharding
from moejax.checks import validate
from moejax.config import default_config
from moejax.errors import ConfigError
from moejax.model.balancing import Balancer, RoutingSetup, StepStats, build_balancer
from moejax.model.balancing.phi import PhiBalancing, price
from moejax.model.router import Router, expert_load
from moejax.schema import MoEConfig
from moejax.train.metrics import max_vio
from moejax.train.state import init_state, setup, to_global
from moejax.train.step import make_train_step
from tests.test_balancing import random_routing
from tests.test_model import small_model_cfg
from tests.test_sharding import batches, tiny_cfg

E, K = 6, 2


def phi(e=E, k=K, **hparams) -> PhiBalancing:
    return PhiBalancing(setup=RoutingSetup(e, k, micro_batch_size=4), **hparams)


def skewed_m(seed=0, e=E):
    return jnp.asarray(np.random.default_rng(seed).dirichlet(np.ones(e)), jnp.float32)


# ---- the default (apply='loss') is the old objective, bit for bit ------------------------------


def test_default_is_the_priced_loss_with_no_bias_and_the_same_state():
    obj = phi(alpha=0.1)
    assert obj.apply == "loss" and obj.tracks == "probs"
    assert set(obj.init_state()) == {"m_e"} and obj.selection_bias(obj.init_state()) is None
    r, m = random_routing(1), skewed_m(1)
    q = jax.lax.stop_gradient(price("neg_entropy", m))  # the formula before the phi variants existed, op for op
    old = 0.1 * jnp.sum((q - jnp.mean(q)) * jnp.mean(r.probs_bte, axis=(0, 1)))
    np.testing.assert_array_equal(obj.loss(r, {"m_e": m}), old)
    stats = StepStats(jnp.asarray(np.full(E, 1 / E) + 0.01 * np.arange(E), jnp.float32), jnp.zeros(E))
    np.testing.assert_array_equal(obj.update({"m_e": m}, stats)["m_e"], 0.35 * m + 0.65 * stats.pbar_e)
    assert "bias_norm" not in obj.metrics({"m_e": m})


# ---- the rules against their formulas ------------------------------------------------------------


def test_bias_rules_match_their_formulas_and_track_loads_by_default():
    m, b = skewed_m(2), jnp.asarray(np.linspace(-0.02, 0.02, E), jnp.float32)
    load = jnp.asarray(np.random.default_rng(3).dirichlet(np.ones(E)), jnp.float32)
    pbar = jnp.full((E,), 1 / E, jnp.float32)
    stats = StepStats(pbar, load)

    acc = phi(gamma=0.01, apply="bias")
    assert acc.tracks == "loads" and set(acc.init_state()) == {"m_e", "bias_e"}
    assert not np.any(np.asarray(acc.init_state()["bias_e"]))
    new = acc.update({"m_e": m, "bias_e": b}, stats)
    m_new = 0.35 * np.asarray(m, np.float64) + 0.65 * np.asarray(load, np.float64)
    q = np.log(m_new) + 1
    np.testing.assert_allclose(new["m_e"], m_new, rtol=1e-6)
    np.testing.assert_allclose(new["bias_e"], np.asarray(b) - 0.01 * (q - q.mean()), rtol=1e-5, atol=1e-8)
    np.testing.assert_array_equal(acc.selection_bias(new), new["bias_e"])
    assert acc.loss(random_routing(2), new) == 0.0

    prc = phi(gamma=0.05, apply="bias", bias_form="price", potential="sq_l2", ema_of="probs")
    assert set(prc.init_state()) == {"m_e"}
    np.testing.assert_allclose(prc.selection_bias({"m_e": m}), -0.05 * E * (np.asarray(m) - 1 / E), atol=1e-7)
    np.testing.assert_allclose(prc.update({"m_e": m}, stats)["m_e"], 0.35 * np.asarray(m) + 0.65 / E, rtol=1e-6)

    # 'both': the loss of apply='loss' and the bias of apply='bias', from one state (tracking loads).
    both, loss_only = phi(alpha=0.1, gamma=0.01, apply="both"), phi(alpha=0.1)
    r, state = random_routing(4), {"m_e": m, "bias_e": b}
    np.testing.assert_array_equal(both.loss(r, state), loss_only.loss(r, {"m_e": m}))
    np.testing.assert_array_equal(both.selection_bias(state), b)
    np.testing.assert_array_equal(both.update(state, stats)["m_e"], acc.update(state, stats)["m_e"])
    assert float(both.metrics(state)["bias_norm"]) == pytest.approx(float(np.linalg.norm(b)), rel=1e-6)


# ---- the bias moves only the selection -----------------------------------------------------------


def test_bias_moves_selection_only_combine_weights_and_gradients_are_those_of_the_chosen_experts():
    cfg = small_model_cfg(num_experts=8, experts_per_token=2)
    router = Router(32, MoEConfig.from_config(cfg.moe), std=0.5, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(0), (2, 16, 32))
    obj = phi(e=8, gamma=0.5, apply="bias", bias_form="price")
    m_e = jnp.asarray([0.5, 0.2, 0.1, 0.05, 0.05, 0.04, 0.03, 0.03], jnp.float32)  # a skewed EMA
    state = {"phi": {"m_e": m_e}}
    balancer = Balancer((obj,))
    bias = balancer.selection_bias(state)
    plain, biased = router(x), router(x, bias)
    assert not np.array_equal(plain.idx_btk, biased.idx_btk)  # the bias does move the top-k ...
    np.testing.assert_array_equal(biased.probs_bte, plain.probs_bte)  # ... and nothing else
    np.testing.assert_array_equal(biased.logits_bte, plain.logits_bte)
    idx = np.asarray(biased.idx_btk)
    chosen = np.take_along_axis(np.asarray(plain.probs_bte), idx, -1)
    np.testing.assert_allclose(biased.weight_btk, chosen / chosen.sum(-1, keepdims=True), rtol=1e-6)

    # Gradients (router weights and inputs) equal those of routing with the same selection fixed
    # and no bias at all; none reaches the balance state.
    target = jax.random.normal(jax.random.key(1), idx.shape)

    graphdef, params = nnx.split(router)

    def with_bias(params, x_btd, m_e):
        layer_state = {"phi": {"m_e": m_e}}
        r = nnx.merge(graphdef, params)(x_btd, balancer.selection_bias(layer_state))
        return jnp.sum((r.weight_btk - target) ** 2) + balancer.losses(r, layer_state)["phi"]

    def fixed_selection(params, x_btd):
        w_de = nnx.merge(graphdef, params).w_de[...]
        p = jax.nn.softmax(jnp.einsum("btd,de->bte", x_btd, w_de), axis=-1)
        w = jnp.take_along_axis(p, jnp.asarray(idx), -1)
        return jnp.sum((w / jnp.sum(w, -1, keepdims=True) - target) ** 2)

    g_p, g_x, g_m = jax.grad(with_bias, argnums=(0, 1, 2))(params, x, m_e)
    r_p, r_x = jax.grad(fixed_selection, argnums=(0, 1))(params, x)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), g_p, r_p)
    assert np.abs(np.asarray(jax.tree.leaves(g_p)[0])).max() > 0
    np.testing.assert_allclose(g_x, r_x, rtol=1e-5, atol=1e-7)
    assert not np.any(np.asarray(g_m))
    assert float(balancer.losses(biased, state)["phi"]) == 0.0  # no loss with apply='bias'


# ---- a persistent skew is driven to balance ------------------------------------------------------

SIM_E, SIM_K, SIM_TOKENS, SIM_D = 16, 2, 1024, 16
BALANCE_STEPS = 50  # accumulate: MaxVio below 0.05 within this many steps (measured: ~30)


def skewed_router() -> tuple[Router, jax.Array]:
    """A fixed router whose logits prefer low-numbered experts by up to 1.5 nats on every token."""
    cfg = small_model_cfg(num_experts=SIM_E, experts_per_token=SIM_K)
    router = Router(SIM_D, MoEConfig.from_config(cfg.moe), std=0.3, rngs=nnx.Rngs(0))
    router.w_de[...] = router.w_de[...].at[0].set(jnp.linspace(1.5, 0.0, SIM_E))  # feature 0 is 1
    x = np.random.default_rng(0).normal(size=(1, SIM_TOKENS, SIM_D)).astype(np.float32)
    x[..., 0] = 1.0
    return router, jnp.asarray(x)


def simulate(obj: PhiBalancing, steps: int) -> np.ndarray:
    """MaxVio of the top-k loads per step: the router selects with the objective's bias, the
    objective updates from the loads (the train step's order), for a router that never learns."""
    router, x = skewed_router()
    graphdef, params = nnx.split(router)

    def step(state, _):
        r = nnx.merge(graphdef, params)(x, obj.selection_bias(state))
        load_e = expert_load(r.idx_btk, SIM_E)
        new = obj.update(state, StepStats(jnp.mean(r.probs_bte, axis=(0, 1)), load_e))
        return new, jnp.max(load_e) / jnp.mean(load_e) - 1.0

    _, vio = jax.jit(lambda s: jax.lax.scan(step, s, None, length=steps))(obj.init_state())
    return np.asarray(vio)


def test_accumulated_bias_drives_a_persistent_skew_to_balance():
    router, x = skewed_router()
    unbiased = float(max_vio(np.asarray(expert_load(router(x).idx_btk, SIM_E))[None])[0])
    assert unbiased > 1.0  # the skew: the busiest expert gets more than twice its share
    for potential in ("neg_entropy", "sq_l2"):
        vio = simulate(phi(e=SIM_E, gamma=0.01, apply="bias", potential=potential), 2 * BALANCE_STEPS)
        assert vio[BALANCE_STEPS - 1] < 0.05, (potential, vio[BALANCE_STEPS - 1])
        assert vio[BALANCE_STEPS:].max() < 0.1, potential  # and it stays balanced


def test_price_form_only_shrinks_a_persistent_skew():
    """The penalised (proportional) form keeps an equilibrium imbalance that shrinks with gamma:
    why 'accumulate' is the default bias form (docs/balancing.md)."""
    final = [simulate(phi(e=SIM_E, gamma=g, eta=0.3, apply="bias", bias_form="price"), 60)[-10:].mean()
             for g in (0.01, 0.03, 0.1)]
    assert final[0] > final[1] > final[2] > 0.3, final


# ---- state in training: identical across meshes, resumes exactly --------------------------------

BOTH = (("phi", {"alpha": 1e-2, "gamma": 3e-2, "apply": "both"}), ("z_loss", {"weight": 1e-3}))
DATA8 = {"data": 8, "fsdp": 1, "expert": 1, "tensor": 1}
MIXED = {"data": 2, "fsdp": 2, "expert": 2, "tensor": 1}
STEPS, SAVE_AT = 4, 2


def train_and_resume(mesh_shape, checkpoint_dir=None):
    """STEPS train steps on the tiny model with phi 'both'; with ``checkpoint_dir``, also saves
    the state after SAVE_AT steps, restores it with orbax and redoes the remaining steps.
    Returns (final state, per-step metrics, and the resumed run's, or None)."""
    from moejax.train.checkpoint import Checkpointer

    cfg = tiny_cfg()
    cfg.model.moe.balancing = BOTH
    mesh = sharding.make_mesh(mesh_shape, jax.devices())
    run = setup(cfg, mesh)
    step = make_train_step(cfg, run)
    data = [to_global(b, run.batch_sharding(True), cfg.train.grad_accum_steps) for b in batches(cfg, STEPS)]
    resumed = None
    with jax.set_mesh(mesh):
        state, history = init_state(cfg, run), []
        for i, batch in enumerate(data):
            state, metrics = step(state, batch)
            history.append(jax.device_get(metrics))
            if checkpoint_dir and i + 1 == SAVE_AT:
                ckpt = Checkpointer(checkpoint_dir, max_to_keep=1)
                ckpt.save(SAVE_AT, state, {}, {})
                ckpt.wait()  # the step donates its input state: finish writing first
        final = jax.device_get(state)
        if checkpoint_dir:
            state = Checkpointer(checkpoint_dir, max_to_keep=1).restore(SAVE_AT, run.abstract_state).state
            resumed = []
            for batch in data[SAVE_AT:]:
                state, metrics = step(state, batch)
                resumed.append(jax.device_get(metrics))
            resumed = (jax.device_get(state), resumed)
    return state, final, history, resumed


@pytest.fixture(scope="module")
def mesh_runs(tmp_path_factory):
    """The same 4 steps on data=8 and on (data=2, fsdp=2, expert=2), the latter resumed from step 2."""
    return {"data8": train_and_resume(DATA8),
            "mixed": train_and_resume(MIXED, str(tmp_path_factory.mktemp("phi_ckpt") / "c"))}


def test_bias_state_is_replicated_and_identical_across_meshes(mesh_runs):
    (live8, final8, hist8, _), (live, final, hist, _) = mesh_runs["data8"], mesh_runs["mixed"]
    assert np.abs(final8["balance"]["phi"]["bias_e"]).max() > 0  # the bias moved
    for leaf in jax.tree.leaves(live8["balance"]) + jax.tree.leaves(live["balance"]):
        shards = [np.asarray(s.data) for s in leaf.addressable_shards]
        assert len(shards) == 8 and all(s.shape == leaf.shape for s in shards)
        for s in shards[1:]:
            np.testing.assert_array_equal(s, shards[0])  # bit-identical on every device
    for h, h8 in zip(hist, hist8):  # the same selections, step by step
        np.testing.assert_array_equal(h["load_le"], h8["load_le"])
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), final["balance"], final8["balance"])
    np.testing.assert_allclose([h["loss"] for h in hist], [h["loss"] for h in hist8], rtol=2e-5)


def test_bias_state_resumes_bit_for_bit(mesh_runs):
    _, final, history, (resumed_state, resumed) = mesh_runs["mixed"]
    assert set(final["balance"]["phi"]) == {"m_e", "bias_e"}
    jax.tree.map(np.testing.assert_array_equal, resumed_state["balance"], final["balance"])
    jax.tree.map(np.testing.assert_array_equal, resumed_state["params"], final["params"])
    for original, again in zip(history[SAVE_AT:], resumed):
        for key in ("loss", "load_le"):
            np.testing.assert_array_equal(again[key], original[key])
        jax.tree.map(np.testing.assert_array_equal, again["balance_metrics"], original["balance_metrics"])


# ---- errors before compile -----------------------------------------------------------------------


@pytest.mark.parametrize("hparams, message", [
    ({"alpha": 0.01, "apply": "bias"}, r"hyperparameter 'alpha' has value 0.01 but does nothing with "
                                       r"apply='bias'; drop it, or use apply='both'"),
    ({"apply": "bias"}, r"needs hyperparameter 'gamma' \(selection-bias scale, in router-score units; "
                        r"allowed: a number > 0\) with apply='bias'"),
    ({"gamma": 0.01, "apply": "both"}, r"needs hyperparameter 'alpha' \(loss weight; allowed: a number > 0\) "
                                       r"with apply='both'"),
    ({"alpha": 0.01, "gamma": 0.01}, r"hyperparameter 'gamma' has value 0.01 but does nothing with apply='loss'"),
    ({"alpha": 0.01, "apply": "bais"}, r"hyperparameter 'apply' has value 'bais'; allowed: 'loss' \| 'bias' \| 'both'"),
    ({"gamma": 0.01, "apply": "bias", "ema_of": "load"},
     r"hyperparameter 'ema_of' has value 'load'; allowed: 'probs' \| 'loads', or None"),
    ({"gamma": 0.01, "apply": "bias", "bias_form": "dual"},
     r"hyperparameter 'bias_form' has value 'dual'; allowed: 'accumulate' \| 'price'"),
    ({"alpha": 0.01, "bias_form": "price"}, r"hyperparameter 'bias_form' has value 'price' but does nothing with apply='loss'"),
    ({"gamma": -1.0, "apply": "bias"}, r"hyperparameter 'gamma' has value -1.0; allowed: a number > 0"),
])
def test_bad_phi_options_fail_validation_with_a_clear_message(hparams, message):
    cfg = default_config()
    cfg.model.moe.balancing = (("phi", hparams),)
    with pytest.raises(ConfigError, match=r"config key 'model.moe.balancing': balancing objective 'phi':? " + message):
        validate(cfg, 8)


def test_bias_needs_a_topk_it_can_change():
    with pytest.raises(Exception, match=r"apply='bias' needs model.moe.experts_per_token < model.moe.num_experts"):
        build_balancer((("phi", {"gamma": 0.01, "apply": "bias"}),), RoutingSetup(4, 4))
    build_balancer((("phi", {"alpha": 0.01}),), RoutingSetup(4, 4))  # the loss form still works
