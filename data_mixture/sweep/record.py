"""What a run directory says about its run: progress on disk, lease, status and record.

Files in ``ROOT/<run>/`` besides moejax's own (``config.json``, ``checkpoints/``, ``eval/``,
``metrics.jsonl``):

``lease.json``   who runs the target now: created with ``O_CREAT | O_EXCL`` (atomic on local disks
                 and on NFS v3+), so of several runners (on one machine or many, against one root)
                 exactly one gets it; its mtime is the heartbeat, touched by the owner every
                 ``heartbeat`` seconds. A lease whose mtime is older than the lease timeout is
                 stale (its runner died), and so is one whose runner ran on this host under a pid
                 that is gone (killed: taken over at once): another runner may take it over, under a second
                 ``O_EXCL`` file (``lease.takeover``) so that two runners never both take it.
                 Removed when the attempt ends.
``status.json``  ``state`` (running | succeeded | failed | interrupted), ``started_at`` (UTC: when
                 the run's first attempt started, kept over every later attempt; ``collect`` carries
                 it into the runs table), ``started`` (the current attempt's start), ``attempts`` (all runners,
                 all invocations), the runner's ``host``/``pid``, ``heartbeat`` (epoch seconds, also
                 as ``heartbeat_utc``), the phase (train | eval), the log of the failing phase, and
                 ``history``: one entry per attempt. Written by the lease owner only, atomically
                 (temporary file + rename), so a reader never sees half a file.
``record.json``  what produced the run (and ``started_at``, as in the status): the plan entry, the plan file, the experiment file, the
                 overrides (the plan's and the runner's additions), the resolved config, and one
                 ``launches`` entry per attempt with the code version (git commit + dirty flag)
                 and the exact commands.
``worker.json``  written by the process that executes an attempt (a local thread or a Ray task):
                 its host, the phase and the child's pid; merged into the status on each heartbeat.
``train.log``, ``eval.log``   the commands' output, appended per attempt under a header line.

Done is decided from the files alone (:func:`run_progress`): the final checkpoint exists and every
checkpoint has an ``eval/step_N.json``. So a run finished by another runner, or by hand, counts.
"""

from __future__ import annotations

import datetime as _dt
import functools
import json
import os
import re
import socket
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

from data_mixture.collect import checkpoint_steps, eval_steps  # noqa: F401  (record.checkpoint_steps: the runner's view)
from moejax import configs as builtin_configs

LEASE, TAKEOVER, STATUS, RECORD, WORKER = "lease.json", "lease.takeover", "status.json", "record.json", "worker.json"
TRAIN_LOG, EVAL_LOG = "train.log", "eval.log"
STOP = "stop.request"  # a Ray task polls for this file (the runner's stop request reaches it on any node)


