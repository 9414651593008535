"""Every shipped experiment config (experiments/configs/) validates, has the advertised size, and shards on a
real mesh; the configs' old paths (experiments/<name>.py) still load them."""

import importlib
import os
import subprocess
import sys
import threading

import jax
import pytest

from moejax import configs, sharding
from moejax.checks import validate
from moejax.main import parse_command_line
from moejax.model.transformer import param_counts
from moejax.train.state import setup

SIZES = {  # name: (total params, active params), within 5%
    "tiny_moe": (3.8e6, 1.4e6),
    "small_moe": (100e6, 24e6),
    "deepseek_16b": (15.8e9, 2.7e9),
}


@pytest.mark.parametrize("name", sorted(SIZES))
def test_config_validates_and_has_its_size(name):
    cfg = importlib.import_module(f"experiments.configs.{name}").get_config()
    mesh_shape = validate(cfg, 8)
    counts = param_counts(cfg.model)
    total, active = SIZES[name]
    assert counts["total"] == pytest.approx(total, rel=0.05)
    assert counts["active"] == pytest.approx(active, rel=0.05)
    # Abstract setup: shapes, shardings and divisibility over 8 devices, nothing allocated.
    run = setup(cfg, sharding.make_mesh(mesh_shape, jax.devices()))
    assert run.abstract_state["step"].shape == ()


def test_deepseek_config_is_deepseek_shaped():
    cfg = importlib.import_module("experiments.configs.deepseek_16b").get_config().model
    assert cfg.first_k_dense == 1 and cfg.moe.num_shared_experts == 2
    assert cfg.moe.num_experts == 64 and cfg.moe.experts_per_token == 6 and not cfg.tie_embeddings


def test_old_config_paths_load_the_same_config_with_a_note(capsys, monkeypatch):
    """The configs moved from experiments/<name>.py to experiments/configs/<name>.py: the old path
    (older commands, committed sweep plans) loads the same config, with one note naming the new path."""
    monkeypatch.setattr(configs, "_noted", set())
    new = parse_command_line(["moejax.main", "--config", "experiments/configs/tiny_moe.py", "--workdir", "unused"])
    assert capsys.readouterr().err == ""
    old = parse_command_line(["moejax.main", "--config", "experiments/tiny_moe.py", "--workdir", "unused"])
    assert old.config.to_dict() == new.config.to_dict()
    err = capsys.readouterr().err.splitlines()
    assert err == ["note: experiments/tiny_moe.py is now experiments/configs/tiny_moe.py (the old path still works)"]



def test_config_files_load_from_several_threads_at_once():
    """The sweep resolves its runs from one thread per runner; each call gets its own file's config
    (each file is loaded as a module of its own name: no shared module, no lock)."""
    files = {"tiny_moe": "experiments/configs/tiny_moe.py", "small_moe": "experiments/configs/small_moe.py"}
    expected = {name: parse_command_line(["m", "--config", f, "--workdir", "w"]).config.to_dict()
                for name, f in files.items()}
    failures = []

    def load(name):
        try:
            for _ in range(10):
                got = parse_command_line(["m", "--config", files[name], "--workdir", "w"]).config.to_dict()
                if got != expected[name]:
                    failures.append(f"{name}: got another file's config")
        except BaseException as e:  # noqa: B036 -- SystemExit from _die included
            failures.append(f"{name}: {e!r}")

    threads = [threading.Thread(target=load, args=(name,)) for name in [*files] * 2]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []

def test_launch_sh_takes_an_old_config_path_with_a_note(tmp_path):
    env = {**os.environ, "MOEJAX_PYTHON": sys.executable, "MOEJAX_ALLOCATOR": "system"}
    done = subprocess.run(["./launch.sh", "experiments/tiny_moe.py", "--workdir", str(tmp_path / "run"),
                           "--config.train.steps=abc"], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2  # the bad override is reported against the config the old path found
    assert "launch.sh: note: experiments/tiny_moe.py is now experiments/configs/tiny_moe.py" in done.stderr
    assert "'train.steps' takes an integer" in done.stderr and "Traceback" not in done.stderr
