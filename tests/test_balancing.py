"""Balancing objectives: each formula against numpy, composition, state in training, errors, metrics."""

import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats
from absl import flags
from flax import nnx
from ml_collections import config_flags

from moejax import sharding
from moejax.checks import validate
from moejax.config import default_config
from moejax.errors import ConfigError
from moejax.model.balancing import OBJECTIVES, Balancer, RoutingSetup, StepStats, build_balancer, parse_spec
from moejax.model.router import Router, Routing
from moejax.model.transformer import Transformer
from moejax.schema import ModelConfig, MoEConfig
from moejax.train import metrics as metrics_lib
from moejax.train.state import init_state, setup, to_global
from moejax.train.step import make_train_step
from tests.test_model import small_model_cfg
from tests.test_sharding import ONE, batches, tiny_cfg

B, T, E, K = 4, 8, 6, 2


def routing_from_logits(logits_bte: np.ndarray, k: int = K) -> Routing:
    """A softmax top-k routing computed in numpy."""
    z = logits_bte - logits_bte.max(-1, keepdims=True)
    probs = np.exp(z) / np.exp(z).sum(-1, keepdims=True)
    idx = np.argsort(-probs, axis=-1, kind="stable")[..., :k]
    weight = np.take_along_axis(probs, idx, -1)
    weight = weight / weight.sum(-1, keepdims=True)
    return Routing(*(jnp.asarray(a) for a in (idx.astype(np.int32), weight.astype(np.float32),
                                              probs.astype(np.float32), logits_bte.astype(np.float32))))


def random_routing(seed=0, b=B, t=T, e=E, k=K, scale=2.0) -> Routing:
    return routing_from_logits(np.random.default_rng(seed).normal(size=(b, t, e)) * scale, k)


def make(name, b=B, micro_batches=1, k=K, e=E, **hparams):
    return OBJECTIVES[name](setup=RoutingSetup(e, k, micro_batches=micro_batches, micro_batch_size=b), **hparams)


def np_switch(routing: Routing, groups: list[list[int]]) -> float:
    """E * sum_e f_e P_e per group of sequences, averaged; loops, no vectorisation tricks."""
    idx, probs = np.asarray(routing.idx_btk), np.asarray(routing.probs_bte)
    e = probs.shape[-1]
    values = []
    for rows in groups:
        counts = np.zeros(e)
        for r in rows:
            for choice in idx[r].ravel():
                counts[choice] += 1
        f = counts / counts.sum()
        p = probs[rows].reshape(-1, e).mean(0)
        values.append(e * float(f @ p))
    return float(np.mean(values))


# ---- each objective against an independent numpy computation ------------------------------------


@pytest.mark.parametrize("group_size", [None, 2, 1])
def test_switch_matches_numpy(group_size):
    r = random_routing(1)
    groups = [list(range(B))] if group_size is None else [list(range(i, i + group_size)) for i in range(0, B, group_size)]
    got = make("switch", weight=0.1, group_size=group_size).loss(r, {})
    np.testing.assert_allclose(got, 0.1 * np_switch(r, groups), rtol=1e-5)


def test_seq_aux_matches_deepseek_v3_formula():
    r = random_routing(2)
    idx, probs = np.asarray(r.idx_btk), np.asarray(r.probs_bte)
    per_seq = []
    for b in range(B):  # DeepSeek-V3 eqs. 17-20: f_i = E/(K T) sum_t 1[i in topk], P_i = mean_t s'_i
        f = np.array([E / (K * T) * np.sum(idx[b] == i) for i in range(E)])
        per_seq.append(np.sum(f * probs[b].mean(0)))
    np.testing.assert_allclose(make("seq_aux", weight=1e-3).loss(r, {}), 1e-3 * np.mean(per_seq), rtol=1e-5)


