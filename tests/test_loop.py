"""The training loop's hooks, the workdir lock, a run whose every step is skipped, a failed save,
Ctrl-C during the first compile, and metrics.jsonl holding each step once."""

import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import jax
import optax
import orbax.checkpoint as ocp
import pytest

from moejax.config import default_config
from moejax.errors import ConfigError
from moejax.train import lock as lock_lib
from moejax.train.checkpoint import SaveFailed
from moejax.train.default_hooks import Diverged
from moejax.train.hooks import Hook, StepInfo, check_hooks, fire
from moejax.train.lock import WorkdirLock, WorkdirLocked
from moejax.train.loop import train
from tests.test_train import copy_run, read_metrics, small_run, small_run_cfg  # noqa: F401 (small_run: shared fixture)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def cache_dir(corpus_cache):
    """The run's shared corpus cache (tests/conftest.py)."""
    return corpus_cache


# --- hooks ---------------------------------------------------------------------------------------

def test_a_hook_fires_on_its_cadence_on_its_condition_and_at_the_last_step():
    calls = []
    hooks = [Hook(lambda i: calls.append(("every3", i.step)), every=3),
             Hook(lambda i: calls.append(("odd", i.step)), every=100, when=lambda i: i.step % 2 == 1)]
    for step in range(1, 8):
        fire(hooks, StepInfo(step=step, state={}, metrics={}, last=step == 7))
    assert calls == [("odd", 1), ("every3", 3), ("odd", 3), ("odd", 5), ("every3", 6), ("every3", 7), ("odd", 7)]


def test_a_bad_hook_is_refused_with_what_is_allowed():
    with pytest.raises(ConfigError, match=r"hooks\[0\] is <function .*allowed: a moejax.train.hooks.Hook"):
        check_hooks([lambda info: None])
    with pytest.raises(ConfigError, match=r"hooks\[1\] \(norm\) has every=0; allowed: an integer >= 1"):
        check_hooks([Hook(print), Hook(print, every=0, name="norm")])


def test_a_user_hook_logs_a_custom_metric_in_the_step_records(tmp_path, cache_dir, small_run):
    cfg = small_run_cfg(cache_dir)  # the shared run's config: its compiled steps are reused
    workdir = copy_run(small_run, tmp_path / "run")  # 6 steps, checkpoints at 3 and 6
    shutil.rmtree(os.path.join(workdir, "checkpoints", "6"))  # redo steps 4-6

    norm = jax.jit(optax.tree.norm)  # one compiled call, as docs/training.md writes the hook

    def param_norm(info):
        info.log(param_norm=float(norm(info.state["params"])))

    train(cfg, workdir, hooks=[Hook(param_norm, every=4)])
    records = {r["step"]: r for r in read_metrics(workdir)}
    assert [s for s, r in sorted(records.items()) if "param_norm" in r] == [4, 6]  # every 4th, and the last
    assert records[4]["param_norm"] > 0 and "loss" in records[4]  # in the same record as the step's loss
    reference = {r["step"]: r for r in read_metrics(small_run)}
    assert all(records[s]["loss"] == reference[s]["loss"] for s in (4, 5, 6))  # a hook changes no number


# --- the workdir lock ----------------------------------------------------------------------------

def test_a_second_run_into_a_workdir_is_refused_naming_the_first(tmp_path, monkeypatch):
    from moejax.train import loop

    monkeypatch.setattr(loop, "check_config", lambda *a: ({}, None))
    monkeypatch.setattr(loop, "_train", lambda *a: pytest.fail("got past the lock"))
    workdir = tmp_path / "run"
    (workdir / "checkpoints").mkdir(parents=True)  # the first run's, still empty while it compiles
    with WorkdirLock(str(workdir)):
        with pytest.raises(WorkdirLocked) as info:
            loop.train(default_config(), str(workdir))
        assert isinstance(info.value, ConfigError)  # the command line: one paragraph, exit 2
        message = str(info.value)
        assert f"another training run is using workdir {workdir}: pid {os.getpid()} on host " \
               f"{socket.gethostname()}, started 20" in message
        assert "train into another --workdir" in message
        assert (workdir / "checkpoints").is_dir() and (workdir / "run.lock").is_file()  # the first run's, kept
    assert not (workdir / "run.lock").exists()  # released


