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


def _say(line: str) -> None:
    """One line on stderr, safely from a signal handler or a timer thread."""
    try:
        os.write(2, f"moejax: {line}\n".encode())
    except OSError:
        pass


def _exit(code: int, line: str) -> None:
    _say(line)
    os._exit(code)


class PreemptionGuard:
    """Context manager that turns SIGTERM/SIGINT into a flag the training loop polls.

    If the loop has not finished its checkpoint ``grace_seconds`` after the signal, the process
    exits anyway, saying so (orbax commits a checkpoint only when it is complete, so a cut-off save
    leaves the older checkpoints intact). A second SIGTERM (schedulers and ``kill`` repeat
    themselves) does not cut that save short: it is answered with one line, and once the save is done
    a later SIGTERM is ignored (the process is exiting with 128 + 15). A second Ctrl-C is a person who
    wants out: it exits at once, saying that the checkpoint was not saved. Handlers are installed
    only in the main thread (signals cannot be caught elsewhere) and restored on exit.
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
        name = signal.Signals(signum).name
        if self.signum is not None:
            if signum == signal.SIGINT:
                _exit(128 + signum, f"second {name}: exiting at once, without the checkpoint of this step (the "
                                    "older checkpoints are intact).")
            _say(f"second {name}: still saving the checkpoint asked for by the first (at most "
                 f"{self.grace_seconds:g} s, checkpoint.grace_seconds); SIGKILL stops at once.")
            return
        self.signum = signum
        timer = threading.Timer(self.grace_seconds, _exit, args=(
            128 + signum, f"the checkpoint was not saved within checkpoint.grace_seconds={self.grace_seconds:g} s "
                          f"of {name}; exiting without it (the older checkpoints are intact)."))
        timer.daemon = True
        timer.start()

    def __enter__(self) -> PreemptionGuard:
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            # After a SIGTERM stop the process is on its way out with 143: a repeat (schedulers send
            # it again) arriving after the save must not turn that exit status into a kill.
            stopping = sig == signal.SIGTERM and self.signum == signal.SIGTERM
            signal.signal(sig, signal.SIG_IGN if stopping else handler)