def test_global_batch_uses_step_loads_and_the_previous_step_for_other_micro_batches():
    r = random_routing(3)
    idx, probs = np.asarray(r.idx_btk), np.asarray(r.probs_bte)
    load_micro = np.bincount(idx.ravel(), minlength=E) / idx.size
    prev = np.random.default_rng(0).dirichlet(np.ones(E)).astype(np.float32)
    # One micro-batch per step: exactly the Switch loss over the (global) batch.
    one = make("global_batch", weight=0.1)
    np.testing.assert_allclose(one.loss(r, {"load_e": jnp.asarray(prev)}), 0.1 * np_switch(r, [list(range(B))]), rtol=1e-5)
    # Three micro-batches: this one's loads plus the previous step's for the other two.
    three = make("global_batch", weight=0.1, micro_batches=3)
    f = (load_micro + 2 * prev) / 3
    np.testing.assert_allclose(three.loss(r, {"load_e": jnp.asarray(prev)}), 0.1 * E * f @ probs.reshape(-1, E).mean(0), rtol=1e-5)
    assert np.allclose(three.init_state()["load_e"], 1 / E)
    new = three.update({"load_e": jnp.asarray(prev)}, StepStats(jnp.zeros(E), jnp.asarray(load_micro, jnp.float32)))
    np.testing.assert_allclose(new["load_e"], load_micro, rtol=1e-6)


def test_z_loss_matches_numpy():
    r = random_routing(4)
    logits = np.asarray(r.logits_bte, np.float64)
    lse = np.log(np.exp(logits).sum(-1))
    np.testing.assert_allclose(make("z_loss", weight=1e-3).loss(r, {}), 1e-3 * np.mean(lse**2), rtol=1e-5)


def test_loss_free_bias_update_is_u_times_sign_and_has_no_loss():
    obj = make("loss_free", u=1e-3)
    load = np.array([0.3, 0.1, 0.12, 0.2, 0.15, 0.13], np.float32)  # mean 1/6: three above, three below
    bias = np.linspace(-0.01, 0.01, E).astype(np.float32)
    new = obj.update({"bias_e": jnp.asarray(bias)}, StepStats(jnp.zeros(E), jnp.asarray(load)))
    np.testing.assert_allclose(new["bias_e"], bias + 1e-3 * np.sign(1 / E - load), atol=1e-7)
    assert obj.selection_bias(new) is new["bias_e"]
    assert "loss_free" not in Balancer((obj,)).losses(random_routing(), {"loss_free": new})
    np.testing.assert_allclose(obj.metrics(new)["bias_norm"], np.linalg.norm(np.asarray(new["bias_e"])), rtol=1e-6)


def _np_potential(name, m, s=1.5):
    e = len(m)
    if name == "neg_entropy":
        return np.sum(m * np.log(m))
    if name == "sq_l2":
        return e / 2 * np.sum(m**2)
    return np.sum((e * m) ** s) / (e * s * (s - 1))


@pytest.mark.parametrize("potential, s", [("neg_entropy", 1.5), ("sq_l2", 1.5), ("tsallis", 1.5), ("tsallis", 3.0)])
def test_phi_price_is_the_gradient_of_the_potential_and_loss_matches(potential, s):
    rng = np.random.default_rng(5)
    m = rng.dirichlet(np.ones(E) * 3)
    # q = grad phi(m), by central differences of the numpy potential.
    h = 1e-6
    q = np.array([(_np_potential(potential, m + h * np.eye(E)[i], s) - _np_potential(potential, m - h * np.eye(E)[i], s)) / (2 * h)
                  for i in range(E)])
    obj = make("phi", alpha=0.05, potential=potential, tsallis_q=s)
    r = random_routing(6)
    pbar = np.asarray(r.probs_bte).reshape(-1, E).mean(0)
    state = {"m_e": jnp.asarray(m, jnp.float32)}
    np.testing.assert_allclose(obj.loss(r, state), 0.05 * np.sum((q - q.mean()) * pbar), rtol=2e-4, atol=1e-7)
    new = obj.update(state, StepStats(jnp.asarray(pbar, jnp.float32), jnp.zeros(E)))
    np.testing.assert_allclose(new["m_e"], 0.35 * m + 0.65 * pbar, rtol=1e-5)


def test_phi_gradient_flows_only_through_pbar_with_the_price_as_weight():
    obj = make("phi", alpha=0.1)
    m = jnp.asarray(np.random.default_rng(7).dirichlet(np.ones(E)), jnp.float32)
    logits = jnp.asarray(np.random.default_rng(8).normal(size=(B, T, E)), jnp.float32)

    def loss(lg, m_e):
        probs = jax.nn.softmax(lg)
        return obj.loss(Routing(jnp.zeros((B, T, K), jnp.int32), jnp.zeros((B, T, K)), probs, lg), {"m_e": m_e})

    g_logits, g_state = jax.grad(loss, argnums=(0, 1))(logits, m)
    q = np.log(np.asarray(m)) + 1.0  # uncentred: the centring must not change the gradient
    g_ref = jax.grad(lambda lg: 0.1 * jnp.sum(q * jnp.mean(jax.nn.softmax(lg), axis=(0, 1))))(logits)
    np.testing.assert_allclose(g_logits, g_ref, atol=1e-8)
    assert not np.any(np.asarray(g_state))  # the price is a constant: no gradient into the state


