"""Config validation: errors name the key, the value and what is allowed, before any compile."""

import subprocess
import sys

import pytest

from moejax.checks import validate
from moejax.config import default_config, resolve_mesh_shape
from moejax.errors import ConfigError


def test_defaults_are_valid():
    assert validate(default_config(), 8) == {"data": 8, "fsdp": 1, "expert": 1, "tensor": 1}


def test_mesh_fill_and_product():
    c = default_config().mesh
    c.data, c.fsdp, c.expert = 2, -1, 2
    assert resolve_mesh_shape(c, 8) == {"data": 2, "fsdp": 2, "expert": 2, "tensor": 1}
    c.fsdp = 3
    with pytest.raises(ConfigError, match=r"multiply to 12, but there are 8 devices"):
        resolve_mesh_shape(c, 8)
    c.fsdp, c.tensor = -1, -1
    with pytest.raises(ConfigError, match="at most one axis"):
        resolve_mesh_shape(c, 8)


@pytest.mark.parametrize(
    "path, value, message",
    [
        ("model.num_kv_heads", 3, r"'model.num_kv_heads' has value 3; allowed: a divisor of model.num_heads=4"),
        ("model.moe.experts_per_token", 9, r"experts_per_token' has value 9; allowed: at most model.moe.num_experts=8"),
        ("train.global_batch_size", 12, r"global_batch_size' has value 12; allowed: a multiple of 8"),
        ("model.moe.backend", "magic", r"'model.moe.backend' has value 'magic'; allowed: dropless \| capacity"),
        ("train.seq_len", 0, r"'train.seq_len' has value 0; allowed: a positive value"),
        ("optim.b2", 1.5, r"'optim.b2' has value 1.5; allowed: a number in \[0, 1\]"),
        ("model.first_k_dense", 7, r"first_k_dense' has value 7; allowed: at most model.num_layers=4"),
        ("model.moe.num_groups", 3, r"'model.moe.num_groups' has value 3; allowed: a divisor of model.moe.num_experts=8"),
        ("model.moe.topk_groups", 2, r"'model.moe.topk_groups' has value 2; allowed: at most model.moe.num_groups=1"),
        ("model.moe.num_groups", 8, r"num_groups' has value 8; allowed: at most model.moe.num_experts / 2 = 4"),
    ],
)
def test_bad_values_name_key_value_and_allowed(path, value, message):
    cfg = default_config()
    group, key = path.rsplit(".", 1)
    node = cfg
    for part in group.split("."):
        node = node[part]
    node[key] = value
    with pytest.raises(ConfigError, match=message):
        validate(cfg, 8)


def test_unknown_key_suggests_the_right_one():
    cfg = default_config()
    cfg.model.num_layer = 3
    with pytest.raises(ConfigError, match=r"unknown config key 'model.num_layer'. Did you mean 'model.num_layers'"):
        validate(cfg, 1)


def test_mixture_weights_checked():
    cfg = default_config()
    cfg.data.mixture.code = -1.0
    with pytest.raises(ConfigError, match=r"'data.mixture.code' has value -1.0; allowed: a finite weight >= 0"):
        validate(cfg, 1)
    cfg.data.mixture = {"code": 0.0}
    with pytest.raises(ConfigError, match="not all zero"):
        validate(cfg, 1)


def _launch(*args):
    return subprocess.run(
        [sys.executable, "-m", "moejax.main", "--config", "experiments/configs/tiny_moe.py", "--workdir", "/tmp/unused", *args],
        capture_output=True, text=True, timeout=120,
    )


def test_cli_typo_gives_one_paragraph_error_not_a_traceback():
    out = _launch("--config.modle.num_layers=4")
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert 'Did you mean "model"' in out.stderr and "moejax: error:" in out.stderr


def test_cli_impossible_value_is_rejected_before_compile():
    out = _launch("--config.model.moe.experts_per_token=20")
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert "'model.moe.experts_per_token' has value 20; allowed: at most model.moe.num_experts=8" in out.stderr


def test_cli_wrong_type_is_rejected_cleanly():
    out = _launch("--config.model.num_layers=2.5")
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert "moejax: error: flag --config.model.num_layers=2.5" in out.stderr


def test_wrong_type_in_a_hand_built_config_is_named():
    cfg = default_config().to_dict()
    cfg["model"]["num_layers"] = "four"
    import ml_collections
    with pytest.raises(ConfigError, match=r"'model.num_layers' has value 'four'; allowed: an integer"):
        validate(ml_collections.ConfigDict(cfg), 1)


def test_a_mesh_axis_that_does_not_divide_the_devices_is_named_when_the_user_set_it():
    """--config.mesh.expert=3 on 4 devices: the message is about mesh.expert, not the -1 it leaves to fill."""
    cfg = default_config()
    cfg.mesh.expert = 3
    with pytest.raises(ConfigError) as error:
        validate(cfg, 4, changed=("mesh.expert",))
    assert str(error.value).startswith("config key 'mesh.expert' has value 3; allowed: a size that, times the "
                                       "other fixed axes (1), divides the 4 devices.")
    with pytest.raises(ConfigError, match=r"^config key 'mesh.data' has value -1; allowed: a fill of the 4 devices"):
        validate(cfg, 4)  # set in an experiment file: the axis that cannot be filled
