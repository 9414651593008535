"""MergeMix experts (data_mixture/mergemix/experts.py) and moejax's constant learning-rate schedule."""

import json
import os
import shutil
import types
from pathlib import Path

import pytest

from data_mixture.mergemix import experts as ex
from moejax.checks import validate
from moejax.config import default_config
from moejax.errors import ConfigError
from moejax.train.optim import lr_schedule
from tests.mergemix_fixture import (  # noqa: F401  (fixtures)
    BASE_STEP, EXPERT_EVAL_ARGS, EXPERT_TOKENS, TRAINED_DOMAINS, mergemix_experts, mergemix_runs,
)

TOKENS_PER_STEP = 8 * 64  # the fixture base: global batch 8 x seq_len 64


@pytest.fixture(scope="module")
def base(mergemix_runs):  # noqa: F811
    return os.path.join(mergemix_runs, "base")


def read_metrics(workdir):
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


# ------------------------------------------------------------------------------------- schedule


def test_constant_schedule_warms_up_then_stays_at_lr():
    o = default_config().optim
    o.lr, o.warmup_steps, o.schedule, o.min_lr_ratio, o.decay_fraction = 2.0, 10, "constant", 0.1, 0.2
    s = lr_schedule(o, 110)
    assert float(s(0)) == 0.0 and float(s(5)) == pytest.approx(1.0)
    assert [float(s(t)) for t in (10, 11, 60, 100, 110, 500)] == pytest.approx([2.0] * 6)
    # min_lr_ratio / decay_fraction are not read; a warmup past half the run is halved as for the others
    assert float(lr_schedule(o, 8)(4)) == pytest.approx(2.0) and float(lr_schedule(o, 8)(2)) == pytest.approx(1.0)


def test_config_accepts_constant_and_still_rejects_unknown_schedules():
    cfg = default_config()
    cfg.optim.schedule = "constant"
    validate(cfg, 1)
    cfg.optim.schedule = "flat"
    with pytest.raises(ConfigError, match="constant"):
        validate(cfg, 1)


# ----------------------------------------------------------------------------------------- plan


def test_plan_reproduces_the_base_and_keeps_every_fraction(base):
    from data_mixture.sweep.targets import targets_from_plan

    plan = ex.plan_experts(base, domains=["code", "math"], expert_tokens=16 * TOKENS_PER_STEP)
    assert [r["name"] for r in plan["runs"]] == ["expert_code", "expert_math"]
    run = plan["runs"][0]
    o = run["overrides"]
    assert o["checkpoint.init_from"] == os.path.abspath(base) and o["checkpoint.init_step"] == BASE_STEP
    assert o["data.mixture"] == {"code": 1.0, "knowledge": 0.0, "math": 0.0, "prose": 0.0}
    assert o["optim.schedule"] == "constant" and o["optim.lr"] == 3e-3  # the base's peak lr
    assert o["optim.warmup_steps"] == 1  # 5% of 16 steps -> 1 (the base's own warmup is 1)
    assert o["train.steps"] == 16 and run["steps"] == 16 and o["train.seed"] == 0
    # fractions 1/8, 1/4, 1/2, 1 -> steps 2, 4, 8, 16: saved every 2 steps, every save kept
    assert run["fraction_steps"] == {"0.125": 2, "0.25": 4, "0.5": 8, "1.0": 16}
    assert o["checkpoint.every_steps"] == 2 and o["checkpoint.keep_period"] == 2
    assert o["checkpoint.max_to_keep"] == 8 and run["checkpoint_steps"] == list(range(2, 17, 2))
    assert run["config"] == f"{ex.EXPERIMENT_FILE}:{BASE_STEP}:{os.path.abspath(base)}"
    assert plan["mergemix"]["tokens_per_step"] == TOKENS_PER_STEP

    # the sweep runner resolves each entry to the base's own config plus exactly these overrides
    targets = targets_from_plan(plan, "/tmp/unused")
    with open(os.path.join(base, "config.json")) as f:
        base_cfg = json.load(f)
    for t in targets:
        cfg = json.loads(json.dumps(t.resolved_config))  # tuples as config.json's lists
        assert cfg["model"] == base_cfg["model"] and cfg["mesh"] == base_cfg["mesh"]
        for key in ("global_batch_size", "seq_len", "grad_accum_steps", "compute_dtype", "param_dtype"):
            assert cfg["train"][key] == base_cfg["train"][key]
        assert cfg["data"]["path"] == base_cfg["data"]["path"]
        assert {k: v for k, v in cfg["optim"].items() if k not in ("schedule", "lr", "warmup_steps")} == {
            k: v for k, v in base_cfg["optim"].items() if k not in ("schedule", "lr", "warmup_steps")}
        assert t.checkpoint_steps == tuple(range(2, 17, 2)) and t.added_overrides == {}

    # uneven budget, explicit step, lr, warmup and fractions
    plan = ex.plan_experts(base, base_step=3, domains="math", expert_tokens=10 * TOKENS_PER_STEP + 1,
                           fractions=(0.5, 0.25, 1.0), lr=1e-3, warmup_steps=0, seed=7)
    (run,) = plan["runs"]
    # 11 steps asked, rounded up to 12 (a multiple of 4, the fractions' denominator)
    assert run["steps"] == 12 and run["overrides"]["checkpoint.init_step"] == 3
    assert run["fraction_steps"] == {"0.25": 3, "0.5": 6, "1.0": 12}
    assert run["overrides"]["checkpoint.every_steps"] == 3 and run["checkpoint_steps"] == [3, 6, 9, 12]
    assert run["overrides"]["optim.lr"] == 1e-3 and run["overrides"]["train.seed"] == 7
    assert ":3:" in run["config"]


