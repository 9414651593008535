"""collect: moejax workdirs -> runs table (real trained + evaluated fixture run; schedules; errors)."""

from __future__ import annotations

import json
import os
import shutil

import ml_collections
import numpy as np
import pytest

from data_mixture.collect import CollectError, collect, stage_average, write_columns
from data_mixture.table import read_runs
from moejax.model.transformer import param_counts


def build_evaluated_run(workdir: str) -> None:
    """A very small MoE trained for 5 steps (checkpoints 3 and 5) and evaluated cheaply (2 items of
    knowledge and math) into ``workdir``; built once per test run through ``run_once``."""
    from moejax.config import default_config
    from moejax.eval.__main__ import main as eval_main
    from moejax.train.loop import train

    cfg = default_config()
    t, m = cfg.train, cfg.model
    t.steps, t.global_batch_size, t.seq_len, t.log_every, t.eval_every, t.eval_batches = 5, 8, 64, 1, 5, 1
    cfg.checkpoint.every_steps, cfg.optim.warmup_steps = 3, 1
    m.d_model, m.num_layers, m.mlp_dim, m.num_heads, m.num_kv_heads, m.head_dim = 32, 2, 64, 2, 1, 16
    m.moe.num_experts, m.moe.expert_dim, m.moe.shared_expert_dim, m.moe.tile_size = 4, 16, 16, 8
    train(cfg, workdir)
    eval_main(["--workdir", workdir, "--all", "--max-items", "2", "--tasks", "knowledge", "math",
               "--max-new-tokens", "4", "--no-progress"])


@pytest.fixture(scope="module")
def workdir(run_once):
    return run_once("dm_collect_run", build_evaluated_run)


def test_one_row_per_evaluated_checkpoint(workdir, tmp_path):
    got = collect([workdir])
    cols = got.columns
    assert cols["step"] == [3, 5] and got.unevaluated == []
    cfg = ml_collections.ConfigDict(json.load(open(os.path.join(workdir, "config.json"))))
    counts = param_counts(cfg.model)
    assert cols["params_total"] == [float(counts["total"])] * 2
    assert cols["params_active"] == [float(counts["active"])] * 2
    per_step = cfg.train.global_batch_size * cfg.train.seq_len
    assert cols["tokens"] == [3.0 * per_step, 5.0 * per_step]
    assert cols["flops"] == [6.0 * counts["active"] * t for t in cols["tokens"]]
    for d in ("code", "prose", "math", "knowledge"):
        assert cols[f"mix:{d}"] == [0.25, 0.25]
        ev = json.load(open(os.path.join(workdir, "eval", "step_5.json")))
        assert cols[f"loss:{d}"][1] == ev["losses"]["domains"][d]["loss"]
    assert cols["bench:knowledge"][1] == ev["benchmarks"]["knowledge"]["accuracy"]
    assert cols["bench:math"][1] == ev["benchmarks"]["math"]["exact_match"]
    continuous = collect([workdir], bench_metric="gold_logprob").columns
    assert continuous["bench:knowledge"][1] == ev["benchmarks"]["knowledge"]["gold_logprob"] < 0
    assert continuous["bench:math"][1] == ev["benchmarks"]["math"]["gold_logprob"] < 0
    with pytest.raises(ValueError, match="allowed: accuracy, gold_logprob"):
        collect([workdir], bench_metric="f1")
    # the continuous metric is a column of its own too, and the held-out target set a loss with no mix: column
    assert cols["logprob:math"][1] == ev["benchmarks"]["math"]["gold_logprob"]
    assert cols["loss:heldout_qa"][1] == ev["losses"]["targets"]["heldout_qa"]["loss"] > 0
    assert "mix:heldout_qa" not in cols and "unique:code" not in cols
    out = tmp_path / "runs.csv"
    write_columns(cols, out)
    table = read_runs(out)  # the table validates, floats round-trip
    assert table.loss_rv[1, table.loss_domains.index("code")] == cols["loss:code"][1]
    assert table.extra["workdir"][0] == workdir


def test_unevaluated_checkpoints_are_reported(workdir, tmp_path):
    bare = tmp_path / "bare"
    shutil.copytree(workdir, bare)
    os.remove(bare / "eval" / "step_5.json")
    got = collect([str(bare)])
    assert got.columns["step"] == [3]
    assert got.unevaluated == [(str(bare), 5)]


def test_a_checkpoint_saved_when_the_run_was_stopped_makes_no_row(workdir, tmp_path):
    """Step 4 is off the schedule (every 3 steps, and 5): a checkpoint saved at a stop, evaluated by a
    sweep; the table is the uninterrupted run's, and the step is named."""
    stopped = tmp_path / "stopped"
    shutil.copytree(workdir, stopped)
    shutil.copyfile(stopped / "eval" / "step_3.json", stopped / "eval" / "step_4.json")
    shutil.copytree(stopped / "checkpoints" / "3", stopped / "checkpoints" / "4")
    got = collect([str(stopped)], evaluate=True)  # nothing to evaluate: step 4 is not scheduled
    assert got.columns["step"] == [3, 5] and got.unevaluated == []
    assert any("step 4 (a checkpoint saved when the run was stopped" in note for note in got.skipped)


