"""The user's paths and outputs (moejax/paths.py): relative to where the user ran the command, and
never overwritten or mixed."""

import os

import pytest

import moejax
from moejax import paths
from moejax.errors import ConfigError


def test_relative_paths_resolve_where_the_user_ran_launch_sh(tmp_path, monkeypatch):
    monkeypatch.setattr(moejax, "CALLER_CWD", str(tmp_path))
    assert paths.user_path("logs.jsonl") == str(tmp_path / "logs.jsonl")
    assert paths.user_path("/abs/x") == "/abs/x"
    assert paths.user_path("~/ds") == os.path.expanduser("~/ds")
    assert paths.user_path("") == ""
    # an input the repository holds is found there when the user's directory lacks it
    assert paths.user_input_path("experiments/configs/tiny_moe.py") == "experiments/configs/tiny_moe.py"
    (tmp_path / "experiments" / "configs").mkdir(parents=True)
    (tmp_path / "experiments" / "configs" / "tiny_moe.py").write_text("")
    assert paths.user_input_path("experiments/configs/tiny_moe.py") == str(tmp_path / "experiments" / "configs" / "tiny_moe.py")
    monkeypatch.setattr(moejax, "CALLER_CWD", os.getcwd())  # launched from the repository itself
    assert paths.user_path("logs.jsonl") == os.path.abspath("logs.jsonl")  # absolute: no library reads it otherwise


def test_existing_outputs_are_refused_unless_forced(tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    (tmp_path / "empty").mkdir()
    (tmp_path / "file").write_text("mine")
    with pytest.raises(ConfigError, match=r"--out .*full already holds files; refusing to overwrite it.*--force"):
        paths.check_new_output(str(tmp_path / "full"), "--out", force=False)
    paths.check_new_output(str(tmp_path / "full"), "--out", force=True)
    paths.check_new_output(str(tmp_path / "empty"), "--out", force=False)
    paths.check_new_output(str(tmp_path / "new" / "dir"), "--out", force=False)
    with pytest.raises(ConfigError, match=r"--out .*file is a file; --out takes a directory"):
        paths.check_new_output(str(tmp_path / "file"), "--out", force=True)
    with pytest.raises(ConfigError, match=r"has a file, .*file, where a directory should be"):
        paths.make_dir(str(tmp_path / "file" / "sub"), "--workdir")
    with pytest.raises(ConfigError, match=r"--out .*file already exists; refusing"):
        paths.check_new_file(str(tmp_path / "file"), "--out", force=False)
    with pytest.raises(ConfigError, match=r"cannot create the directory"):
        paths.make_dir("/proc/moejax_cannot_create_this", "--workdir")
    assert (tmp_path / "full" / "keep.txt").read_text() == "mine"


def test_replace_dir_swaps_whole_directories_and_keeps_the_old_one_on_failure(tmp_path):
    target = tmp_path / "hf"
    target.mkdir()
    for name in ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "index.json"):
        (target / name).write_text("old")
    with pytest.raises(RuntimeError):
        with paths.replace_dir(str(target)) as tmp:
            (tmp_path / "x").write_text("")
            open(os.path.join(tmp, "model.safetensors"), "w").close()
            raise RuntimeError("cut short")
    assert sorted(os.listdir(target)) == ["index.json", "model-00001-of-00002.safetensors",
                                          "model-00002-of-00002.safetensors"]
    with paths.replace_dir(str(target)) as tmp:
        with open(os.path.join(tmp, "model.safetensors"), "w") as f:
            f.write("new")
    assert os.listdir(target) == ["model.safetensors"]  # no old shard beside the new file
    assert sorted(p for p in os.listdir(tmp_path) if p.startswith(".")) == []  # no temporaries left
    paths.write_file(str(tmp_path / "r.json"), lambda f: f.write("{}"))
    assert (tmp_path / "r.json").read_text() == "{}"
