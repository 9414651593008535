"""Local backend: up to ``--parallel`` attempts at once, each in a thread that runs the attempt's
subprocesses (one process per run, so JAX owns the devices of its process).

Threads, not processes, for the attempts themselves: they only wait on their child, and the
runner's loop (heartbeats, progress, Ctrl-C) stays in one process. A stop request is a
level per attempt (1: SIGTERM the child, 2: SIGKILL it), which
:func:`data_mixture.sweep.attempt.run_job` polls.
"""

from __future__ import annotations

import queue
import threading
from typing import Any

from data_mixture.sweep.attempt import run_job


class LocalBackend:
    name = "local"

    def __init__(self, parallel: int):
        self.slots = parallel
        self._done: queue.Queue = queue.Queue()
        self._stops: dict[str, list[int]] = {}
        self._threads: dict[str, threading.Thread] = {}

    def describe(self) -> str:
        return f"local, {self.slots} at a time"

    def submit(self, key: str, job: dict[str, Any]) -> None:
        stop = [0]

        def work() -> None:
            try:
                result = run_job(job, lambda: stop[0])
            except Exception as e:  # a bug or an OS error: the attempt failed, the sweep goes on
                result = {"state": "failed", "phase": "runner", "returncode": None, "log": None,
                          "message": f"{type(e).__name__}: {e}", "seconds": 0.0, "trained": False}
            self._done.put((key, result))

        self._stops[key] = stop
        self._threads[key] = thread = threading.Thread(target=work, name=f"sweep-{key}", daemon=True)
        thread.start()

    def wait(self, timeout: float) -> list[tuple[str, dict[str, Any]]]:
        """Attempts that finished, waiting up to ``timeout`` seconds for the first."""
        out = []
        try:
            out.append(self._done.get(timeout=timeout))
            while True:
                out.append(self._done.get_nowait())
        except queue.Empty:
            pass
        for key, _ in out:
            self._stops.pop(key, None)
            self._threads.pop(key, None)
        return out

    def stop(self, key: str | None = None) -> None:
        """Asks one attempt (or all) to stop: its child gets one SIGTERM, then SIGKILL after the grace."""
        for k, level in list(self._stops.items()):
            if key is None or k == key:
                level[0] = max(level[0], 1)

    def kill(self) -> None:
        """Second Ctrl-C: every child gets SIGKILL at the attempt's next poll (0.2 s)."""
        for level in list(self._stops.values()):
            level[0] = 2

    def close(self) -> None:
        pass
