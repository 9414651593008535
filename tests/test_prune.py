"""Expert pruning (moejax.prune): Schur-A* is optimal (against brute force), the knee budgets, Step's
importance and refit, and the pruned checkpoint: it evaluates as the masked original does, exports
to Hugging Face and loads back, and bad input is refused with a clear error."""

import dataclasses
import json
import os
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from moejax.config import MESH_AXES, default_config
from moejax.errors import ConfigError
from moejax.eval.masking import mask_state, masked_balancer
from moejax.eval.restore import open_run
from moejax.interop.hf import InteropError, import_to_workdir
from moejax.interop.hf.configs import choose_architecture
from moejax.interop.hf.workdir import export_from_workdir
from moejax.model.balancing import RoutingSetup
from moejax.model.transformer import Transformer, param_counts
from moejax.prune import Budget, prune_workdir
from moejax.prune import cli as prune_cli
from moejax.prune.calibration import Calibration, LayerData
from moejax.prune.knee import allocate, knee
from moejax.prune.objectives import Quadratic, pruned_layer_error, quadratic
from moejax.prune.prune import check_layers, choose
from moejax.prune.schur_astar import brute_force, schur_astar
from moejax.prune.step import importance, refit_down
from moejax.prune.write import _flat, prune_params
from moejax.schema import ModelConfig
from moejax.train.checkpoint import Checkpointer, load_params
from moejax.train.state import setup
from moejax.sharding import make_mesh
from tests.test_train import train_small_run


def random_quadratic(rng, e: int, n: int = 48) -> Quadratic:
    a = rng.normal(size=(n, e)) * rng.uniform(0.1, 2.0, e)
    a[:, 1] += 0.9 * a[:, 0]  # two nearly redundant experts
    y = a @ rng.uniform(0, 1, e) + 0.3 * rng.normal(size=n)
    return Quadratic(a.T @ a, a.T @ y, float(y @ y))


def random_layer(rng, e=6, t=96, d=8, f=12, k=2) -> LayerData:
    x = rng.normal(size=(t, d)).astype(np.float32)
    logits = x @ rng.normal(size=(d, e)).astype(np.float32)
    probs = np.exp(logits - logits.max(1, keepdims=True))
    probs /= probs.sum(1, keepdims=True)
    idx = np.argsort(-probs, axis=1)[:, :k].astype(np.int32)
    w = np.take_along_axis(probs, idx, 1)
    w = (w / w.sum(1, keepdims=True)).astype(np.float32)
    weights = [rng.normal(size=s).astype(np.float32) * 0.3 for s in ((e, d, f), (e, d, f), (e, f, d))]
    return LayerData(0, x, idx, w, probs.astype(np.float32), *weights)


def test_schur_astar_equals_brute_force_on_small_layers():
    rng = np.random.default_rng(0)
    for _ in range(12):
        q = random_quadratic(rng, int(rng.integers(3, 10)))
        for k in range(1, q.num_experts + 1):
            result, (_, best) = schur_astar(q, k), brute_force(q, k)
            assert result.optimal
            assert result.distortion == pytest.approx(best, rel=1e-9, abs=1e-9)
    for seed in range(3):  # real SwiGLU experts on calibration tokens, the objective of the CLI
        q = quadratic(random_layer(np.random.default_rng(seed)))
        for k in range(2, 6):
            result, (subset, best) = schur_astar(q, k), brute_force(q, k)
            assert result.optimal and result.distortion == pytest.approx(best, rel=1e-9)
            assert q.distortion(result.keep) == pytest.approx(q.distortion(subset), rel=1e-9)


def test_schur_astar_node_limit_falls_back_to_best_found_with_a_bound():
    q = random_quadratic(np.random.default_rng(1), 14, n=120)
    full = schur_astar(q, 7)
    limited = schur_astar(q, 7, max_nodes=3)
    assert not limited.optimal and limited.stopped_by == "max_nodes"
    assert len(limited.keep) == 7
    assert limited.lower_bound <= full.distortion + 1e-9 <= limited.distortion + 2e-9


def test_knee_and_global_allocation():
    sharp = {2: 1.0, 3: 0.2, 4: 0.15, 5: 0.1, 6: 0.05, 7: 0.02, 8: 0.0}
    linear = {k: (8 - k) / 6 for k in range(2, 9)}
    assert knee(sharp) == 3
    counts = allocate([sharp, linear], 10)
    assert sum(counts) == 10 and counts[0] <= counts[1] + 3
    assert allocate([sharp, sharp], 6) == [3, 3]
    with pytest.raises(ValueError, match="cannot be met"):
        allocate([sharp, linear], 3)