def test_a_ladder_root_is_expanded_and_names_are_the_workdirs(workdir, tmp_path):
    root = tmp_path / "ladder"
    for name in ("a", "b"):
        shutil.copytree(workdir, root / name, ignore=shutil.ignore_patterns("checkpoints"))
    got = collect([str(root)])
    assert got.columns["run"] == ["a", "a", "b", "b"]


def test_schedule_is_the_token_weighted_average_of_its_stages(workdir, tmp_path):
    staged = tmp_path / "staged"
    shutil.copytree(workdir, staged, ignore=shutil.ignore_patterns("checkpoints"))
    cfg = json.load(open(staged / "config.json"))
    cfg["data"]["schedule"] = json.dumps([[0, {"code": 1.0}], [2, {"math": 3, "prose": 1}]])
    json.dump(cfg, open(staged / "config.json", "w"))
    got = collect([str(staged)]).columns
    # step 3: 2 steps of code, 1 of (math 0.75, prose 0.25); step 5: 2 of code, 3 of the second stage.
    np.testing.assert_allclose([got["mix:code"][0], got["mix:math"][0], got["mix:prose"][0]], [2 / 3, 0.25, 1 / 12])
    np.testing.assert_allclose([got["mix:code"][1], got["mix:math"][1], got["mix:prose"][1]], [0.4, 0.45, 0.15])
    assert got["mix:knowledge"] == [0.0, 0.0]


def test_stage_average_before_the_second_stage():
    stages = [(0, {"a": 1.0}), (10, {"b": 1.0})]
    assert stage_average(stages, 10) == {"a": 1.0, "b": 0.0}
    assert stage_average(stages, 20) == {"a": 0.5, "b": 0.5}


def test_not_a_workdir_is_a_clear_error(tmp_path):
    with pytest.raises(CollectError, match="not a moejax workdir"):
        collect([str(tmp_path)])
    with pytest.raises(CollectError, match="does not exist"):
        collect([str(tmp_path / "missing")])


def test_losses_from_the_training_log_for_unevaluated_checkpoints(workdir, tmp_path):
    bare = tmp_path / "logonly"
    shutil.copytree(workdir, bare)
    shutil.rmtree(bare / "eval")
    assert collect([str(bare)]).unevaluated == [(str(bare), 3), (str(bare), 5)]
    got = collect([str(bare)], losses_from_log=True)
    cols = got.columns
    logged = [json.loads(line) for line in open(bare / "metrics.jsonl")]
    at5 = next(r for r in logged if r.get("step") == 5 and "eval_loss/code" in r)
    assert cols["step"] == [5] and got.unevaluated == [(str(bare), 3)]  # the log evaluates every 5 steps here
    assert cols["loss:code"] == [at5["eval_loss/code"]] and cols["loss_source"] == ["train_log"]
    assert "bench:math" not in cols


def test_pools_become_unique_and_epochs_columns(workdir, tmp_path):
    pooled = tmp_path / "pooled"
    shutil.copytree(workdir, pooled, ignore=shutil.ignore_patterns("checkpoints"))
    cfg = json.load(open(pooled / "config.json"))
    cfg["data"]["unique_tokens"] = "math=640"
    json.dump(cfg, open(pooled / "config.json", "w"))
    lines = [json.loads(line) for line in open(pooled / "metrics.jsonl")]
    for rec in lines:
        for key in [k for k in rec if k.startswith("epochs/")]:
            del rec[key]  # the fixture run had no pool
        if rec.get("step") == 5:
            rec["epochs/math"] = 1.75  # what the pipeline logged at that step
    (pooled / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    cols = collect([str(pooled)]).columns
    assert cols["unique:math"] == [640.0, 640.0] and "unique:code" not in cols
    assert cols["epochs:math"][1] == 1.75  # the logged count where there is one
    assert cols["epochs:math"][0] == pytest.approx(0.25 * cols["tokens"][0] / 640)  # else share x tokens / pool
    out = tmp_path / "runs.csv"
    write_columns(cols, out)
    assert read_runs(out).unique_rm().tolist()[0] == [np.inf, np.inf, 640.0, np.inf]


def test_validation_only_domains_get_a_loss_and_no_mix_column(workdir, tmp_path):
    held = tmp_path / "held"
    shutil.copytree(workdir, held, ignore=shutil.ignore_patterns("checkpoints"))
    with pytest.raises(CollectError, match="the run trains on it"):
        collect([str(held)], validation_only=("knowledge",))
    cfg = json.load(open(held / "config.json"))
    cfg["data"]["mixture"] = {"code": 1 / 3, "prose": 1 / 3, "math": 1 / 3, "knowledge": 0.0}
    json.dump(cfg, open(held / "config.json", "w"))
    cols = collect([str(held)], validation_only=("knowledge",)).columns
    assert "mix:knowledge" not in cols and cols["loss:knowledge"][0] > 0
    write_columns(cols, tmp_path / "runs.csv")
    table = read_runs(tmp_path / "runs.csv")
    assert "knowledge" not in table.mix_domains and "knowledge" in table.loss_domains
    with pytest.raises(CollectError, match="no collected run was evaluated on"):
        collect([str(held)], validation_only=("qa",))
