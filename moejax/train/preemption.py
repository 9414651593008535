"""Preemption: SIGTERM/SIGINT ask the loop to save a checkpoint and exit at the next step boundary."""

from __future__ import annotations

import os
import signal
import threading
import types


class Preempted(Exception):
    """Raised by the loop after the preemption checkpoint is on disk."""

    def __init__(self, signum: int, step: int):
        super().__init__(f"stopped by {signal.Signals(signum).name} at step {step}")
        self.signum, self.step = signum, step


class PreemptionGuard:
    """Context manager that turns SIGTERM/SIGINT into a flag the training loop polls.

    If the loop has not finished its checkpoint ``grace_seconds`` after the signal, the process
    exits anyway (orbax commits a checkpoint only when it is complete, so a cut-off save leaves the
    older checkpoints intact). A second signal exits at once. Handlers are installed only in the
    main thread (signals cannot be caught elsewhere) and restored on exit.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, grace_seconds: float):
        self.grace_seconds = grace_seconds
        self.signum: int | None = None
        self._previous: dict[int, object] = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def _handle(self, signum: int, frame: types.FrameType | None) -> None:
        if self.signum is not None:
            os._exit(128 + signum)
        self.signum = signum
        timer = threading.Timer(self.grace_seconds, os._exit, args=(128 + signum,))
        timer.daemon = True
        timer.start()

    def __enter__(self) -> PreemptionGuard:
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