def test_step_importance_weights_tokens_by_loss_and_refit_never_hurts():
    data = random_layer(np.random.default_rng(2))
    loss = np.ones(data.x_td.shape[0])
    only_e0 = np.all(data.idx_tk != 0, axis=1)
    # Tokens that chose expert 0 carry no loss: expert 0 becomes worthless; others keep their mass.
    loss_masked = np.where(~only_e0, 0.0, 1.0)
    assert importance(data, loss_masked)[0] == 0.0 and importance(data, loss)[0] > 0.0
    keep = (0, 2, 3, 5)
    route = dict(top_k=2, renormalize=True, scaling=1.0, score_func="softmax")
    refit = refit_down(data, loss, keep, **route)
    assert refit.heldout_error[repr(refit.ridge)] <= refit.heldout_error["inf"]
    assert np.array_equal(refit.w_down_efd[1], data.w_down_efd[1])  # a pruned expert's rows stay as they were
    assert 0.0 < pruned_layer_error(data, keep, **route) < 1.0


def _model_cfg(layer_experts=()):
    cfg = default_config()
    m = cfg.model
    m.d_model, m.num_layers, m.mlp_dim, m.first_k_dense = 16, 3, 32, 1
    m.num_heads, m.num_kv_heads, m.head_dim, m.vocab_size = 2, 1, 8, 40
    m.moe.num_experts, m.moe.expert_dim, m.moe.shared_expert_dim = 4, 8, 8
    m.moe.layer_experts = layer_experts
    return cfg


def test_per_layer_counts_equal_the_masked_model_and_count_parameters():
    """A model with 4 and 3 experts (layers 1 and 2) computes what the 4-expert model computes
    with the dropped expert masked out of the router (renormalised top-k), and counts its parameters."""
    cfg_a, cfg_b = _model_cfg(), _model_cfg((4, 3))
    model_a = Transformer(ModelConfig.from_config(cfg_a.model), rngs=nnx.Rngs(0))
    model_b = Transformer(ModelConfig.from_config(cfg_b.model), rngs=nnx.Rngs(1))
    params_a = nnx.state(model_a, nnx.Param)
    keep = [(0, 1, 2, 3), (0, 2, 3)]
    pruned = prune_params(params_a, cfg_a.model, cfg_b, nnx.state(model_b, nnx.Param), keep, [None, None])
    nnx.update(model_b, pruned)
    assert sum(x.size for x in jax.tree.leaves(pruned)) == param_counts(ModelConfig.from_config(cfg_b.model))["total"]
    router = [v for p, v in _flat(pruned).items() if p.startswith("layers/2/mlp/router/w_de")]
    assert [r.shape for r in router] == [(1, 16, 3)]

    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 40, (2, 12)), jnp.int32)
    pos, seg = jnp.broadcast_to(jnp.arange(12), (2, 12)), jnp.ones((2, 12), jnp.int32)
    balancer = masked_balancer(None, RoutingSetup.from_config(cfg_a))
    masked = np.array([[False] * 4, [False, True, False, False]])
    logits_a, _ = model_a(tokens, pos, seg, balancer=balancer, balance_state=mask_state({}, masked, 2))
    logits_b, aux = model_b(tokens, pos, seg, with_routing=True)
    np.testing.assert_allclose(np.asarray(logits_b), np.asarray(logits_a), atol=2e-5)
    assert aux["load_le"].shape == (2, 4) and float(aux["load_le"][1, 3]) == 0.0  # padded: no 4th expert


@pytest.fixture(scope="module")
def workdir(run_once):
    """The shared tiny run of test_train.py (a dense layer, then an MoE layer of 4 experts top-2,
    renormalised softmax routing, no selection bias: it exports to Hugging Face as it is)."""
    return run_once("small_run", train_small_run)


def _logits(erun, ckpt, balancer, balance, tokens):
    @jax.jit
    def forward(params, balance):
        model = nnx.merge(erun.run.graphdef, params)
        pos = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
        return model(tokens, pos, jnp.ones_like(tokens), balancer=balancer if balance else None,
                     balance_state=balance or None)[0]

    return np.asarray(forward(jax.device_get(ckpt.params), balance))


def test_pruned_checkpoint_evaluates_as_the_masked_original_and_round_trips_hf(workdir, tmp_path, capsys):
    out = str(tmp_path / "pruned")
    prune_cli.main(["--workdir", workdir, "--method", "schur_astar", "--keep", "3", "--calib-tokens", "256",
                    "--out", out])
    printed = capsys.readouterr().out
    assert "parameters: " in printed and "parameter memory: " in printed and "optimal" in printed
    with open(os.path.join(out, "prune.json")) as f:
        record = json.load(f)
    assert record["experts_per_layer"] == [3] and record["params_after"] < record["params_before"]
    assert record["layers"][0]["optimal"] and len(record["keep"][0]) == 3
    erun, pruned = open_run(workdir), open_run(out)
    assert pruned.cfg.model.moe.num_experts == 3 and tuple(pruned.cfg.model.moe.layer_experts) == ()
    ckpt, ckpt_p = erun.load(), pruned.load()
    assert ckpt_p.step == ckpt.step
    state = Checkpointer(os.path.join(out, "checkpoints"), max_to_keep=1).restore(
        ckpt.step, pruned.run.abstract_state).state
    assert int(state["step"]) == ckpt.step  # resuming continues the source's step

    masked = np.ones((1, 4), bool)
    masked[0, list(record["keep"][0])] = False
    tokens = jnp.asarray(np.random.default_rng(0).integers(3, 200, (2, 32)), jnp.int32)
    balancer = masked_balancer(erun.run.balancer, RoutingSetup.from_config(erun.cfg))
    want = _logits(erun, ckpt, balancer, mask_state(jax.device_get(ckpt.balance), masked, 2), tokens)
    got = _logits(pruned, ckpt_p, pruned.run.balancer, jax.device_get(ckpt_p.balance), tokens)
    np.testing.assert_allclose(got, want, atol=5e-5)

    hf_dir, back = str(tmp_path / "hf"), str(tmp_path / "back")
    export_from_workdir(out, hf_dir)
    with open(os.path.join(hf_dir, "config.json")) as f:
        assert json.load(f)["num_experts"] == 3
    cfg_back = import_to_workdir(hf_dir, back)
    run = setup(cfg_back, make_mesh({axis: 1 for axis in MESH_AXES}, jax.devices()[:1]))
    params_back, _ = load_params(back, run.abstract_state["params"])
    reloaded = SimpleNamespace(run=run)
    np.testing.assert_allclose(_logits(reloaded, SimpleNamespace(params=params_back), None, {}, tokens), got, atol=5e-5)

    with pytest.raises(SystemExit) as exit_info:
        prune_cli.main(["--workdir", workdir, "--method", "least_used", "--keep", "3", "--out", out])
    assert exit_info.value.code == 2 and "already exists" in capsys.readouterr().err


