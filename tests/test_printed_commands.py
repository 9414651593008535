"""Every command moejax and data_mixture print runs as printed from the user's directory (optimize,
plan, sweep, hf import: moejax/commands.py), on the user's own dataset with its own tokenizer; each
law's minimum runs; fit --holdout."""

from __future__ import annotations

import csv
import json
import os
import shlex
import subprocess
import sys

import numpy as np
import pytest

from data_mixture.__main__ import main as dm_main
from moejax import commands
from moejax.commands import LAUNCH_SCRIPT, python_command, train_command
from moejax.data.prepare import prepare_dataset

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHORT = ["--config.train.steps=2", "--config.train.global_batch_size=8", "--config.train.seq_len=32",
         "--config.train.eval_batches=1"]  # a few steps of the printed command


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> str:
    """Three domains, a 400-token BPE: the printed command must not need a vocabulary size."""
    root = tmp_path_factory.mktemp("printed")
    for name, count in (("changelog", 200), ("licenses", 80), ("man", 120)):
        with open(root / f"{name}.jsonl", "w") as f:
            f.writelines(json.dumps({"text": f"{name} {i}: " + f"w{i % 13} " * 20}) + "\n" for i in range(count))
    out = str(root / "ds")
    prepare_dataset([f"{n}={root / n}.jsonl" for n in ("changelog", "licenses", "man")], out, tokenizer="bpe",
                    vocab_size=400, heldout_fraction=0.3, shard_mb=0.02, workers=1, progress=False, seq_len=32)
    return out


@pytest.fixture(scope="module")
def runs_csv(tmp_path_factory) -> str:
    """A small runs table over the dataset's domains, two sizes."""
    rng = np.random.default_rng(0)
    path = str(tmp_path_factory.mktemp("runs") / "runs.csv")
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["run", "params_total", "params_active", "tokens", "mix:changelog", "mix:licenses", "mix:man",
                         "loss:all"])
        for i in range(12):
            w = rng.dirichlet([1, 1, 1])
            for n in (1e6, 2e6):
                writer.writerow([f"r{i}_{n:.0f}", n, n, 20 * n, *w, 3 + 1 / np.log(n) - 0.3 * w[0] + 0.2 * w[1] ** 2])
    return path


def _printed_command(text: str, marker: str) -> list[str]:
    line = next(line for line in text.splitlines() if marker in line)
    return shlex.split(line.split(marker, 1)[1])


def test_laws_print_their_minimum_runs_and_fit_holds_out_as_evaluate_does(runs_csv, tmp_path, capsys):
    dm_main(["laws", "--domains", "3"])
    table = capsys.readouterr().out
    assert "law            sizes  M=3" in table
    assert [line.split() for line in table.splitlines() if line.startswith("camel")] == [["camel", "2", "19"]]
    dm_main(["fit", "--runs", runs_csv, "--law", "regmix_linear", "--out", str(tmp_path / "fit.json"),
             "--bootstrap", "0", "--holdout", "largest", "-q"])
    assert "fitted without the rows of the largest size 2e+06 (params_total) (12 rows left)" in capsys.readouterr().out
    fit = json.loads((tmp_path / "fit.json").read_text())
    assert fit["info"]["held_out"].startswith("largest size 2e+06") and fit["info"]["n_rows"] == 12
    with pytest.raises(SystemExit) as caught:
        dm_main(["fit", "--runs", runs_csv, "--law", "regmix_linear", "--out", str(tmp_path / "f2.json"),
                 "--holdout", "each"])
    assert caught.value.code == 2
    assert "--holdout each makes one fit per held-out size" in capsys.readouterr().err


@pytest.mark.slow  # trains two steps through launch.sh
def test_optimize_prints_a_command_with_the_dataset_that_trains(dataset, runs_csv, tmp_path, capsys):
    fit = str(tmp_path / "fit.json")
    dm_main(["fit", "--runs", runs_csv, "--law", "regmix_linear", "--out", fit, "--bootstrap", "0", "-q"])
    mixture = str(tmp_path / "mix.json")
    dm_main(["optimize", "--fit", fit, "--size", "3e6", "--tokens", "1e4", "--no-bootstrap", "--dataset", dataset,
             "--out", mixture])
    command = _printed_command(capsys.readouterr().out, "train with: ")
    assert command[:2] == [str(LAUNCH_SCRIPT), os.path.join(ROOT, "experiments/configs/tiny_moe.py")]
    assert f"--config.data.path={dataset}" in command and f"--config.data.mixture_file={mixture}" in command
    assert not any("vocab_size" in arg for arg in command)  # derived from the dataset's tokenizer
    workdir = str(tmp_path / "w")
    command[command.index("--workdir") + 1] = workdir
    proc = subprocess.run(["bash", *command, *SHORT], cwd=tmp_path, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "MOEJAX_PYTHON": sys.executable})  # from the user's directory
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "derived model.vocab_size=512" in proc.stdout
    assert "done: step 2" in proc.stdout


@pytest.mark.slow  # plans, then trains two steps through launch.sh
def test_plan_runs_on_the_dataset_and_its_printed_command_trains(dataset, tmp_path, capsys, caplog):
    plan = str(tmp_path / "plan.json")
    dm_main(["plan", "--budget-flops", "6e14", "--target-size", "3e6", "--target-tokens", "6e7", "--dataset", dataset,
             "--simulations", "1", "--sim-starts", "4", "--min-runs-per-size", "3", "--out", plan, "-q"])
    out = capsys.readouterr().out
    runs = json.loads(open(plan).read())["runs"]
    assert all(r["overrides"]["data.path"] == dataset for r in runs)
    assert set(runs[0]["mixture"]) == {"changelog", "licenses", "man"}  # the dataset's domains, not asked for
    command = _printed_command(out, "each run trains as, e.g.: ")
    command[command.index("--workdir") + 1] = str(tmp_path / "run")
    proc = subprocess.run(["bash", *command, *SHORT], cwd=tmp_path, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "MOEJAX_PYTHON": sys.executable})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "done: step 2" in proc.stdout


def test_a_sweep_run_command_round_trips_through_moejax_s_own_parser(dataset):
    """The line sweep and plan print for a run (launch_command): quoted for the shell, parsed back
    by moejax's command line into the run's overrides."""
    from data_mixture.sweep.targets import launch_command
    from moejax.main import parse_command_line

    overrides = {"model.d_model": 64, "train.steps": 3, "data.mixture": {"changelog": 0.5, "man": 0.5},
                 "data.path": dataset}
    args = shlex.split(launch_command("experiments/configs/tiny_moe.py", "/tmp/run dir", overrides))
    assert args[:4] == [str(LAUNCH_SCRIPT), os.path.join(ROOT, "experiments/configs/tiny_moe.py"), "--workdir", "/tmp/run dir"]
    command = parse_command_line(["moejax.main", "--config", args[1], *args[2:]])
    cfg = command.config
    assert (cfg.model.d_model, cfg.train.steps, cfg.data.path) == (64, 3, dataset)
    assert dict(cfg.data.mixture) == {"changelog": 0.5, "man": 0.5} and command.workdir == "/tmp/run dir"


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