def test_a_lock_whose_process_is_dead_is_taken_over_at_once(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    path = tmp_path / "run.lock"
    path.write_text(json.dumps({"pid": dead.pid, "host": socket.gethostname(), "started": time.time() - 5}))
    with WorkdirLock(str(tmp_path)):
        assert json.loads(path.read_text())["pid"] == os.getpid()


def test_a_lock_from_another_host_is_taken_over_only_once_its_heartbeat_is_stale(tmp_path):
    path = tmp_path / "run.lock"
    path.write_text(json.dumps({"pid": 1, "host": "elsewhere", "started": time.time() - 1000}))
    with pytest.raises(WorkdirLocked, match=r"pid 1 on host elsewhere.*taken over once its heartbeat is 300 s old"):
        WorkdirLock(str(tmp_path)).acquire()
    old = time.time() - lock_lib.STALE_SECONDS - 10
    os.utime(path, (old, old))
    with WorkdirLock(str(tmp_path)):
        assert json.loads(path.read_text())["host"] == socket.gethostname()


def test_the_lock_heartbeat_keeps_a_running_lock_fresh(tmp_path, monkeypatch):
    monkeypatch.setattr(lock_lib, "HEARTBEAT_SECONDS", 0.05)
    with WorkdirLock(str(tmp_path)):
        old = time.time() - 100
        os.utime(tmp_path / "run.lock", (old, old))
        time.sleep(0.5)
        assert time.time() - os.stat(tmp_path / "run.lock").st_mtime < 5


# --- every step skipped --------------------------------------------------------------------------

def test_a_run_whose_every_step_is_skipped_stops_with_an_error(tmp_path, cache_dir, monkeypatch):
    from moejax.train import startup

    def damaged(batch, *args):  # data whose every batch gives a non-finite loss
        return to_global(dict(batch, loss_mask=np.full_like(batch["loss_mask"], np.nan)), *args)

    to_global = startup.to_global
    monkeypatch.setattr(startup, "to_global", damaged)
    cfg = small_run_cfg(cache_dir)
    cfg.train.steps, cfg.train.max_bad_steps = 3, 10  # a run shorter than the consecutive limit
    workdir = str(tmp_path / "run")
    with pytest.raises(Diverged, match=r"every step of the run \(3, up to step 3\) had a non-finite loss .*"
                                       r"No checkpoint was saved"):
        train(cfg, workdir)
    assert Diverged.exit_code == 3
    assert not os.path.exists(os.path.join(workdir, "checkpoints"))  # none saved, no empty directory


# --- a failed save -------------------------------------------------------------------------------

@pytest.fixture
def full_disk_at(monkeypatch):
    """``full_disk_at(step)``: writing the checkpoint of ``step`` fails with ENOSPC (in orbax's
    background commit, where a real full disk shows up)."""
    original = ocp.JsonCheckpointHandler._save_fn

    def arm(step):
        async def save_fn(self, x, directory):
            if str(directory).rstrip("/").split("/")[-2].startswith(f"{step}.orbax-checkpoint-tmp"):
                raise OSError(errno.ENOSPC, "No space left on device", str(directory))
            return await original(self, x, directory)

        monkeypatch.setattr(ocp.JsonCheckpointHandler, "_save_fn", save_fn)

    return arm


def test_a_failed_save_stops_the_run_with_one_paragraph_keeping_earlier_checkpoints(tmp_path, cache_dir, small_run,
                                                                                     full_disk_at):
    cfg = small_run_cfg(cache_dir)
    cfg.train.steps = 9  # checkpoints at 6 (fails) and 9
    workdir = copy_run(small_run, tmp_path / "run")
    shutil.rmtree(os.path.join(workdir, "checkpoints", "6"))  # resume at 3
    full_disk_at(6)
    with pytest.raises(SaveFailed) as info:
        train(cfg, workdir)
    assert str(info.value) == (
        f"no space left on device while saving step 6 in {workdir}/checkpoints; the last good checkpoint is "
        "step 3, and the run stops here. Make room (or train into another --workdir), then rerun the same "
        "command to resume from step 3.")
    assert SaveFailed.exit_code == 74
    assert [s for s in os.listdir(os.path.join(workdir, "checkpoints")) if s.isdigit()] == ["3"]  # intact
    assert max(r["step"] for r in read_metrics(workdir)) < 9  # it stopped
    assert not os.path.exists(os.path.join(workdir, "run.lock"))


def tmpfs(path, size: str) -> bool:
    """Mounts a tmpfs of ``size`` at ``path`` (root only); False where the machine does not allow it."""
    os.makedirs(path, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    return done.returncode == 0


@pytest.mark.slow
def test_a_full_disk_stops_the_command_with_one_paragraph(tmp_path, cache_dir, small_run):
    """The command on a real full disk (an 8 MB tmpfs): exit 74, a few lines, no traceback."""
    disk = tmp_path / "disk"
    if shutil.which("mount") is None or not tmpfs(disk, "8m"):
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        workdir = disk / "run"
        config = tmp_path / "cfg.py"
        config.write_text("from tests.test_train import small_run_cfg\n\ndef get_config():\n"
                          f"    c = small_run_cfg({cache_dir!r})\n    c.train.steps = 60\n"
                          "    c.checkpoint.every_steps, c.checkpoint.max_to_keep = 1, 100\n    return c\n")
        env = dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS="cpu")
        done = subprocess.run([sys.executable, "-m", "moejax.main", "--config", str(config), "--workdir", str(workdir),
                               "--config.train.loggers=jsonl"], cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=600)
        saved = sorted(int(s) for s in os.listdir(workdir / "checkpoints") if s.isdigit())
        assert done.returncode == 74, done.stderr[-3000:]
        assert "Traceback" not in done.stderr and len(done.stderr.splitlines()) < 10, done.stderr
        assert (f"moejax: no space left on device while saving step {saved[-1] + 1} in {workdir}/checkpoints; "
                f"the last good checkpoint is step {saved[-1]}") in done.stderr
    finally:
        subprocess.run(["umount", str(disk)], check=False)


# --- Ctrl-C during the first compile -------------------------------------------------------------

def test_ctrl_c_during_the_first_compile_exits_at_once_leaving_no_directory(tmp_path, cache_dir):
    config = tmp_path / "cfg.py"
    config.write_text("from tests.test_train import small_run_cfg\n\ndef get_config():\n"
                      f"    return small_run_cfg({cache_dir!r})\n")
    workdir = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS="cpu", JAX_COMPILATION_CACHE_DIR="")  # compile for real
    # The child starts as from a terminal: Ctrl-C raises KeyboardInterrupt and is not blocked, whatever
    # an earlier test in this worker left behind (an ignored or blocked SIGINT is inherited across exec).
    as_from_a_terminal = ("import runpy, signal, sys; signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT}); "
                          "signal.signal(signal.SIGINT, signal.default_int_handler); "
                          "sys.argv[0] = 'moejax.main'; runpy.run_module('moejax.main', run_name='__main__')")
    proc = subprocess.Popen([sys.executable, "-c", as_from_a_terminal, "--config", str(config), "--workdir", str(workdir)],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        while not (workdir / "checkpoints").is_dir():  # the Checkpointer is made just before compiling
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.05)
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        sent = time.monotonic()
        _, err = proc.communicate(timeout=60)
        took = time.monotonic() - sent
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert "interrupted before training started; nothing new was saved" in err
    assert took < 5.0, f"{took:.1f} s"
    assert not workdir.exists()  # no empty checkpoints/ (nor the workdir it made)