def test_bad_input_is_refused_clearly(workdir, tmp_path):
    out = str(tmp_path / "p")
    with pytest.raises(ConfigError, match="more than MoE layer 0's 4 experts"):
        prune_workdir(workdir, out, "least_used", Budget(keep=5))
    with pytest.raises(ConfigError, match="fewer than the 2 each token chooses"):
        prune_workdir(workdir, out, "least_used", Budget(keep=1))
    with pytest.raises(ConfigError, match="the model has layers 0..1"):
        check_layers((2,), [1], 2)
    with pytest.raises(ConfigError, match="--layers 0 is a dense layer"):
        prune_workdir(workdir, out, "least_used", Budget(keep=3), layers=(0,))
    with pytest.raises(ConfigError, match="--calib-tokens 8 is too small"):
        prune_workdir(workdir, out, "schur_astar", Budget(keep=3), calib_tokens=8)
    with pytest.raises(ConfigError, match="--keep K, --ratio R or --auto"):
        prune_workdir(workdir, out, "least_used", Budget())
    os.makedirs(out)
    with pytest.raises(ConfigError, match="already exists"):
        prune_workdir(workdir, out, "least_used", Budget(keep=3))


def test_per_layer_counts_refuse_hf_export_and_bad_configs(tmp_path):
    with pytest.raises(InteropError, match=r"model\.moe\.layer_experts=\(4, 3\) \(Hugging Face MoE configs hold one "
                                           "expert count for all layers"):
        choose_architecture(_model_cfg((4, 3)).model)  # what export checks before writing anything
    from moejax.checks import validate

    cfg = _model_cfg((4, 3, 2))
    with pytest.raises(ConfigError, match="one count per MoE layer"):
        validate(cfg, 1, notes=False)
    cfg = _model_cfg((4, 1))
    with pytest.raises(ConfigError, match="counts between"):
        validate(cfg, 1, notes=False)
    cfg = _model_cfg((4, 3))
    cfg.model.moe.backend = "expert_parallel"
    with pytest.raises(ConfigError, match="expert_parallel"):
        validate(cfg, 1, notes=False)


def test_choose_every_method_and_auto_budget_on_synthetic_layers():
    rng = np.random.default_rng(3)
    layers = tuple(dataclasses.replace(random_layer(rng, e=6), layer=i) for i in range(2))
    cal = Calibration(layers, rng.uniform(0.5, 3.0, 96), top_k=2, renormalize=True, routed_scaling=1.0,
                      score_func="softmax")
    for method in ("schur_astar", "step", "least_used"):
        chosen = choose(cal, method, Budget(keep=3))
        assert [len(k) for k in chosen["keep"]] == [3, 3]
        assert all(0.0 <= info["recon_error"] for info in chosen["layers"])
    best = choose(cal, "schur_astar", Budget(keep=3))
    for method in ("step", "least_used"):  # the optimum of the objective is never beaten on it
        other = choose(cal, method, Budget(keep=3))
        assert all(b["objective"] <= o["objective"] + 1e-9 for b, o in zip(best["layers"], other["layers"]))
    auto = choose(cal, "schur_astar", Budget(ratio=0.5, auto=True))
    assert sum(len(k) for k in auto["keep"]) == 6
    assert all(set(info["curve"]) == {"2", "3", "4", "5", "6"} for info in auto["layers"])
    refitted = choose(cal, "schur_astar", Budget(keep=3), refit=True)
    assert refitted["keep"] == best["keep"] and all(r is not None for r in refitted["replaced"])
    assert all(r is None for r in best["replaced"])
    only = choose(cal, "least_used", Budget(keep=3), layers=(1,))
    assert [len(k) for k in only["keep"]] == [6, 3]
