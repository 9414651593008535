"""Commands printed for the user run as printed from the user's directory (moejax/commands.py)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

from moejax import commands
from moejax.commands import LAUNCH_SCRIPT, python_command, train_command


def test_a_printed_python_command_runs_from_another_directory(tmp_path):
    command = python_command("data_mixture", ["laws", "--domains", "3"])
    assert command.startswith(f"{LAUNCH_SCRIPT} python -m data_mixture ")
    env = {k: v for k, v in os.environ.items() if k != "MOEJAX_CALLER_CWD"}
    env.setdefault("MOEJAX_PYTHON", sys.executable)
    done = subprocess.run(command, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "camel" in done.stdout


def test_a_printed_training_command_names_absolute_launcher_and_experiment(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # not the repository: ./launch.sh and a repo-relative config would fail here
    argv = shlex.split(train_command("experiments/configs/tiny_moe.py", tmp_path / "run", ["--config.train.steps=12"]))
    assert argv[0] == str(LAUNCH_SCRIPT) and os.path.isabs(argv[0]) and os.path.isfile(argv[0])
    assert argv[1] == str(commands.REPO_ROOT / "experiments/configs/tiny_moe.py") and os.path.isfile(argv[1])
    assert argv[2:] == ["--workdir", str(tmp_path / "run"), "--config.train.steps=12"]


def test_installed_without_launch_sh_the_console_scripts_are_printed(tmp_path, monkeypatch):
    monkeypatch.setattr(commands, "LAUNCH_SCRIPT", tmp_path / "no-launch.sh")
    assert train_command("tiny_moe", "/w", []) == "moejax train tiny_moe --workdir /w"
    assert python_command("data_mixture", ["fit", "--runs", "a b.csv"]) == "data-mixture fit --runs 'a b.csv'"
    assert python_command("some.module", ["x"]) == f"{shlex.quote(sys.executable)} -m some.module x"


def test_the_sweep_and_mixture_commands_go_through_the_helper(tmp_path, monkeypatch):
    from data_mixture.sweep.targets import launch_command

    monkeypatch.chdir(tmp_path)
    text = launch_command("experiments/configs/tiny_moe.py", "runs/x", {"data.mixture": {"a": 0.5, "b": 0.5}})
    argv = shlex.split(text)
    assert argv[0] == str(LAUNCH_SCRIPT)
    assert argv[3] == str(tmp_path / "runs/x")  # the workdir where the user is, absolute
    assert argv[4] == '--config.data.mixture={"a": 0.5, "b": 0.5}'