# --- metrics.jsonl: each step once ---------------------------------------------------------------

def test_records_of_redone_steps_replace_the_old_ones(tmp_path, cache_dir, small_run):
    cfg = small_run_cfg(cache_dir)
    workdir = copy_run(small_run, tmp_path / "run")
    shutil.rmtree(os.path.join(workdir, "checkpoints"))  # as if killed twice before the first checkpoint
    old = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines(keepends=True)
    (tmp_path / "run" / "metrics.jsonl").write_text(old[0] + old[0] + "".join(old[:3]))
    train(cfg, workdir)
    steps = [r["step"] for r in read_metrics(workdir)]
    assert steps == sorted(set(steps)) == list(range(7))
    assert [(r.get("loss"), r.get("eval_loss")) for r in read_metrics(workdir)] == \
        [(r.get("loss"), r.get("eval_loss")) for r in read_metrics(small_run)]  # the same run, bit for bit


# --- a nan is never a result ---------------------------------------------------------------------

def _nan_batches(monkeypatch, module, when=lambda n: True):
    """Batches handed to the device through ``module.to_global`` get a nan loss mask (every
    non-finite loss there is), on the calls ``when(n)`` picks (n counts from 1)."""
    original, calls = module.to_global, []

    def damaged(batch, *args):
        calls.append(1)
        if when(len(calls)):
            batch = dict(batch, loss_mask=np.full_like(batch["loss_mask"], np.nan))
        return original(batch, *args)

    monkeypatch.setattr(module, "to_global", damaged)


