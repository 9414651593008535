"""The sweep runner (``python -m data_mixture sweep``) on real, very small moejax runs.

One reduced sweep (2 sizes x 2 mixtures, 4 steps with a checkpoint at step 2, plus one run whose
mixture names a domain the corpus lacks, so it fails only at run time) is shared by the module:
it is trained, evaluated and collected once through the CLI (a subprocess, so exit codes, signals
and output are the user's), then restarted. Cost control: the children train on one CPU device
(``XLA_FLAGS`` without the test suite's 8 fake devices: the sweep's own logic does not depend on
the mesh, and one device compiles in a fraction of the time), share the run's persistent XLA
compilation cache (``JAX_COMPILATION_CACHE_DIR`` from tests/conftest.py, inherited through the
environment; every run of one size compiles the same step), and are evaluated on held-out losses
only (``--tasks --loss-batches 1``).
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from data_mixture.sweep import SweepOptions, record, run_sweep
from experiments.tools.fault_drill import child_xla_flags

DOMAINS = ("code", "prose", "math", "knowledge")
TINY = {"model.d_model": 16, "model.num_layers": 1, "model.num_heads": 1, "model.num_kv_heads": 1,
        "model.head_dim": 16, "model.mlp_dim": 32, "model.moe.num_experts": 4, "model.moe.expert_dim": 16,
        "model.moe.shared_expert_dim": 16, "model.moe.tile_size": 8}
SIZES = {"a": TINY, "b": {**TINY, "model.d_model": 32, "model.num_layers": 2, "model.num_heads": 2}}
COMMON = {"train.steps": 4, "train.global_batch_size": 8, "train.seq_len": 32, "checkpoint.every_steps": 2,
          "train.eval_every": 2, "train.log_every": 1, "train.eval_batches": 1, "optim.warmup_steps": 1}
MIXTURES = [dict(zip(DOMAINS, w)) for w in ((0.25, 0.25, 0.25, 0.25), (0.1, 0.1, 0.1, 0.7))]
EVAL_ARGS = "--tasks --loss-batches 1"
GOOD = [f"{s}_m{k}" for s in SIZES for k in range(len(MIXTURES))]
HEADER = (["run", "params_total", "params_active", "tokens", "flops"] + [f"mix:{d}" for d in DOMAINS]
          + [f"loss:{d}" for d in DOMAINS] + ["loss:heldout_qa"]  # the built-in corpus's held-out target set
          + [f"loss_se:{d}" for d in (*DOMAINS, "heldout_qa")]  # each evaluation's own standard error
          + ["step", "loss_source", "workdir", "started_at"])


def entry(name: str, size: str, mixture: dict, **extra) -> dict:
    return {"name": name, "preset": size, "config": "experiments/configs/tiny_moe.py",
            "overrides": {**SIZES[size], **COMMON, "data.mixture": mixture, **extra}, "mixture": mixture, "steps": 4}


def good_entries() -> list[dict]:
    return [entry(f"{s}_m{k}", s, m) for s in SIZES for k, m in enumerate(MIXTURES)]


def write_plan(path: Path, runs: list[dict]) -> Path:
    path.write_text(json.dumps({"version": 1, "runs": runs}, indent=1))
    return path


def child_env() -> dict[str, str]:
    return dict(os.environ, XLA_FLAGS=child_xla_flags(None))


def sweep_cli(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "data_mixture", "sweep", "--no-progress", *args], capture_output=True,
                          text=True, env=child_env(), timeout=timeout)


def read_csv(path: Path) -> tuple[list[str], list[dict]]:
    with open(path) as f:
        reader = csv.DictReader(f)
        return list(reader.fieldnames or []), list(reader)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory, corpus_cache):
    """The reduced sweep: 4 good runs + 1 run that fails at run time, --parallel 2, --retries 1."""
    base = tmp_path_factory.mktemp("dm_sweep")
    bad = entry("bad_m0", "a", {"nope": 1.0})
    plan = write_plan(base / "plan.json", good_entries() + [bad])
    root = base / "root"
    t0 = time.time()
    proc = sweep_cli("--plan", str(plan), "--root", str(root), "--parallel", "2", "--retries", "1",
                     "--eval-args", EVAL_ARGS)
    return {"base": base, "plan": plan, "root": root, "proc": proc, "seconds": time.time() - t0}


def test_sweep_trains_evaluates_and_collects_every_finished_run(sweep):
    proc, root = sweep["proc"], sweep["root"]
    assert proc.returncode == 1, proc.stdout + proc.stderr  # one run failed
    header, rows = read_csv(root / "runs.csv")
    assert header == HEADER
    assert [r["run"] for r in rows] == [n for n in GOOD for _ in (2, 4)]  # plan order, two checkpoints each
    assert {r["step"] for r in rows} == {"2", "4"} and {float(r["tokens"]) for r in rows} == {2 * 8 * 32.0, 4 * 8 * 32.0}
    assert len({r["params_total"] for r in rows}) == 2
    for r in rows:
        assert float(r["mix:knowledge"]) == pytest.approx(MIXTURES[int(r["run"][-1])]["knowledge"])
    for name in GOOD:
        status = json.loads((root / name / "status.json").read_text())
        # one attempt each (a second one here would be a retry after a transient failure: still correct)
        assert status["state"] == "succeeded" and status["history"][-1]["state"] == "succeeded", status
        assert (root / name / "train.log").is_file() and (root / name / "eval.log").is_file()
        assert not (root / name / record.LEASE).exists()


def test_each_run_records_what_produced_it(sweep):
    root, plan = sweep["root"], json.loads(sweep["plan"].read_text())
    rec = json.loads((root / "b_m1" / "record.json").read_text())
    assert rec["plan_entry"] == plan["runs"][GOOD.index("b_m1")]
    assert rec["resolved_config"]["model"]["d_model"] == 32 and rec["resolved_config"]["train"]["steps"] == 4
    assert rec["resolved_config"]["data"]["mixture"] == MIXTURES[1]
    # a plan without eval_windows was written before the key: its runs evaluate the first windows, as they did
    assert rec["resolved_config"]["train"]["eval_windows"] == "first"
    (launch,) = rec["launches"]
    version = launch["code_version"]
    assert len(version["commit"]) == 40 and isinstance(version["dirty"], bool)
    assert f"-m moejax.main --config experiments/configs/tiny_moe.py --workdir {root / 'b_m1'}" in launch["train_command"]
    assert launch["eval_command"].endswith("--all --no-progress --tasks --loss-batches 1")
    assert "--config.train.eval_windows=first" in launch["train_command"]
    status = json.loads((root / "b_m1" / "status.json").read_text())
    assert status["host"] and status["pid"] and status["heartbeat"] > 0 and status["history"][0]["trained"]
    # the run's start time: in the status and the record, and carried into the runs table by collect
    assert status["started_at"] == rec["started_at"] == launch["time"]
    _, rows = read_csv(root / "runs.csv")
    assert {r["started_at"] for r in rows if r["run"] == "b_m1"} == {status["started_at"]}


def test_failing_run_is_retried_then_reported_with_its_log(sweep):
    proc, root = sweep["proc"], sweep["root"]
    status = json.loads((root / "bad_m0" / "status.json").read_text())
    assert status["state"] == "failed" and status["attempts"] == 2
    assert [h["state"] for h in status["history"]] == ["failed", "failed"]
    log = root / "bad_m0" / "train.log"
    assert status["log"] == str(log) and log.read_text().count("=== attempt") == 2 and "nope" in log.read_text()
    assert "failed: bad_m0 after 2 attempt(s) in this sweep: training exited with code" in proc.stderr
    assert f"log: {log}" in proc.stderr
    assert "4 done" in proc.stderr and "1 failed" in proc.stderr


def test_restart_skips_finished_runs_and_resumes_an_interrupted_one(sweep):
    root = sweep["root"]
    # a_m1 as a kill after its first checkpoint leaves it: checkpoint 2 only, its evaluation, interrupted
    victim = root / "a_m1"
    import shutil

    shutil.rmtree(victim / "checkpoints" / "4")
    (victim / "eval" / "step_4.json").unlink()
    record.write_status(victim, state="interrupted")
    first_start = json.loads((victim / "status.json").read_text())["started_at"]
    others = [n for n in GOOD if n != "a_m1"]
    before = {n: [(root / n / f).stat().st_mtime_ns for f in ("train.log", "eval.log", "status.json")] for n in others}
    good_plan = write_plan(sweep["base"] / "good.json", good_entries())
    proc = sweep_cli("--plan", str(good_plan), "--root", str(root), "--parallel", "2", "--eval-args", EVAL_ARGS)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "4 done (3 skipped as already done, 1 run now)" in proc.stdout
    after = {n: [(root / n / f).stat().st_mtime_ns for f in ("train.log", "eval.log", "status.json")] for n in others}
    assert after == before  # nothing relaunched, not even touched
    status = json.loads((victim / "status.json").read_text())
    assert status["state"] == "succeeded" and status["attempts"] == len(status["history"]) >= 2
    assert status["started_at"] == first_start  # a resumed run keeps its first start time
    assert status["history"][-1]["resumed_from"] == 2 and status["history"][-1]["trained"]
    last_attempt = (victim / "train.log").read_text().split("=== attempt")[-1]
    assert "resuming from step 2" in last_attempt and "fresh start" not in last_attempt
    assert f"a_m1: start (attempt {status['attempts']}, resume from step 2)" in proc.stdout
    _, rows = read_csv(root / "runs.csv")
    assert [r["run"] for r in rows] == [n for n in GOOD for _ in (2, 4)]
    # and once more: everything is done, nothing runs, the table is rewritten the same
    t0 = time.time()
    again = sweep_cli("--plan", str(good_plan), "--root", str(root), "--eval-args", EVAL_ARGS)
    assert again.returncode == 0 and "4 done (4 skipped as already done, 0 run now)" in again.stdout
    assert read_csv(root / "runs.csv")[1] == rows and time.time() - t0 < 120


@pytest.mark.slow  # a training process of its own (about a minute on the loaded 2-core machine)
def test_ctrl_c_saves_a_checkpoint_marks_interrupted_and_exits_130(tmp_path, corpus_cache):
    plan = write_plan(tmp_path / "plan.json", [entry("long", "a", MIXTURES[0], **{"train.steps": 5000,
                                                                                  "checkpoint.every_steps": 2500})])
    plan_obj = json.loads(plan.read_text())
    plan_obj["runs"][0]["steps"] = 5000
    plan.write_text(json.dumps(plan_obj))
    root = tmp_path / "root"
    proc = subprocess.Popen([sys.executable, "-m", "data_mixture", "sweep", "--no-progress", "--plan", str(plan),
                             "--root", str(root), "--eval-args", EVAL_ARGS], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=child_env())
    log = root / "long" / "train.log"
    deadline = time.time() + 300
    while time.time() < deadline and not (log.is_file() and "step=2 " in log.read_text()):
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 130, out + err
    assert err.strip().splitlines()[-1].startswith("sweep: interrupted (SIGINT): 0 done, 1 interrupted (long)")
    status = json.loads((root / "long" / "status.json").read_text())
    assert status["state"] == "interrupted" and status["history"][-1]["returncode"] == 128 + signal.SIGTERM
    saved = record.checkpoint_steps(root / "long")
    assert len(saved) == 1 and 2 <= saved[0] < 2500  # the checkpoint moejax saves on SIGTERM
    assert "stopped by SIGTERM" in log.read_text()
    assert not (root / "long" / record.LEASE).exists()


# ------------------------------------------------------------------------------------------ leases


def test_lease_is_exclusive_refreshed_and_taken_over_only_when_stale(tmp_path):
    a, b = record.new_owner(), record.new_owner()
    assert record.try_acquire(tmp_path, a, timeout=60) == (True, a)
    got, holder = record.try_acquire(tmp_path, b, timeout=60)
    assert not got and holder["id"] == a["id"] and holder["age"] < 60
    assert record.heartbeat(tmp_path, a)
    old = time.time() - 120
    os.utime(tmp_path / record.LEASE, (old, old))  # a's runner died two minutes ago
    assert record.try_acquire(tmp_path, b, timeout=60) == (True, b)
    assert not record.heartbeat(tmp_path, a)  # a learns it lost the lease
    record.release(tmp_path, a)  # and cannot release b's
    assert record.holds(tmp_path, b)
    record.release(tmp_path, b)
    assert not (tmp_path / record.LEASE).exists()


def test_second_runner_does_not_start_a_run_with_a_fresh_lease(tmp_path, capsys):
    plan = write_plan(tmp_path / "plan.json", good_entries()[:1])
    root = tmp_path / "root"
    other = {**record.new_owner(), "host": "node7", "pid": 4242}
    assert record.try_acquire(root / GOOD[0], other, timeout=60)[0]
    result = run_sweep(plan, SweepOptions(root=str(root), progress=False, lease_timeout=60, heartbeat=5))
    assert result.exit_code == 0 and result.launched == [] and list(result.elsewhere) == [GOOD[0]]
    assert not (root / GOOD[0] / "train.log").exists() and not (root / GOOD[0] / "status.json").exists()
    assert record.holds(root / GOOD[0], other)
    captured = capsys.readouterr()
    assert f"{GOOD[0]}: leased by node7:4242" in captured.out and "elsewhere: a_m0 leased by node7:4242" in captured.out


# -------------------------------------------------------------------------------------- bad input


def _plan_text(tmp_path, kind: str) -> str:
    runs = good_entries()[:2]
    if kind == "missing":
        return str(tmp_path / "no_such_plan.json")
    path = tmp_path / "plan.json"
    if kind == "not_json":
        path.write_text("{runs: [")
        return str(path)
    if kind == "no_name":
        del runs[1]["name"]
    elif kind == "no_overrides":
        del runs[1]["overrides"]
    elif kind == "duplicate":
        runs[1]["name"] = runs[0]["name"]
    elif kind == "unknown_key":
        runs[1]["overrides"]["model.d_modl"] = 64
    elif kind == "bad_value":
        runs[1]["overrides"]["train.steps"] = "many"
    write_plan(path, runs)
    return str(path)


@pytest.mark.parametrize("kind, flags, expected", [
    ("missing", [], "plan file '{tmp}/no_such_plan.json' does not exist"),
    ("not_json", [], "is not valid JSON"),
    ("no_name", [], "runs[1] has name None; allowed: a non-empty string"),
    ("no_overrides", [], "run 'a_m1' (runs[1]) has overrides None; allowed: an object"),
    ("duplicate", [], "runs[0] and runs[1] are both named 'a_m0'"),
    ("unknown_key", [], "run 'a_m1' (runs[1]): --config.model.d_modl=64: unknown config key 'model.d_modl'"),
    ("bad_value", [], "run 'a_m1' (runs[1]): flag --config.train.steps=many: config key 'train.steps' takes an integer"),
    ("ok", ["--backend", "slurm"], "--backend 'slurm'; allowed: local | ray"),
    ("ok", ["--parallel", "0"], "--parallel 0; allowed: an integer >= 1"),
])
def test_bad_input_is_one_paragraph_exit_2_before_anything_runs(tmp_path, capsys, kind, flags, expected):
    from data_mixture.__main__ import main

    root = tmp_path / "root"
    with pytest.raises(SystemExit) as exc:
        main(["sweep", "--plan", _plan_text(tmp_path, kind), "--root", str(root), *flags])
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert err.startswith("python -m data_mixture sweep: error: ") and err.count("\n") == 1, err
    assert expected.format(tmp=tmp_path) in err
    assert not root.exists()  # nothing launched, no directory made


def test_a_run_dir_from_another_plan_entry_is_refused(tmp_path, capsys):
    from data_mixture.__main__ import main

    root = tmp_path / "root"
    (root / "a_m0").mkdir(parents=True)
    record.write_json_atomic(root / "a_m0" / "record.json",
                             {"config_file": "experiments/configs/tiny_moe.py",
                              "overrides": {**good_entries()[0]["overrides"], "train.steps": 8}})
    with pytest.raises(SystemExit) as exc:
        main(["sweep", "--plan", str(write_plan(tmp_path / "plan.json", good_entries()[:1])), "--root", str(root)])
    assert exc.value.code == 2
    assert "override 'train.steps' was 8, the plan now says 4" in capsys.readouterr().err


def test_a_builtin_config_by_its_old_path_is_the_same_plan_entry():
    """Plans written before the configs moved to experiments/configs/ name experiments/tiny_moe.py:
    their run directories resume under a plan that names the new path, and the other way round."""
    overrides = good_entries()[0]["overrides"]
    assert record.record_key("experiments/tiny_moe.py", overrides) == record.record_key(
        "experiments/configs/tiny_moe.py", overrides)
    assert record.record_key("experiments/tiny_moe.py", overrides) != record.record_key("my_tiny_moe.py", overrides)


def test_ray_is_not_imported_on_the_local_path():
    code = ("import sys, data_mixture.__main__, data_mixture.sweep, data_mixture.sweep.runner, "
            "data_mixture.sweep.local; assert 'ray' not in sys.modules, 'ray imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


# ------------------------------------------------------------------------------------------- Ray


@pytest.mark.slow  # a local Ray cluster and two training runs (35 s of the default suite's budget); -m slow runs it
def test_ray_micro_sweep_gives_the_same_table(tmp_path, corpus_cache):
    """Two runs as Ray tasks on a local Ray cluster (2 CPUs, one per run): same semantics, same table
    structure as the local sweep's. One run carries the stale lease of a runner that died: taken over."""
    pytest.importorskip("ray")
    plan = write_plan(tmp_path / "plan.json", [good_entries()[0], good_entries()[len(MIXTURES)]])
    root = tmp_path / "root"
    dead = {**record.new_owner(), "host": "node9", "pid": 99}
    assert record.try_acquire(root / "b_m0", dead, timeout=60)[0]
    old = time.time() - 3600
    os.utime(root / "b_m0" / record.LEASE, (old, old))
    proc = sweep_cli("--plan", str(plan), "--root", str(root), "--backend", "ray", "--ray-num-cpus", "2",
                     "--cpus-per-run", "1", "--eval-args", EVAL_ARGS)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "b_m0: taking over the stale lease of node9:99" in proc.stderr
    assert "ray, 2 at a time, 1 CPU + 0 GPU per run" in proc.stdout
    header, rows = read_csv(root / "runs.csv")
    assert header == HEADER
    assert [r["run"] for r in rows] == ["a_m0", "a_m0", "b_m0", "b_m0"]
    for name in ("a_m0", "b_m0"):
        status = json.loads((root / name / "status.json").read_text())
        assert status["state"] == "succeeded" and status["backend"] == "ray" and status["attempts"] == 1
        assert not (root / name / record.LEASE).exists()
    again = sweep_cli("--plan", str(plan), "--root", str(root), "--backend", "ray", "--ray-num-cpus", "2")
    assert again.returncode == 0 and "2 done (2 skipped as already done, 0 run now)" in again.stdout
    assert "nothing to launch" in again.stdout  # no Ray cluster started for a finished sweep