def test_dpsl_is_the_squared_w2_distance_to_the_beta_marginal():
    r = random_routing(9, scale=1.0)
    probs = np.asarray(r.probs_bte, np.float64).reshape(-1, E)
    n, c = probs.shape[0], 0.5
    target = scipy.stats.beta(c, (E - 1) * c).ppf((np.arange(n) + 0.5) / n)
    expected = np.mean([(E * (np.sort(probs[:, e]) - target)) ** 2 for e in range(E)])
    np.testing.assert_allclose(make("dpsl", weight=0.1, concentration=c).loss(r, {}), 0.1 * expected, rtol=1e-4)


def test_composition_sums_losses_and_biases():
    phi, z = make("phi", alpha=0.05), make("z_loss", weight=1e-3)
    lf_a, r = make("loss_free", u=1e-3), random_routing(10)
    balancer = Balancer((phi, z, lf_a))
    state = {"phi": phi.init_state(), "loss_free": {"bias_e": jnp.arange(E, dtype=jnp.float32)}}
    losses = balancer.losses(r, state)
    assert set(losses) == {"phi", "z_loss"}
    np.testing.assert_allclose(losses["z_loss"], z.loss(r, {}))
    np.testing.assert_allclose(balancer.selection_bias(state), np.arange(E))
    assert Balancer((phi, z)).selection_bias({"phi": phi.init_state()}) is None


# ---- selection bias: top-k only -----------------------------------------------------------------


def test_selection_bias_moves_topk_but_not_combine_weights_and_gets_no_gradient():
    cfg = small_model_cfg()
    router = Router(32, MoEConfig.from_config(cfg.moe), std=0.5, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(0), (2, 5, 32))
    bias = jnp.array([0.0, 0.0, 0.0, 10.0])  # expert 3 always selected
    plain, biased = router(x), router(x, bias)
    assert np.all(np.any(np.asarray(biased.idx_btk) == 3, axis=-1))
    np.testing.assert_array_equal(biased.probs_bte, plain.probs_bte)
    p = np.asarray(plain.probs_bte)
    expected = np.take_along_axis(p, np.asarray(biased.idx_btk), -1)
    np.testing.assert_allclose(biased.weight_btk, expected / expected.sum(-1, keepdims=True), rtol=1e-6)
    g = jax.grad(lambda b: jnp.sum(router(x, b).weight_btk ** 2))(bias)
    assert not np.any(np.asarray(g))


def test_each_layer_routes_with_its_own_bias():
    cfg = small_model_cfg()  # 3 layers, all MoE, 4 experts top-2
    model = Transformer(ModelConfig.from_config(cfg), rngs=nnx.Rngs(0))
    balancer = build_balancer((("loss_free", {"u": 1e-3}),), RoutingSetup(4, 2, micro_batch_size=2))
    bias_le = jnp.array([[9.0, 0, 0, 0], [0, 0, 0, 9.0], [0, 9.0, 0, 0]])
    tokens = jnp.arange(12).reshape(2, 6) % 7
    pos = jnp.broadcast_to(jnp.arange(6), (2, 6))
    _, aux = model(tokens, pos, jnp.ones((2, 6), jnp.int32), balancer=balancer,
                   balance_state={"loss_free": {"bias_e": bias_le}})
    load = np.asarray(aux["load_le"])
    # Every token spends one of its 2 choices on the favoured expert of that layer.
    np.testing.assert_allclose([load[0, 0], load[1, 3], load[2, 1]], 0.5)


# ---- state in training: replicated, mesh-invariant, kept on bad steps, checkpointed -------------

STATEFUL = (("loss_free", {"u": 1e-2}), ("phi", {"alpha": 1e-2}), ("global_batch", {"weight": 1e-2}))