def test_aligned_steps_keep_the_checkpoint_cadence_coarse():
    # 542 steps at the default fractions would save every step (fraction steps 68, 136, 271, 542)
    assert ex.aligned_steps(542, ex.DEFAULT_FRACTIONS) == 544  # fraction steps 68, 136, 272, 544
    assert ex.aligned_steps(544, ex.DEFAULT_FRACTIONS) == 544
    assert ex.aligned_steps(10, (0.3, 1.0)) == 10 and ex.aligned_steps(11, (0.3, 1.0)) == 20
    assert ex.aligned_steps(5, (0.125, 1.0)) == 5  # denominator 8 > 5 steps: unchanged


# ------------------------------------------------------------------------------------ bad input


@pytest.mark.parametrize("kwargs, match", [
    (dict(expert_tokens=0), r"expert_tokens 0; allowed: a positive"),
    (dict(expert_tokens=-5.0), r"expert_tokens -5.0"),
    (dict(expert_tokens=float("nan")), r"expert_tokens nan"),
    (dict(expert_tokens=100), r"expert_tokens 100 is smaller than one step of the base \(512 tokens.*at least 512"),
    (dict(fractions=(0.5, 0.0)), r"fractions\[1\] is 0.0; allowed: a number in \(0, 1\]"),
    (dict(fractions=(1.5,)), r"fractions\[0\] is 1.5"),
    (dict(fractions=(float("nan"),)), r"fractions\[0\] is nan"),
    (dict(fractions=()), r"fractions \(\); allowed: a non-empty list"),
    (dict(domains=["poetry"]), r"domain 'poetry' is not in the base's dataset \(the built-in corpus\); allowed: "
                               r"code, prose, math, knowledge"),
    (dict(domains=["code", "code"]), r"domains\[1\] 'code' is given twice"),
    (dict(domains=[]), r"domains \[\]; allowed: a non-empty list"),
    (dict(base_step=5), r"base_step 5 is not a checkpoint of .*; allowed: one of \[3, 6\]"),
    (dict(lr=-1.0), r"lr -1.0; allowed: a positive finite learning rate \(default: the base's optim.lr, 0.003\)"),
    (dict(warmup_steps=-1), r"warmup_steps -1; allowed: an integer >= 0"),
])
def test_bad_inputs_are_named_before_training(base, kwargs, match):
    args = {"domains": ["code"], "expert_tokens": 4 * TOKENS_PER_STEP, **kwargs}
    with pytest.raises(ex.MergeMixError, match=match):
        ex.plan_experts(base, **args)


def test_missing_base_and_base_without_checkpoints(tmp_path):
    with pytest.raises(ex.MergeMixError, match=r"base workdir .*nope' does not exist"):
        ex.plan_experts(tmp_path / "nope", domains=["code"], expert_tokens=1e4)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ex.MergeMixError, match=r"base workdir .*empty' has no checkpoint"):
        ex.plan_experts(tmp_path / "empty", domains=["code"], expert_tokens=1e4)


def test_domain_without_data(base, monkeypatch):
    """A dataset whose 'math' domain has no training tokens (a prepared dataset can have one)."""
    import moejax.data.dataset as dataset_lib

    real = dataset_lib.open_dataset

    def open_dataset(path, cache_dir=None):
        ds = real(path, cache_dir)
        empty = types.SimpleNamespace(num_tokens=0)
        return types.SimpleNamespace(streams=lambda d, split: (empty,) if d == "math" else ds.streams(d, split))

    monkeypatch.setattr(dataset_lib, "open_dataset", open_dataset)
    with pytest.raises(ex.MergeMixError, match=r"domain 'math' has no training data .*0 train tokens"):
        ex.plan_experts(base, domains=["code", "math"], expert_tokens=1e4)


