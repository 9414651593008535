"""The typed model configs (moejax/schema.py): one declaration per model.* key, equal to the
command line's defaults, converted once from the ConfigDict, and the source of its checks."""

from __future__ import annotations

import dataclasses

import pytest

from moejax.config import CHOICES, NON_NEGATIVE, POSITIVE, default_config, get_path
from moejax.schema import DispatchConfig, ModelConfig, MoEConfig, declared_keys


def test_every_model_key_is_documented_where_it_is_declared():
    """default_config()'s model group is generated from the declarations, so each knob's one-line
    doc lives there."""
    keys = dict(declared_keys(ModelConfig, "model"))
    assert "model.moe.grouped_matmul" in keys and "model.l3.allocation" in keys
    for key, field in keys.items():
        assert field.default == get_path(default_config(), key), key
        assert field.metadata["doc"].strip(), key


def test_from_config_converts_the_defaults_and_an_override():
    cfg = default_config()
    assert ModelConfig.from_config(cfg.model) == ModelConfig()
    cfg.model.moe.grouped_matmul, cfg.model.moe.backend, cfg.model.l3.after_layers = "tiled", "capacity", (1,)
    typed = ModelConfig.from_config(cfg.model)
    assert typed.moe.dispatch == DispatchConfig(backend="capacity", impl="tiled")
    assert typed.l3.after_layers == (1,) and typed.moe.num_experts == cfg.model.moe.num_experts
    assert hash(typed) == hash(ModelConfig.from_config(cfg.model))  # static in the model graph
    with pytest.raises(dataclasses.FrozenInstanceError):
        typed.d_model = 3  # type: ignore[misc]


def test_config_checks_are_generated_from_the_declarations():
    assert CHOICES["model.moe.backend"] == ("dropless", "capacity", "expert_parallel")  # default first
    assert CHOICES["model.moe.grouped_matmul"] == ("auto", "ragged", "tokamax", "tiled", "hybrid")
    assert "model.moe.tile_size" in POSITIVE and "model.moe.ep_spill_slots" in POSITIVE
    assert "model.moe.num_shared_experts" in NON_NEGATIVE and "model.logits_z_loss" in NON_NEGATIVE
    assert "train.steps" in POSITIVE  # keys outside model.* keep their hand lists


def test_a_bad_field_is_an_error_when_built():
    with pytest.raises(ValueError, match=r"num_experts must be an int >= 1, got 0"):
        MoEConfig(num_experts=0)
    with pytest.raises(ValueError, match=r"ep_comm must be one of \('all_to_all', 'all_gather'\), got 'ring'"):
        DispatchConfig(ep_comm="ring")