def test_a_non_finite_evaluation_stops_the_run_naming_the_step_and_the_domains(tmp_path, cache_dir, small_run,
                                                                             monkeypatch):
    from moejax.train import default_hooks
    from moejax.train.default_hooks import BadEvaluation

    workdir = copy_run(small_run, tmp_path / "run")  # checkpoints at 3 and 6
    shutil.rmtree(os.path.join(workdir, "checkpoints", "6"))  # redo steps 4-6: the evaluation at 6
    _nan_batches(monkeypatch, default_hooks)
    with pytest.raises(BadEvaluation, match=r"the evaluation at step 6 gave a non-finite held-out loss "
                                            r"\(eval_loss/code nan.*\).*cause: "):
        train(small_run_cfg(cache_dir), workdir)
    assert BadEvaluation.exit_code == 3
    assert not os.path.isdir(os.path.join(workdir, "checkpoints", "6"))  # no checkpoint of a nan result
    assert all(np.isfinite(r.get("eval_loss", 0.0)) for r in read_metrics(workdir))  # and no nan record


def test_a_run_whose_last_step_is_non_finite_stops_instead_of_ending_on_nan(tmp_path, cache_dir, small_run,
                                                                         monkeypatch):
    from moejax.train import startup

    workdir = copy_run(small_run, tmp_path / "run")
    shutil.rmtree(os.path.join(workdir, "checkpoints", "6"))  # redo steps 4-6, the last one non-finite
    _nan_batches(monkeypatch, startup, when=lambda n: n == 3)
    with pytest.raises(Diverged, match=r"the last step \(6\) had a non-finite loss or gradient.*"
                                       r"The newest checkpoint \(step 3\)"):
        train(small_run_cfg(cache_dir), workdir)


def test_a_summary_with_nan_is_not_a_success():
    from moejax.main import summary_problem

    fine = {"final_step": 6, "first_eval": (0, 5.5), "last_eval": (6, 4.1)}
    assert summary_problem(fine) is None
    problem = summary_problem({"final_step": 6, "first_eval": (0, float("nan")), "last_eval": (6, float("nan"))})
    assert problem and "step 0" in problem and "step 6" in problem and "not finite" in problem
