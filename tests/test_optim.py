"""Learning-rate schedules and the weight-decay mask."""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from moejax.checks import validate
from moejax.config import default_config, effective_warmup_steps
from moejax.errors import ConfigError
from moejax.train.optim import decay_mask, lr_schedule, make_optimizer
from tests.test_model import small_model_cfg
from moejax.model.transformer import Transformer
from moejax.schema import ModelConfig


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
    mask = decay_mask(nnx.state(Transformer(ModelConfig.from_config(cfg), rngs=nnx.Rngs(0))))
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


def test_a_warmup_longer_than_half_the_run_is_shortened_with_a_note(capsys):
    # ./launch.sh --config.train.steps=20: the default 40-step warmup becomes 10 steps, then decay.
    cfg = default_config()
    cfg.train.steps = 20
    validate(cfg, 8)
    assert capsys.readouterr().err == (
        "moejax: note: optim.warmup_steps=40 is more than half of train.steps=20; warming up over 10 steps instead.\n")
    s = lr_schedule(cfg.optim, 20)
    lr = cfg.optim.lr
    assert float(s(5)) == pytest.approx(lr / 2) and float(s(10)) == pytest.approx(lr)
    assert float(s(20)) == pytest.approx(lr * cfg.optim.min_lr_ratio)
    assert [effective_warmup_steps(w, 20) for w in (0, 9, 10, 11, 40)] == [0, 9, 10, 10, 10]
    assert effective_warmup_steps(40, 1) == 0  # a 1-step run starts at the peak


def test_a_warmup_that_fits_is_kept_and_a_negative_one_is_refused(capsys):
    cfg = default_config()
    cfg.train.steps, cfg.optim.warmup_steps = 20, 10
    validate(cfg, 8)
    assert capsys.readouterr().err == ""
    assert float(lr_schedule(cfg.optim, 20)(5)) == pytest.approx(cfg.optim.lr / 2)
    cfg.optim.warmup_steps = -1
    with pytest.raises(ConfigError, match=r"'optim.warmup_steps' has value -1; allowed: "):
        validate(cfg, 8)
