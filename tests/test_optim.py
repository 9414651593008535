"""Learning-rate schedules and the weight-decay mask."""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from moejax.config import default_config
from moejax.train.optim import decay_mask, lr_schedule, make_optimizer
from tests.test_model import small_model_cfg
from moejax.model.transformer import Transformer


def optim_cfg(schedule):
    o = default_config().optim
    o.lr, o.warmup_steps, o.min_lr_ratio, o.schedule, o.decay_fraction = 1.0, 10, 0.1, schedule, 0.2
    return o


def test_cosine_warms_up_then_decays_to_the_floor():
    s = lr_schedule(optim_cfg("cosine"), 110)
    assert float(s(0)) == 0.0 and float(s(5)) == pytest.approx(0.5)
    assert float(s(10)) == pytest.approx(1.0)
    assert float(s(60)) == pytest.approx(0.55, abs=1e-3)  # halfway: (1 + 0.1) / 2
    assert float(s(110)) == pytest.approx(0.1)


def test_wsd_is_flat_then_decays_linearly_over_the_last_fraction():
    s = lr_schedule(optim_cfg("wsd"), 110)
    assert float(s(50)) == pytest.approx(1.0) and float(s(90)) == pytest.approx(1.0)
    assert float(s(100)) == pytest.approx(0.55) and float(s(110)) == pytest.approx(0.1)


def test_weight_decay_skips_norms_and_vectors():
    cfg = small_model_cfg()
    cfg.first_k_dense = 1
    mask = decay_mask(nnx.state(Transformer(cfg, rngs=nnx.Rngs(0))))
    assert mask["final_norm"]["scale"] is False
    assert mask["layers"][0]["attn_norm"]["scale"] is False  # [layers, d]: still a vector per layer
    assert mask["layers"][0]["attn"]["w_q_dnh"] is True
    assert mask["layers"][1]["mlp"]["w_gate_edf"] is True
    assert mask["layers"][1]["mlp"]["router"]["w_de"] is True


def test_norm_scales_are_not_decayed_by_the_optimizer():
    o = optim_cfg("cosine")
    o.weight_decay, o.lr, o.warmup_steps = 0.5, 1e-2, 0
    opt, _ = make_optimizer(o, 10, {"scale": False, "w": True})
    params = {"scale": jnp.ones(3), "w": jnp.ones((2, 2))}
    updates, _ = opt.update(jax_zeros(params), opt.init(params), params)
    np.testing.assert_allclose(updates["scale"], 0.0)  # zero gradient, no decay
    assert float(updates["w"][0, 0]) < 0.0  # zero gradient, decayed


def jax_zeros(tree):
    return {k: jnp.zeros_like(v) for k, v in tree.items()}