def utc(t: float | None = None) -> str:
    return _dt.datetime.fromtimestamp(time.time() if t is None else t, _dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def write_json_atomic(path: str | os.PathLike, obj: Any) -> None:
    """Temporary file in the same directory, flushed and fsynced, then renamed over ``path``."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_json(path: str | os.PathLike) -> dict[str, Any] | None:
    """The JSON object at ``path``, or None when it is missing or unreadable."""
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


# ------------------------------------------------------------------------------------- progress


def run_progress(run_dir: str | os.PathLike, steps: int) -> dict[str, Any]:
    """``{"checkpoints", "final", "unevaluated", "done"}`` of a run directory, from its files."""
    ckpts = [s for s in checkpoint_steps(run_dir) if s > 0]
    evals = set(eval_steps(run_dir))
    final = steps in ckpts
    unevaluated = [s for s in ckpts if s not in evals]
    return {"checkpoints": ckpts, "final": final, "unevaluated": unevaluated, "done": final and not unevaluated}


# ---------------------------------------------------------------------------------------- lease


@functools.cache
def host() -> str:
    return socket.gethostname()


def new_owner() -> dict[str, Any]:
    """This runner's identity: host, pid and a random id (pids repeat across machines)."""
    return {"id": uuid.uuid4().hex, "host": host(), "pid": os.getpid(), "since": time.time()}


def lease_age(run_dir: str | os.PathLike) -> float | None:
    """Seconds since the lease's heartbeat (its mtime), or None when there is no lease."""
    try:
        return max(0.0, time.time() - os.stat(Path(run_dir) / LEASE).st_mtime)
    except FileNotFoundError:
        return None


def dead_here(holder: dict[str, Any]) -> bool:
    """Whether a lease's runner is known to be dead: it ran on this host and its pid is gone. (A
    reused pid reads as alive: such a lease waits for its timeout, as one from another host does.)"""
    pid = holder.get("pid")
    if holder.get("host") != host() or not isinstance(pid, int) or pid <= 0 or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # EPERM: alive, another user's
        return False
    return False


def stale_reason(holder: dict[str, Any], age: float, timeout: float) -> str | None:
    """Why a lease may be taken over (its runner died), or None while it is live."""
    if dead_here(holder):
        return f"its runner, pid {holder.get('pid')} on this host ({host()}), is no longer running"
    if age > timeout:
        return f"no heartbeat for {age:.0f} s > --lease-timeout {timeout:g}"
    return None


def _create_exclusive(path: Path, content: dict[str, Any]) -> bool:
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(content, f)
        f.flush()
        os.fsync(f.fileno())
    return True


def try_acquire(run_dir: str | os.PathLike, owner: dict[str, Any], timeout: float) -> tuple[bool, dict[str, Any]]:
    """Takes the run's lease: ``(True, owner)``, or ``(False, holder)`` with the holder's lease and
    its ``age`` (seconds since its heartbeat) when another live runner holds it.

    A stale lease (heartbeat older than ``timeout``, or held by a runner of this host whose process
    is gone: :func:`stale_reason`) is taken over: under ``lease.takeover`` (itself created
    exclusively, and cleared when older than ``timeout``) the lease is checked again, still stale and
    still the same holder, then removed and created anew for ``owner``.
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LEASE
    for _ in range(3):
        if _create_exclusive(path, owner):
            return True, owner
        holder = read_json(path) or {}
        age = lease_age(run_dir)
        if age is None:  # released between our two looks: try again
            continue
        holder["age"] = age
        if stale_reason(holder, age, timeout) is None:
            return False, holder
        lock = run_dir / TAKEOVER
        if not _create_exclusive(lock, owner):
            try:
                if time.time() - os.stat(lock).st_mtime > timeout:  # a runner died mid-takeover
                    os.unlink(lock)
            except FileNotFoundError:
                pass
            return False, holder
        try:
            again = read_json(path) or {}
            age = lease_age(run_dir)
            if (age is not None and again.get("id") == holder.get("id")
                    and stale_reason(again, age, timeout) is not None):
                os.unlink(path)
        finally:
            os.unlink(lock)
    holder = read_json(path) or {}
    holder["age"] = lease_age(run_dir) or 0.0
    return False, holder


def holds(run_dir: str | os.PathLike, owner: dict[str, Any]) -> bool:
    return (read_json(Path(run_dir) / LEASE) or {}).get("id") == owner["id"]


def heartbeat(run_dir: str | os.PathLike, owner: dict[str, Any]) -> bool:
    """Touches the lease if ``owner`` still holds it; False when it was lost (taken over)."""
    if not holds(run_dir, owner):
        return False
    try:
        os.utime(Path(run_dir) / LEASE)
    except FileNotFoundError:
        return False
    return True


def release(run_dir: str | os.PathLike, owner: dict[str, Any]) -> None:
    if holds(run_dir, owner):
        try:
            os.unlink(Path(run_dir) / LEASE)
        except FileNotFoundError:
            pass


# --------------------------------------------------------------------------------- status/record


def read_status(run_dir: str | os.PathLike) -> dict[str, Any]:
    return read_json(Path(run_dir) / STATUS) or {}


def write_status(run_dir: str | os.PathLike, **fields: Any) -> dict[str, Any]:
    """Merges ``fields`` into status.json (atomically) with the update time; returns the new status."""
    status = read_status(run_dir)
    status.update(fields)
    status["updated"] = utc()
    write_json_atomic(Path(run_dir) / STATUS, status)
    return status


@functools.cache
def code_version() -> dict[str, Any]:
    """``{"moejax", "commit", "dirty"}`` of the checkout moejax is imported from (commit/dirty None
    outside a git checkout; dirty: tracked files differ from the commit, untracked files ignored)."""
    import moejax

    where = os.path.dirname(os.path.abspath(moejax.__file__))
    out: dict[str, Any] = {"moejax": moejax.__version__, "commit": None, "dirty": None}
    try:
        out["commit"] = subprocess.run(["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True,
                                       timeout=10, check=True).stdout.strip() or None
        changes = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=where,
                                 capture_output=True, text=True, timeout=20, check=True).stdout
        out["dirty"] = bool(changes.strip())
    except (OSError, subprocess.SubprocessError):
        pass
    return out


# A file of moejax's or data_mixture's own source, wherever the checkout is, with its arguments.
_PACKAGE_FILE = re.compile(r"^(?:.*/)?((?:moejax|data_mixture)/[^:]+\.py)(:.*)?$")


def portable_config(config_file: str) -> str:
    """``config_file`` as plans compare it: a file of moejax's or data_mixture's own source (MergeMix's
    experts name ``.../data_mixture/mergemix/experts.py:STEP:BASE``) by its path inside the checkout,
    so a plan written from another checkout of the same code names the same file; a built-in
    config's old repository path (``experiments/tiny_moe.py``) as its current one."""
    m = _PACKAGE_FILE.match(config_file)
    return m[1] + (m[2] or "") if m else builtin_configs.repo_path(config_file)


def record_key(config_file: str, overrides: dict[str, Any]) -> str:
    """What must not change between attempts of one run directory: the experiment file
    (:func:`portable_config`) + overrides."""
    return json.dumps({"config": portable_config(config_file), "overrides": overrides}, sort_keys=True)
