"""One attempt at one run: train (unless the final checkpoint is there), then evaluate.

The same function runs in a thread of the local backend and inside a Ray task, so both backends
share every rule. It needs only the job (a JSON-able dict the runner builds) and a ``should_stop``
callable (0: go on, 1: stop, 2: kill now), and talks back only through its return value and
``RUN_DIR/worker.json``.

- Training: ``python -m moejax.main --workdir RUN_DIR ...`` (moejax resumes from the latest
  checkpoint in the workdir by itself). Skipped when ``checkpoints/<steps>`` exists.
- Evaluation: ``python -m moejax.eval --workdir RUN_DIR --all`` (it reuses an ``eval/step_N.json``
  made with the same settings), then a check that every checkpoint has one.
- Each child is a new session (``start_new_session``): a Ctrl-C in the terminal reaches only the
  runner, which sends the child **one** SIGTERM (moejax saves a checkpoint and exits 143; a second
  signal would make it exit at once without saving). After ``grace`` seconds a child still alive
  is killed.
- Output is appended to ``train.log`` / ``eval.log`` under a header line per attempt.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from data_mixture.sweep import record

POLL_SECONDS = 0.2


def _run_phase(cmd: list[str], log_path: Path, cwd: str, env: dict[str, str], should_stop: Callable[[], int],
               grace: float, header: str, on_start: Callable[[int], None]) -> tuple[int, bool]:
    """(exit code, stopped) of ``cmd`` with its output appended to ``log_path``."""
    with open(log_path, "a", encoding="utf-8") as log:
        log.write(f"\n=== {header} {record.utc()} on {record.host()}\n$ {' '.join(cmd)}\n")
        log.flush()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=cwd, env=env,
                                start_new_session=True,
                                preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)
    on_start(proc.pid)
    stopped_at = None
    try:
        while True:
            try:
                code = proc.wait(timeout=POLL_SECONDS)
                return code, stopped_at is not None
            except subprocess.TimeoutExpired:
                pass
            level = should_stop()
            if stopped_at is None and level:
                stopped_at = time.monotonic()
                _signal(proc, signal.SIGTERM)
            if stopped_at is not None and (level >= 2 or time.monotonic() - stopped_at > grace):
                _signal(proc, signal.SIGKILL)
    except BaseException:  # KeyboardInterrupt in a Ray task, or the runner dying: never leave a child behind
        _signal(proc, signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            _signal(proc, signal.SIGKILL)
        raise


def _die_with_parent() -> None:
    """In the child, before exec (Linux): SIGTERM when the thread that started it dies, so a runner
    killed outright (SIGKILL, OOM) leaves no training behind that would race a later runner; the
    child saves a checkpoint as on any SIGTERM."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _signal(proc: subprocess.Popen, sig: int) -> None:
    """``sig`` to the child's process group (moejax with MOEJAX_LOCAL_PROCESSES has children too)."""
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def run_job(job: dict[str, Any], should_stop: Callable[[], int]) -> dict[str, Any]:
    """Executes one attempt; returns ``{"state": succeeded|failed|interrupted, "phase", "returncode",
    "log", "message", "host", "seconds", "trained", "resumed_from"}``."""
    t0 = time.time()
    run_dir = Path(job["run_dir"])
    run_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.update(job.get("env", {}))
    result: dict[str, Any] = {"host": record.host(), "trained": False, "resumed_from": None, "returncode": 0,
                              "phase": None, "log": None, "message": ""}

    def worker(phase: str, pid: int | None) -> None:
        record.write_json_atomic(run_dir / record.WORKER, {"host": record.host(), "pid": os.getpid(), "phase": phase,
                                                           "child_pid": pid, "attempt": job["attempt"],
                                                           "since": record.utc()})

    def finish(state: str, **fields: Any) -> dict[str, Any]:
        result.update(fields, state=state, seconds=time.time() - t0)
        return result

    header = f"attempt {job['attempt']}"
    if not record.run_progress(run_dir, job["steps"])["final"]:
        before = [s for s in record.checkpoint_steps(run_dir) if s > 0]
        result.update(trained=True, resumed_from=before[-1] if before else None, phase="train",
                      log=str(run_dir / record.TRAIN_LOG))
        code, stopped = _run_phase(job["train_cmd"], run_dir / record.TRAIN_LOG, job["cwd"], env, should_stop,
                                   job["grace"], header, lambda pid: worker("train", pid))
        if stopped:
            return finish("interrupted", returncode=code, message=f"training stopped (exit {code})")
        if code:
            return finish("failed", returncode=code, message=f"training exited with code {code}")
        if not record.run_progress(run_dir, job["steps"])["final"]:
            return finish("failed", returncode=code,
                          message=f"training exited 0 but checkpoints/{job['steps']} is missing")
    if should_stop():
        return finish("interrupted", message="stopped before evaluation")
    result.update(phase="eval", log=str(run_dir / record.EVAL_LOG))
    code, stopped = _run_phase(job["eval_cmd"], run_dir / record.EVAL_LOG, job["cwd"], env, should_stop, job["grace"],
                               header, lambda pid: worker("eval", pid))
    if stopped:
        return finish("interrupted", returncode=code, message=f"evaluation stopped (exit {code})")
    if code:
        return finish("failed", returncode=code, message=f"evaluation exited with code {code}")
    missing = record.run_progress(run_dir, job["steps"])["unevaluated"]
    if missing:
        return finish("failed", message=f"evaluation exited 0 but eval/step_N.json is missing for steps {missing}")
    return finish("succeeded")
