"""Compile a run's jitted functions while its data loads, and keep them on disk for the next run.

Loading the data (on a fresh machine: building the built-in corpus, whose slow part runs in
worker processes, ``moejax.data.stdlib_text.all_prose_pieces``) needs no compiled code, and
compiling the state initialiser, the eval step and the train step needs only shapes.
:class:`Precompile` lowers and compiles them in a background thread while the main thread loads
the data; the first calls then find the executables in JAX's in-memory cache (the same jitted
functions, the same abstract arguments). Nothing about the computation changes. A compile that
fails here is ignored: the call compiles again and raises as it would have.

The thread is joined before the main thread goes on when loading the data raises: a process that
exits while XLA is compiling aborts (SIGABRT) instead of exiting with its error. A Ctrl-C does not
wait: the jobs not started yet are dropped, the ``KeyboardInterrupt`` goes on at once, and if the
compile in progress is still running when the interpreter exits, the process ends with
``os._exit(130)`` (streams flushed) instead of aborting.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
import time
from typing import Callable

import jax
from jax.sharding import Mesh

log = logging.getLogger(__name__)


class Precompile:
    """``with Precompile(mesh, jobs) as p: ...``: compiles ``jobs`` (name -> zero-argument callable
    returning a ``jax.stages.Lowered``), in order, in a background thread while the block runs,
    and waits for them when it ends; ``p.seconds`` is how long they took."""

    def __init__(self, mesh: Mesh, jobs: dict[str, Callable[[], jax.stages.Lowered]]):
        self.seconds = 0.0
        self._done = threading.Event()  # not Thread.join: a Ctrl-C inside join marks the thread stopped
        self._cancel = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(mesh, jobs), name="moejax-precompile", daemon=True)

    def _run(self, mesh: Mesh, jobs) -> None:
        start = time.perf_counter()
        try:
            with jax.set_mesh(mesh):
                for lower in jobs.values():
                    if self._cancel.is_set():
                        break
                    try:
                        lower().compile()
                    except Exception:  # noqa: BLE001 - the real call recompiles and raises it
                        pass
        finally:
            self.seconds = time.perf_counter() - start
            self._done.set()

    def __enter__(self) -> "Precompile":
        self._thread.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None and issubclass(exc_type, KeyboardInterrupt):
            self._abandon()
            return
        try:
            self._done.wait()
        except KeyboardInterrupt:
            self._abandon()
            raise

    def _abandon(self) -> None:
        """Drops the jobs not started; an exit during the one in progress ends the process cleanly."""
        self._cancel.set()
        if not self._done.is_set():
            atexit.register(_exit_if_compiling, self._done)


def _exit_if_compiling(done: threading.Event) -> None:
    """At interpreter exit, while a compile still runs in the background: end the process now
    (an interpreter that finalises under XLA's compiler thread aborts with SIGABRT)."""
    if done.is_set():
        return
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(130)  # only an interrupt abandons a compile: the status of Ctrl-C


def use_persistent_cache() -> str | None:
    """Keep compiled executables on disk for the next process (JAX's persistent compilation cache).

    A rerun of a config, a resumed run, every run of a mixture sweep (one model shape, many
    mixtures) and ``moejax.eval`` compile the same programs: with the cache, each compile after the
    first is a file read (the default job's ~14 s of compiles). The executable read back is the one
    XLA compiled, so results are bit-identical. The cache is ``$JAX_COMPILATION_CACHE_DIR`` if set
    (empty: no cache, as in the sweep runner), else ``<corpus cache>/xla`` (``$MOEJAX_CACHE`` or
    ``~/.cache/moejax``; delete it any time). Returns the directory in use, or None.
    """
    from moejax.data.corpus import default_cache_dir

    if "JAX_COMPILATION_CACHE_DIR" not in os.environ and not jax.config.jax_compilation_cache_dir:
        jax.config.update("jax_compilation_cache_dir", os.path.join(default_cache_dir(), "xla"))
    directory = jax.config.jax_compilation_cache_dir or None
    log.debug(f"moejax: compilation cache {directory or 'off'}")
    return directory