def stateful_cfg():
    cfg = tiny_cfg()
    cfg.model.moe.balancing = STATEFUL
    return cfg


def run_steps(cfg, mesh_shape, devices, n=3):
    mesh = sharding.make_mesh(mesh_shape, devices)
    run = setup(cfg, mesh)
    state = init_state(cfg, run)
    step = make_train_step(cfg, run)
    history = []
    with jax.set_mesh(mesh):
        for batch in batches(cfg, n):
            state, metrics = step(state, to_global(batch, run.batch_sharding(True), cfg.train.grad_accum_steps))
            history.append(jax.device_get(metrics))
    return state, history


def test_balance_state_is_replicated_and_a_mesh_run_matches_one_device():
    cfg = stateful_cfg()
    ref_state, ref_history = run_steps(cfg, ONE, jax.devices()[:1])
    state, history = run_steps(cfg, {"data": 2, "fsdp": 2, "expert": 2, "tensor": 1}, jax.devices())
    for leaf in jax.tree.leaves(state["balance"]) + jax.tree.leaves(state["routing_health"]):
        shards = [np.asarray(s.data) for s in leaf.addressable_shards]
        assert len(shards) == 8 and all(s.shape == leaf.shape for s in shards)
        for s in shards[1:]:
            np.testing.assert_array_equal(s, shards[0])  # bit-identical on every device
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), jax.device_get(state["balance"]),
                 jax.device_get(ref_state["balance"]))
    np.testing.assert_allclose([h["loss"] for h in history], [h["loss"] for h in ref_history], rtol=2e-5)
    # The bias moved by exactly u * sign(...) per step: no optimizer, no weight decay touched it.
    bias = np.zeros(4, np.float32)
    for h in ref_history:
        bias = bias + 1e-2 * np.sign(np.mean(h["load_le"], -1, keepdims=True) - h["load_le"])
    np.testing.assert_allclose(np.asarray(ref_state["balance"]["loss_free"]["bias_e"]), bias, atol=1e-7)
    assert np.abs(bias).max() > 0
    assert "bias_e" not in str(jax.tree_util.tree_structure(ref_state["params"]))


def test_a_non_finite_step_keeps_the_balance_state():
    cfg = stateful_cfg()
    mesh = sharding.make_mesh(ONE, jax.devices()[:1])
    run = setup(cfg, mesh)
    step = make_train_step(cfg, run)
    with jax.set_mesh(mesh):
        state, _ = step(init_state(cfg, run), to_global(batches(cfg, 1)[0], run.batch_sharding(True), 1))
        before = jax.device_get({k: state[k] for k in ("balance", "routing_health")})
        state["params"]["final_norm"]["scale"] = state["params"]["final_norm"]["scale"] * jnp.nan
        state, metrics = step(state, to_global(batches(cfg, 2)[1], run.batch_sharding(True), 1))
    assert bool(metrics["skipped"])
    after = jax.device_get({k: state[k] for k in ("balance", "routing_health")})
    jax.tree.map(np.testing.assert_array_equal, after, before)


@pytest.fixture(scope="module")
def cache_dir(corpus_cache):
    """The run's shared corpus cache (tests/conftest.py)."""
    return corpus_cache


def test_stateful_objectives_resume_exactly_and_log_routing_health(tmp_path, cache_dir):
    from moejax.train.loop import train
    from tests.test_train import read_metrics, small_run_cfg

    cfg = small_run_cfg(cache_dir)
    cfg.model.moe.balancing = STATEFUL + (("z_loss", {"weight": 1e-3}),)
    # An odd step count: the loss-free bias moves by +-u per step, so it cannot end at 0.
    cfg.train.steps, cfg.train.eval_every = 5, 5
    cfg.checkpoint.every_steps = 2
    workdir = str(tmp_path / "run")
    train(cfg, workdir)
    first = [r for r in read_metrics(workdir) if "loss" in r]
    for key in ("max_vio", "max_vio_global", "gini", "gini_global", "router_entropy", "loss_free/bias_norm",
                "phi/ema_max_vio", "balance_loss/phi", "balance_loss/global_batch", "expert_load", "drop_rate"):
        assert key in first[-1], key
    assert any(r["loss_free/bias_norm"] > 0 for r in first)  # +-u per step: it may return to 0
    _logged_eval_routes_with_the_bias(cfg, workdir, read_metrics(workdir)[-1]["eval_loss"])
    for step in ("4", "5"):
        shutil.rmtree(os.path.join(workdir, "checkpoints", step))
    train(cfg, workdir)  # resumes from step 2: the balance state must come back exactly
    again = [r for r in read_metrics(workdir) if "loss" in r]
    for original, resumed in zip(first[2:], again[2:]):
        for key in ("loss", "loss_free/bias_norm", "phi/ema_max_vio", "max_vio_global", "balance_loss/global_batch"):
            assert resumed[key] == original[key], key


