"""Rematerialisation gives the same numbers, and the compile-only check sees it cut activation memory."""

import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from experiments.configs import tiny_moe
from experiments.tools import compile_check
from moejax.model.transformer import Transformer, param_counts
from moejax.schema import ModelConfig
from tests.test_model import small_model_cfg


def loss_and_grads(remat: str, scan_layers: bool = True):
    cfg = small_model_cfg()
    cfg.num_layers, cfg.first_k_dense = 4, 1
    graphdef, params = nnx.split(Transformer(ModelConfig.from_config(cfg), rngs=nnx.Rngs(0), remat=remat, scan_layers=scan_layers))
    tokens = jax.random.randint(jax.random.key(1), (2, 16), 0, cfg.vocab_size)
    positions = jnp.broadcast_to(jnp.arange(16), (2, 16))

    def loss(params):
        logits, aux = nnx.merge(graphdef, params)(tokens, positions, jnp.ones_like(tokens))
        return jnp.mean(jax.nn.logsumexp(logits, -1)) + aux["balance_loss"]

    return jax.jit(jax.value_and_grad(loss))(params)


def test_remat_policies_and_unrolled_layers_give_the_same_loss_and_gradients():
    want_loss, want_grads = loss_and_grads("none")
    for remat, scan_layers in (("full", True), ("save_dots", True), ("none", False)):
        got_loss, got_grads = loss_and_grads(remat, scan_layers)
        np.testing.assert_allclose(got_loss, want_loss, rtol=1e-6)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), got_grads, want_grads)


def report(remat: str) -> dict:
    cfg = tiny_moe.get_config()
    cfg.train.remat, cfg.train.scan_layers = remat, True
    cfg.model.num_layers = 6
    return compile_check.compile_report(cfg)


def test_compile_report_is_exact_for_state_and_remat_cuts_activations():
    none, full = report("none"), report("full")
    cfg = tiny_moe.get_config()
    cfg.model.num_layers = 6
    # float32 parameters, replicated over the 8-way data mesh: every device holds all of them.
    params = 4 * param_counts(cfg.model)["total"]
    assert none["params_bytes"] == params
    assert none["opt_state_bytes"] >= 2 * params  # AdamW: two moments per parameter
    assert full["activations_bytes"] < 0.6 * none["activations_bytes"]
    assert none["peak_bytes"] >= none["arguments_bytes"]


@pytest.mark.parametrize("budget, code", [("0.001", 1), ("4", 0)])
def test_compile_check_exits_non_zero_over_budget(budget, code):
    out = subprocess.run(
        [sys.executable, "-m", "experiments.tools.compile_check", "--config", "experiments/configs/tiny_moe.py",
         "--devices", "8", "--budget_gib", budget, "--config.model.num_layers=2"],
        capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == code, out.stderr[-2000:]
    if code:
        assert "exceeds the budget of 0.00 GiB" in out.stderr and "train.remat=full" in out.stderr
    else:
        assert "fits the budget" in out.stdout and "activations" in out.stdout


def test_large_config_fits_an_80_gib_device_on_64_devices(tmp_path):
    """CI's compile-only check of the shipped large config (nothing is allocated)."""
    out = subprocess.run(
        [sys.executable, "-m", "experiments.tools.compile_check", "--config", "experiments/configs/deepseek_16b.py",
         "--devices", "64", "--budget_gib", "80", "--json", str(tmp_path / "report.json")],
        capture_output=True, text=True, timeout=900,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    with open(tmp_path / "report.json") as f:
        report = json.load(f)
    assert report["mesh"] == {"data": 1, "fsdp": 8, "expert": 8, "tensor": 1}
    assert report["params_bytes"] < 2 * 2**30 and report["peak_bytes"] < 80 * 2**30
