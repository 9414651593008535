"""Every shipped experiment config validates, has the advertised size, and shards on a real mesh."""

import importlib

import jax
import pytest

from moejax import sharding
from moejax.checks import validate
from moejax.model.transformer import param_counts
from moejax.train.state import setup

SIZES = {  # name: (total params, active params), within 5%
    "tiny_moe": (3.8e6, 1.4e6),
    "small_moe": (100e6, 24e6),
    "deepseek_16b": (15.8e9, 2.7e9),
}


@pytest.mark.parametrize("name", sorted(SIZES))
def test_config_validates_and_has_its_size(name):
    cfg = importlib.import_module(f"experiments.{name}").get_config()
    mesh_shape = validate(cfg, 8)
    counts = param_counts(cfg.model)
    total, active = SIZES[name]
    assert counts["total"] == pytest.approx(total, rel=0.05)
    assert counts["active"] == pytest.approx(active, rel=0.05)
    # Abstract setup: shapes, shardings and divisibility over 8 devices, nothing allocated.
    run = setup(cfg, sharding.make_mesh(mesh_shape, jax.devices()))
    assert run.abstract_state["step"].shape == ()


def test_deepseek_config_is_deepseek_shaped():
    cfg = importlib.import_module("experiments.deepseek_16b").get_config().model
    assert cfg.first_k_dense == 1 and cfg.moe.num_shared_experts == 2
    assert cfg.moe.num_experts == 64 and cfg.moe.experts_per_token == 6 and not cfg.tie_embeddings