def _logged_eval_routes_with_the_bias(cfg, workdir, logged_eval_loss):
    """The loop's held-out loss uses the loss-free selection bias; without it the number differs."""
    import jax

    from moejax import sharding
    from moejax.data.from_config import make_data
    from moejax.train.checkpoint import Checkpointer
    from moejax.checks import check_config
    from moejax.train.default_hooks import evaluate
    from moejax.train.state import setup
    from moejax.train.step import make_eval_step

    mesh = sharding.make_mesh(check_config(cfg)[0])
    run = setup(cfg, mesh)
    state = Checkpointer(os.path.join(workdir, "checkpoints"), max_to_keep=3).restore_latest(run.abstract_state).state
    eval_batches = make_data(cfg).eval_batches
    with jax.set_mesh(mesh):
        eval_step, target = make_eval_step(cfg, run), run.batch_sharding(accum=False)
        with_bias = evaluate(eval_step, state, eval_batches, target)["eval_loss"]
        unbiased = {**state, "balance": {}}
        without_bias = evaluate(eval_step, unbiased, eval_batches, target)["eval_loss"]
    assert with_bias == pytest.approx(logged_eval_loss, rel=1e-6)
    assert without_bias != pytest.approx(with_bias, rel=1e-6)


# ---- health metrics -----------------------------------------------------------------------------


def test_max_vio_and_gini_known_values():
    load = np.array([[0.25, 0.25, 0.25, 0.25], [1.0, 0, 0, 0], [0.4, 0.3, 0.2, 0.1]])
    np.testing.assert_allclose(metrics_lib.max_vio(load), [0.0, 3.0, 0.6])
    # Gini by its definition: mean absolute difference over twice the mean.
    x = load[2]
    expected = np.abs(x[:, None] - x[None, :]).sum() / (2 * 4 * x.sum())
    np.testing.assert_allclose(metrics_lib.gini(load), [0.0, 0.75, expected])


def test_global_load_is_a_normalised_moving_average():
    health = metrics_lib.init_routing_health(1, 2)
    a, b = jnp.array([[0.9, 0.1]]), jnp.array([[0.5, 0.5]])
    health = metrics_lib.update_routing_health(health, a)
    np.testing.assert_allclose(metrics_lib.global_load(health), a, rtol=1e-6)  # one step: exactly it
    health = metrics_lib.update_routing_health(health, b)
    w = 1 - 1 / metrics_lib.HEALTH_WINDOW_STEPS  # older step weighs w relative to the newest
    np.testing.assert_allclose(metrics_lib.global_load(health), (w * a + b) / (w + 1), rtol=1e-5)


def test_routing_summary_fields():
    metrics = {
        "load_le": np.array([[0.5, 0.5, 0, 0], [0.25] * 4]), "load_global_le": np.array([[0.4, 0.4, 0.2, 0], [0.25] * 4]),
        "drop_rate_l": np.zeros(2), "entropy_l": np.array([1.0, 0.5]),
        "balance_metrics": {"loss_free/bias_norm": np.array([0.1, 0.3])}, "balance_losses": {"phi": np.float32(0.02)},
    }
    out = metrics_lib.routing_summary(metrics)
    assert out["max_vio"] == pytest.approx(1.0) and out["max_vio/layer_1"] == pytest.approx(0.0)
    assert out["max_vio_global"] == pytest.approx(0.6)
    assert out["gini"] == pytest.approx(0.25) and out["router_entropy"] == pytest.approx(0.75)
    assert out["loss_free/bias_norm"] == pytest.approx(0.3) and out["balance_loss/phi"] == pytest.approx(0.02)


# ---- config: syntax, command line, errors before compile ---------------------------------------


