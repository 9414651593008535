"""Test-wide setup: 8 fake CPU devices, and one corpus, one XLA compilation cache and one set of
shared training runs per pytest run.

- 8 fake CPU devices, so meshes such as (data=2, fsdp=2, expert=2) are real shardings, compiled
  with LLVM optimisation level 0 (faster compiles, same numbers; see below).
- One run directory (``$MOEJAX_TEST_RUN_DIR``, fresh under the system temp dir and removed at exit
  unless set) holds, for the whole run and every pytest-xdist worker (they inherit the
  environment of the main process):
  ``corpus/``  the built-in corpus and benchmarks cache (``$MOEJAX_CACHE``, moejax/data/corpus.py),
               built once per run instead of once per module; training subprocesses inherit it.
               Set ``MOEJAX_CACHE`` yourself to reuse one between runs, e.g.
               ``MOEJAX_CACHE=~/.cache/moejax ./launch.sh test``.
  ``xla/``     JAX's persistent compilation cache (``$JAX_COMPILATION_CACHE_DIR``), shared with the
               training subprocesses of the kill/resume drills: many tests compile the same tiny
               train step (the same config on the same mesh), and a cache hit costs a fraction of
               a second where a compile costs several seconds on 2 cores. The executable read back
               is the one XLA compiled, so results are bit-identical with or without it.
  ``shared/``  training runs that several tests only read (``run_once``).

Fixtures for every test module (use them rather than building a corpus or a run of your own):

- ``corpus_cache``: the corpus cache directory with the seed-0 corpus built; pass it as
  ``data.cache_dir`` (or leave ``data.cache_dir=''``: ``$MOEJAX_CACHE`` is the same directory).
- ``builtin_benchmarks``: the built-in benchmarks, built once per run into that cache.
- ``run_once``: ``run_once(name, build)`` returns ``<run dir>/shared/<name>``, made by
  ``build(path)`` the first time any test of the run (on any xdist worker) asks for ``name``.
  Tests must only read what it returns; copy it (``shutil.copytree``) to change it.

Every test starts with the logging the command lines set up by default (``moejax.log.setup_logging()``:
INFO to stdout, warnings to stderr), so a test that calls library code directly sees its messages
where a user of the commands does, and a command run with ``--quiet`` in one test does not silence
the next.
"""
import atexit
import contextlib
import fcntl
import os
import shutil
import signal
import tempfile
import warnings
from typing import Callable, Iterator

import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")
_xla_flags = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
if "xla_backend_optimization_level" not in _xla_flags:
    # LLVM optimisation level 0 for XLA:CPU: compiles about 40% faster (measured on the tiny train
    # step) and computes the same numbers (no floating-point semantics change; the tiny step's loss
    # was bit-identical). Tests check behaviour, not the speed of compiled code. Training
    # subprocesses (the kill drills, multi-host, the sweeps) keep these flags and set their own
    # device count.
    _xla_flags += " --xla_backend_optimization_level=0"
if "xla_cpu_use_fusion_emitters" not in _xla_flags:
    # XLA:CPU's older elemental emitters for fusions instead of the MLIR fusion emitters: the tiny
    # train steps of the tests compile 2-2.5x faster (the sharding test's step on 8 devices: 4.2 s ->
    # 1.9 s) and test_sharding + test_remat run 30% faster in all. The same tolerances hold
    # (every equivalence test passes unchanged).
    _xla_flags += " --xla_cpu_use_fusion_emitters=false"
os.environ["XLA_FLAGS"] = _xla_flags.strip()

if not os.environ.get("MOEJAX_TEST_RUN_DIR"):
    _created = tempfile.mkdtemp(prefix="moejax-test-")
    atexit.register(shutil.rmtree, _created, ignore_errors=True)
    os.environ["MOEJAX_TEST_RUN_DIR"] = _created
RUN_DIR = os.environ["MOEJAX_TEST_RUN_DIR"]
os.environ.setdefault("MOEJAX_CACHE", os.path.join(RUN_DIR, "corpus"))
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(RUN_DIR, "xla"))
# Cache every compile that takes noticeable time (JAX's default threshold, 1 s, leaves out many of
# the tests' small train steps on an idle machine).
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")
CORPUS_CACHE = os.environ["MOEJAX_CACHE"]


@contextlib.contextmanager
def _run_lock(name: str) -> Iterator[None]:
    """An exclusive lock over the whole test run (all xdist workers), held while building ``name``."""
    os.makedirs(os.path.join(RUN_DIR, "locks"), exist_ok=True)
    with open(os.path.join(RUN_DIR, "locks", name), "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def build_once(name: str, build: Callable[[str], None]) -> str:
    """``<run dir>/shared/<name>``, made by ``build(path)`` once per test run (see ``run_once``)."""
    path = os.path.join(RUN_DIR, "shared", name)
    with _run_lock(name):
        if not os.path.isfile(path + ".done"):
            shutil.rmtree(path, ignore_errors=True)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            build(path)
            open(path + ".done", "w").close()
    return path


@pytest.fixture(scope="session")
def corpus_cache() -> str:
    """The run's corpus cache directory, with the built-in seed-0 corpus built (once per run)."""
    from moejax.data.corpus import load_tokenized_corpus

    with _run_lock("corpus"):
        load_tokenized_corpus(0, CORPUS_CACHE)
    return CORPUS_CACHE


@pytest.fixture(scope="session")
def builtin_benchmarks(corpus_cache):
    """The built-in benchmarks (moejax.eval.benchmarks), built once per run into the corpus cache."""
    from moejax.eval.benchmarks import load_benchmarks

    with _run_lock("benchmarks"):
        return load_benchmarks(0, corpus_cache)


@pytest.fixture(scope="session")
def run_once(corpus_cache) -> Callable[[str, Callable[[str], None]], str]:
    """``run_once(name, build)``: a directory made once per test run by ``build(path)``; read it only."""
    return build_once


@pytest.fixture(autouse=True)
def _command_line_logging() -> None:
    from moejax.log import setup_logging

    setup_logging()


@pytest.fixture(autouse=True)
def _signal_state_restored(request) -> Iterator[None]:
    """Each test starts with the signal mask and SIGINT handler the previous one found: a library
    that blocks or ignores SIGINT in a test would otherwise leave it so for every later test in the
    worker and for the processes they start (which then cannot be interrupted). Names the test."""
    mask, handler = signal.pthread_sigmask(signal.SIG_BLOCK, []), signal.getsignal(signal.SIGINT)
    yield
    if signal.pthread_sigmask(signal.SIG_SETMASK, mask) != mask or signal.getsignal(signal.SIGINT) is not handler:
        if handler is not None:
            signal.signal(signal.SIGINT, handler)
        warnings.warn(f"{request.node.nodeid} changed the signal mask or the SIGINT handler; restored", stacklevel=1)