def test_sweep_help_shows_every_flag_and_an_example(capsys):
    from data_mixture.__main__ import main

    with pytest.raises(SystemExit):
        main(["sweep", "--help"])
    out = capsys.readouterr().out
    assert "example:" in out and "python -m data_mixture sweep --plan plan.json --root" in out
    for flag in ("--backend", "--parallel", "--retries", "--eval-args", "--ray-address", "--cpus-per-run",
                 "--gpus-per-run", "--lease-timeout", "--wait-others"):
        assert flag in out


def test_checkpoints_at_the_evaluation_cadence_outlive_a_restart_s_extra_checkpoints(tmp_path):
    """A sweep runner killed mid-run: its child saves an off-cadence checkpoint on the way out (and
    again on each restart); retention must still keep every scheduled checkpoint until the attempt
    evaluates them, not only the newest ``max_to_keep`` of all of them."""
    import numpy as np

    from data_mixture.sweep.targets import targets_from_plan
    from moejax.train.checkpoint import Checkpointer

    plan = {"runs": [{"name": "r", "overrides": {"train.steps": 30, "checkpoint.every_steps": 10}}]}
    (target,) = targets_from_plan(plan, tmp_path / "root")
    assert target.checkpoint_steps == (10, 20, 30)
    keep = target.resolved_config["checkpoint"]
    checkpointer = Checkpointer(str(tmp_path / "ckpt"), max_to_keep=keep["max_to_keep"],
                                keep_period=keep["keep_period"])
    state = {"w": np.zeros(3, np.float32)}
    for step in (10, 13, 17, 20, 24, 30):  # 13, 17, 24: SIGTERMed children saving where they were
        checkpointer.save(step, state, {}, {})
        checkpointer.wait()
    assert {10, 20, 30} <= set(checkpointer.steps()), checkpointer.steps()
