"""The memory allocator of the processes that launch.sh starts: mimalloc, preloaded.

Why. XLA:CPU gives every execution of a compiled step one fresh buffer for all of its temporaries
(hundreds of MB for the tiny default's train step, GBs for larger configs). glibc's malloc serves
a request that large with ``mmap`` and gives it back with ``munmap`` when the step ends, so every
step page-faults the whole buffer in again, and a large share of the step goes to kernel time.
mimalloc keeps freed memory mapped and hands it to the next step: nearly all of the faults go, the
train step and the default job run measurably faster, and nothing numerical changes. The
measurements (faults, kernel time, step and job times, alternating processes on an idle machine)
are in experiments/benchmarks/LOG.md, section 2, change 6.

How. ``launch.sh`` (training, ``test``, and ``python ...`` for any other command) runs
``python -m moejax.allocator``, which prints the path of the ``libmimalloc.so`` that the PyPI
package ``cmeel-mimalloc`` (a base requirement in pyproject.toml) installs, and puts it in ``LD_PRELOAD``, with
``MIMALLOC_PURGE_DELAY=-1`` (freed memory is never given back to the OS: with the default 10 ms
delay the host work between two steps of the training loop was enough for mimalloc to return the
buffer, and the loop's steps ran slower; LOG.md, change 6); child processes (the sweep's runs, the drills)
inherit both. ``MOEJAX_ALLOCATOR=system`` keeps glibc's malloc. A process started without
launch.sh (``.venv/bin/python -m ...``) computes the same numbers, only its CPU steps are slower;
a training run then says so in its first line, and the benchmarks record the allocator in their
JSON (:func:`active`).
"""

from __future__ import annotations

import os
import sys
import sysconfig

CHOICES = ("mimalloc", "system")
REEXEC_MARK = "MOEJAX_CLI_PRELOADED"  # set in the re-executed process: never twice
LIBRARY = os.path.join("cmeel.prefix", "lib", "libmimalloc.so.3")


def mimalloc_path() -> str | None:
    """The ``libmimalloc.so`` installed beside this Python's packages, or None."""
    for key in ("purelib", "platlib"):
        path = os.path.join(sysconfig.get_paths()[key], LIBRARY)
        if os.path.isfile(path):
            return path
    return None


def preload(choice: str | None = None) -> str | None:
    """The library to preload for ``choice`` (default: ``$MOEJAX_ALLOCATOR``, else mimalloc), or
    None for the system allocator. Raises ValueError for a choice not in ``CHOICES``."""
    choice = choice if choice is not None else os.environ.get("MOEJAX_ALLOCATOR", "mimalloc")
    if choice not in CHOICES:
        raise ValueError(f"MOEJAX_ALLOCATOR must be one of {CHOICES}, got {choice!r}")
    return mimalloc_path() if choice == "mimalloc" else None


def active() -> str:
    """The allocator this process runs with: "mimalloc" when preloaded, else "system"."""
    return "mimalloc" if "libmimalloc" in os.environ.get("LD_PRELOAD", "") else "system"


def reexec_with_mimalloc(prog: str) -> None:
    """Re-executes this process's command line (``sys.orig_argv``) once with mimalloc in
    ``LD_PRELOAD`` (as launch.sh starts its processes), unless it is there already, unavailable,
    or ``MOEJAX_ALLOCATOR=system``; ``moejax train`` and ``python -m moejax.main`` call it first."""
    if os.environ.get(REEXEC_MARK) or active() == "mimalloc":
        return
    try:
        lib = preload()
    except ValueError as e:
        sys.stderr.write(f"{prog}: error: {e}\n")
        sys.exit(2)
    if not lib:
        return
    from moejax import paths

    env = dict(os.environ)
    env["LD_PRELOAD"] = lib + (f":{env['LD_PRELOAD']}" if env.get("LD_PRELOAD") else "")
    env.setdefault("MIMALLOC_PURGE_DELAY", "-1")  # keep freed memory (see the module docstring)
    env[REEXEC_MARK] = "1"
    caller = paths.caller_cwd()
    if caller:  # the first moejax import took it out of the environment
        env[paths.CALLER_CWD_ENV] = caller
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, sys.orig_argv, env)


def main() -> int:
    choice = os.environ.get("MOEJAX_ALLOCATOR", "mimalloc")
    try:
        path = preload(choice)
    except ValueError as e:
        print(f"launch.sh: {e}", file=sys.stderr)
        return 2
    if path is None and choice == "mimalloc":
        print(f"launch.sh: {LIBRARY} not found under this Python's packages (pip install "
              "cmeel-mimalloc); using the system allocator, so steps on CPU run slower", file=sys.stderr)
    print(path or "")
    return 0


if __name__ == "__main__":
    sys.exit(main())
