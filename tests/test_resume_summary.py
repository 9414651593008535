"""A run stopped by SIGTERM and resumed prints the whole run's summary (first and last eval loss).

One small run on a prepared two-domain dataset, with the mixture given per domain on the command
line (domains the default config does not know). SIGTERM arrives when the loop announces training
(before the step-0 evaluation; the steps were compiled while the data loaded), so the run stops
after one of its first steps; the resumed process never evaluates step 0 itself and must read it
back from metrics.jsonl.
"""
import json
import os
import re
import random
import signal
import subprocess
import sys
import time

import pytest

from moejax.data.prepare import prepare_dataset

STEPS = 10
TINY = [
    f"--config.train.steps={STEPS}", "--config.train.eval_every=5", "--config.train.log_every=5",
    "--config.checkpoint.every_steps=5", "--config.optim.warmup_steps=1", "--config.train.seq_len=32",
    "--config.train.global_batch_size=8", "--config.train.eval_batches=1", "--config.model.d_model=32",
    "--config.model.num_layers=1", "--config.model.mlp_dim=64", "--config.model.moe.expert_dim=32",
    "--config.model.moe.shared_expert_dim=32",
    # The signal comes during the first compile, which can take a minute on a loaded machine: the
    # grace period (exit anyway after this long) must outlast it, or the stop is not a clean one.
    "--config.checkpoint.grace_seconds=600",
]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("resume")
    rng = random.Random(0)
    for domain, words in (("recipes", ["salt", "flour", "egg", "milk"]), ("logs", ["INFO", "WARN", "ok", "fail"])):
        (root / domain).mkdir()
        with open(root / domain / "docs.jsonl", "w") as f:
            for i in range(200):
                f.write(json.dumps({"text": f"{domain} {i}: " + " ".join(rng.choice(words) for _ in range(30))}) + "\n")
    out = root / "ds"
    prepare_dataset([f"recipes={root / 'recipes'}", f"logs={root / 'logs'}"], out, heldout_fraction=0.3,
                    progress=False)
    return str(out)


def _command(workdir, dataset):
    return [sys.executable, "-m", "moejax.main", "--config", "experiments/configs/tiny_moe.py", "--workdir", workdir,
            f"--config.data.path={dataset}", "--config.data.mixture.recipes=0.7", "--config.data.mixture.logs=0.3",
            *TINY]


def test_sigterm_then_resume_prints_first_and_last_eval_of_the_whole_run(dataset, tmp_path):
    workdir = str(tmp_path / "run")
    first = subprocess.Popen(_command(workdir, dataset), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
    lines = []
    deadline = time.monotonic() + 240
    for line in first.stdout:  # the loop says when it starts the first train step
        lines.append(line)
        if "moejax: training (the steps compiled" in line:
            first.send_signal(signal.SIGTERM)
            break
        assert time.monotonic() < deadline, "".join(lines)
    rest, _ = first.communicate(timeout=240)
    output = "".join(lines) + rest
    assert first.returncode == 128 + signal.SIGTERM, output
    # The signal lands during the step-0 evaluation or the first steps (compiled while the data
    # loaded, so a tiny step is quick): the run stops cleanly after the step it was in.
    stopped = re.search(r"stopped by SIGTERM at step (\d+); checkpoint saved", output)
    assert stopped and 1 <= int(stopped[1]) < STEPS, output
    resumed_from = int(stopped[1])
    assert not any(line.startswith("done:") for line in output.splitlines())

    second = subprocess.run(_command(workdir, dataset), capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"resuming from step {resumed_from}" in second.stdout + second.stderr
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    evals = [(r["step"], r["eval_loss"]) for r in records if "eval_loss" in r]
    assert [step for step, _ in evals] == [0, 5, STEPS]  # one continuous curve over both processes
    (done,) = [line for line in second.stdout.splitlines() if line.startswith("done:")]
    assert done == (f"done: step {STEPS} (resumed from step {resumed_from}), eval_loss {evals[0][1]:.3f} at step 0 -> "
                    f"{evals[-1][1]:.3f} at step {STEPS}, workdir {workdir}")
    assert "nan" not in done
    assert evals[-1][1] < evals[0][1]  # it trained: the loss fell from the initial one
    assert records[-1]["tokens/recipes"] > records[-1]["tokens/logs"] > 0  # the per-domain mixture applied


def test_schedule_stage_switch_is_logged_to_stdout_metrics_and_tensorboard(dataset, tmp_path, capsys):
    from moejax.config import default_config
    from moejax.train.loop import train

    cfg = default_config()
    for arg in TINY:
        key, value = arg[len("--config."):].split("=")
        section, *rest = key.split(".")
        group = cfg[section]
        for part in rest[:-1]:
            group = group[part]
        group[rest[-1]] = type(group[rest[-1]])(value)
    cfg.train.steps, cfg.train.eval_every = 4, 4
    cfg.data.path = dataset
    cfg.data.schedule = '[[0, {"recipes": 1}], [2, {"logs": 1}]]'
    workdir = str(tmp_path / "staged")
    train(cfg, workdir)
    out = capsys.readouterr()
    text = out.out + out.err
    assert "data.schedule stage 1 of 2 (from batch 0) trains step 1 on: recipes 1" in text
    assert "data.schedule stage 2 of 2 (from batch 2) trains step 3 on: logs 1" in text
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        records = {r["step"]: r for r in map(json.loads, f)}
    assert records[3]["stage"] == 1 and records[3]["tokens/logs"] > 0  # a logged step although log_every=5
    assert records[4]["stage"] == 1 and 2 not in records
    (events,) = [name for name in os.listdir(workdir) if name.startswith("events.out.tfevents")]
    with open(os.path.join(workdir, events), "rb") as f:
        assert b"stage" in f.read()  # the scalar's tag