def test_other_plan_in_the_same_out_dir_is_refused(base, tmp_path):
    plan = ex.plan_experts(base, domains=["code"], expert_tokens=4 * TOKENS_PER_STEP)
    (tmp_path / ex.PLAN_FILE).write_text(json.dumps({**plan, "runs": [{**plan["runs"][0], "steps": 99}]}))
    with pytest.raises(ex.MergeMixError, match="holds a different experts plan"):
        ex.train_experts(plan, tmp_path, progress=False)
    assert not (tmp_path / "expert_code").exists()  # nothing trained
    with pytest.raises(ex.MergeMixError, match="not a MergeMix experts plan"):
        ex.train_experts({"runs": []}, tmp_path / "x", progress=False)
    with pytest.raises(ex.MergeMixError, match="is not an experts directory"):
        ex.expert_checkpoints(tmp_path / "x")


# ----------------------------------------------------------------------------------- end to end


def test_train_experts_from_the_base(base, mergemix_experts, tmp_path):  # noqa: F811
    plan = ex.plan_experts(base, domains=list(TRAINED_DOMAINS), expert_tokens=EXPERT_TOKENS, fractions=(0.5, 1.0))
    out = Path(mergemix_experts)
    assert ex.expert_checkpoints(out) == {"code": [2, 4], "math": [2, 4]}
    assert ex.expert_tokens_at(out, "code", 2) == 2 * TOKENS_PER_STEP
    assert json.loads((out / ex.PLAN_FILE).read_text())["runs"] == json.loads(json.dumps(plan["runs"]))
    with pytest.raises(ex.MergeMixError, match=r"step 5 of expert 'code'; allowed: an integer in \[0, 4\]"):
        ex.expert_tokens_at(out, "code", 5)
    with pytest.raises(ex.MergeMixError, match=r"domain 'prose' has no expert"):
        ex.expert_tokens_at(out, "prose", 2)

    expert, base_metrics = read_metrics(out / "expert_code"), read_metrics(base)
    # it started from the base's step-6 parameters: its step-0 held-out losses are the base's final ones
    first = next(r for r in expert if r.get("step") == 0 and "eval_loss" in r)
    last_base = [r for r in base_metrics if r.get("step") == BASE_STEP and "eval_loss" in r][-1]
    for key in [k for k in first if k.startswith("eval_loss")]:
        assert first[key] == pytest.approx(last_base[key], rel=1e-5), key
    # ... and then it trained on code at the constant lr (warmup 1 step): code loss went down, lr flat
    final = [r for r in expert if r.get("step") == 4 and "eval_loss" in r][-1]
    assert final["eval_loss/code"] < first["eval_loss/code"]
    lrs = {r["step"]: r["lr"] for r in expert if "lr" in r}
    assert [lrs[s] for s in sorted(lrs) if s >= 2] == pytest.approx([3e-3] * len([s for s in lrs if s >= 2]))
    # both checkpoints evaluated by the runner (moejax.eval files), and a rerun (on a copy) launches nothing
    assert {"step_2.json", "step_4.json"} <= set(os.listdir(out / "expert_code" / "eval"))
    copy = tmp_path / "experts"
    shutil.copytree(out, copy)
    again = ex.train_experts(ex.load_plan(copy), copy, eval_args=list(EXPERT_EVAL_ARGS), progress=False)
    assert sorted(again.skipped) == ["expert_code", "expert_math"] and again.launched == []


def test_same_plan_from_another_checkout_is_accepted(base, tmp_path, monkeypatch):
    import data_mixture.sweep.runner as runner
    from data_mixture.sweep.record import portable_config

    plan = ex.plan_experts(base, domains=["code"], expert_tokens=4 * TOKENS_PER_STEP)
    config = plan["runs"][0]["config"]
    moved = "/elsewhere/checkout/data_mixture/mergemix/experts.py" + config.split("experts.py", 1)[1]
    assert portable_config(moved) == portable_config(config) == "data_mixture/mergemix/experts.py" + config.split("experts.py", 1)[1]
    assert portable_config("/u/a/experiments/mine.py") == "/u/a/experiments/mine.py"  # a user's file: as given
    (tmp_path / ex.PLAN_FILE).write_text(json.dumps({**plan, "runs": [{**plan["runs"][0], "config": moved}]}))

    class Reached(Exception):
        pass

    def run_sweep(*args, **kwargs):
        raise Reached

    monkeypatch.setattr(runner, "run_sweep", run_sweep)
    with pytest.raises(Reached):  # the plan check passed; the sweep would resume the experts
        ex.train_experts(plan, tmp_path, progress=False)
