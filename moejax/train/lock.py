"""The workdir lock: one training run per workdir at a time.

Training holds ``WORKDIR/run.lock`` while it runs: a small JSON file naming the process (pid,
host, start time), created atomically (``O_EXCL``) and touched every ``HEARTBEAT_SECONDS`` by a
background thread (its modification time is the heartbeat). A second run into the same workdir is
refused at once, naming the process that holds it. A lock left by a run that was killed is taken
over by the next run:

- on the same host, as soon as its process is gone (or its pid now belongs to a process started
  after the lock was taken);
- from another host (a shared filesystem), once its heartbeat is older than ``STALE_SECONDS``.

Multi-host (docs/multihost.md): only process 0 takes the lock; the others learn the outcome from
it, so every process of a refused run stops together.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid

from moejax.errors import ConfigError

FILE = "run.lock"
HEARTBEAT_SECONDS = 20.0
STALE_SECONDS = 300.0  # a lock from another host whose heartbeat is older than this is taken over


class WorkdirLocked(ConfigError):
    """Another training run holds the workdir."""


def _pid_alive(pid: int, since: float) -> bool:
    """Whether ``pid`` runs on this host and was started before ``since`` (not a reused pid)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it exists
        pass
    started = _process_start(pid)
    return started is None or started <= since + 1.0


def _process_start(pid: int) -> float | None:
    """When process ``pid`` started (seconds since the epoch), from Linux's /proc; None elsewhere."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, after the "(name)" field
        with open("/proc/stat") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime "))
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def _read(path: str) -> tuple[dict, float] | None:
    """(the holder's record, the heartbeat time) of a lock file, or None if there is none."""
    try:
        with open(path) as f:
            text = f.read()
        heartbeat = os.stat(path).st_mtime
    except FileNotFoundError:
        return None
    try:
        holder = json.loads(text)
    except ValueError:  # cut short while being written: judge it by its age alone
        holder = {}
    return holder, heartbeat


def _stale(holder: dict, heartbeat: float, now: float) -> bool:
    if holder.get("host") == socket.gethostname() and isinstance(holder.get("pid"), int):
        return not _pid_alive(holder["pid"], float(holder.get("started", now)))
    return now - heartbeat > STALE_SECONDS


def _describe(path: str, holder: dict, heartbeat: float, now: float) -> str:
    started = holder.get("started")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)) if isinstance(started, (int, float)) else "?"
    other_host = holder.get("host") != socket.gethostname()
    return (
        f"another training run is using workdir {os.path.dirname(path)}: pid {holder.get('pid', '?')} on host "
        f"{holder.get('host', '?')}, started {when}, heartbeat {now - heartbeat:.0f} s ago ({path}). Two runs "
        "in one workdir would overwrite each other's checkpoints and metrics. Wait for it to finish, stop it "
        "(Ctrl-C or kill saves a checkpoint), or train into another --workdir."
        + (f" A lock from another host is taken over once its heartbeat is {STALE_SECONDS:.0f} s old." if other_host
           else "")
    )


class WorkdirLock:
    """``with WorkdirLock(workdir): ...`` holds the workdir's lock (module docstring), or raises
    :class:`WorkdirLocked`; ``enabled=False`` (processes other than 0) does nothing."""

    def __init__(self, workdir: str, enabled: bool = True):
        self.path = os.path.join(workdir, FILE)
        self.enabled = enabled
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._token = uuid.uuid4().hex

    def acquire(self) -> None:
        if not self.enabled:
            return
        record = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(), "token": self._token}
        for _ in range(3):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                found = _read(self.path)
                if found is None:  # released meanwhile: try again
                    continue
                holder, heartbeat = found
                now = time.time()
                if not _stale(holder, heartbeat, now):
                    raise WorkdirLocked(_describe(self.path, holder, heartbeat, now)) from None
                self._take_over(holder)
                continue
            with os.fdopen(fd, "w") as f:
                json.dump(record, f)
            self._thread = threading.Thread(target=self._beat, name="moejax-workdir-lock", daemon=True)
            self._thread.start()
            return
        found = _read(self.path) or ({}, time.time())
        raise WorkdirLocked(_describe(self.path, *found, time.time()))

    def _take_over(self, stale: dict) -> None:
        """Removes a stale lock, unless another run replaced it meanwhile (it is put back then)."""
        aside = f"{self.path}.stale-{self._token}"
        try:
            os.rename(self.path, aside)  # atomic: of two runs taking over, one gets the file
        except FileNotFoundError:
            return
        moved = _read(aside)
        if moved is not None and moved[0] != stale:  # a fresh lock, taken between our read and rename
            try:
                os.link(aside, self.path)  # put it back unless yet another run holds the name now
            except FileExistsError:
                pass
        os.remove(aside)

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_SECONDS):
            try:
                os.utime(self.path)
            except OSError:  # the workdir went away: nothing left to guard
                return

    def release(self) -> None:
        if not self.enabled or self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        found = _read(self.path)
        if found is not None and found[0].get("token") == self._token:  # ours, not a taker-over's
            os.remove(self.path)

    def __enter__(self) -> WorkdirLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()