def test_spec_forms_normalise():
    assert parse_spec("z_loss") == (("z_loss", {}),)
    assert parse_spec(("phi", {"alpha": 1.0})) == (("phi", {"alpha": 1.0}),)
    assert parse_spec([("phi", {"alpha": 1.0}), "z_loss", ("none",)]) == (
        ("phi", {"alpha": 1.0}), ("z_loss", {}), ("none", {}))
    assert parse_spec(()) == ()
    assert build_balancer((("none", {}),), RoutingSetup(4, 2)).objectives == ()


def test_command_line_override_of_the_objectives_list():
    argv = ["prog", "--config=experiments/configs/tiny_moe.py",
            "--config.model.moe.balancing=(('phi', {'alpha': 0.01, 'potential': 'tsallis'}), ('z_loss', {'weight': 1e-3}))"]
    fv = flags.FlagValues()
    holder = config_flags.DEFINE_config_file("config", None, "config", flag_values=fv, sys_argv=argv)
    fv(argv)
    cfg = holder.value
    assert parse_spec(cfg.model.moe.balancing) == (
        ("phi", {"alpha": 0.01, "potential": "tsallis"}), ("z_loss", {"weight": 1e-3}))
    validate(cfg, 8)


@pytest.mark.parametrize("spec, message", [
    (("phy",), r"unknown balancing objective 'phy'. Did you mean 'phi'\? Valid objectives: none, switch, "
               r"global_batch, seq_aux, z_loss, loss_free, phi, dpsl"),
    ((("phi", {}),), r"objective 'phi' needs hyperparameter 'alpha' \(loss weight; allowed: a number > 0\)"),
    ((("phi", {"alpha": 0.01, "eta": 1.5}),), r"'phi': hyperparameter 'eta' has value 1.5; allowed: a number in \(0, 1\]"),
    ((("phi", {"alpha": 0.01, "potential": "kl"}),), r"'potential' has value 'kl'; allowed: 'neg_entropy' \| 'sq_l2' \| 'tsallis'"),
    ((("phi", {"alpha": 0.01, "tsallis_q": 1}),), r"'tsallis_q' has value 1; allowed: a number > 0 other than 1"),
    ((("switch", {"wieght": 0.01}),), r"'switch' has no hyperparameter 'wieght'. Did you mean 'weight'\? Its hyperparameters: weight, group_size"),
    ((("switch", {"weight": -1.0}),), r"'weight' has value -1.0; allowed: a number > 0"),
    ((("switch", {"weight": 0.01, "group_size": 3}),), r"'group_size' has value 3; allowed: a divisor of the micro-batch size 16"),
    ((("loss_free", {"u": 1e-3}), ("loss_free", {"u": 1e-2})), r"'loss_free' is listed 2 times"),
    ((("none", {}), ("z_loss", {"weight": 1e-3})), r"'none' cannot be combined with other objectives \(z_loss\)"),
    ((("phi", 0.01),), r"entry \('phi', 0.01\) is not a \(name, \{hyperparameter: value\}\) pair"),
])
def test_bad_specs_fail_validation_with_a_clear_message(spec, message):
    cfg = default_config()
    cfg.model.moe.balancing = spec
    with pytest.raises(ConfigError, match=r"config key 'model.moe.balancing': .*" + message):
        validate(cfg, 8)


def test_loss_free_needs_a_topk_it_can_change():
    cfg = default_config()
    cfg.model.moe.experts_per_token = cfg.model.moe.num_experts
    cfg.model.moe.balancing = (("loss_free", {"u": 1e-3}),)
    with pytest.raises(ConfigError, match=r"'loss_free': needs model.moe.experts_per_token < model.moe.num_experts"):
        validate(cfg, 8)
    cfg.model.moe.balancing = (("switch", {"weight": 1e-2}),)
    validate(cfg, 8)


def test_every_registered_objective_builds_and_is_listed_in_the_config_docs():
    with open("docs/balancing.md") as f:
        doc = f.read()
    required = {"switch": {"weight": 1.0}, "global_batch": {"weight": 1.0}, "seq_aux": {"weight": 1.0},
                "z_loss": {"weight": 1.0}, "loss_free": {"u": 1.0}, "phi": {"alpha": 1.0}, "dpsl": {"weight": 1.0}}
    for name in OBJECTIVES:
        build_balancer(((name, required.get(name, {})),), RoutingSetup(8, 2))
        assert f"`{name}`" in doc, name
