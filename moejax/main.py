"""Command-line entry point: ``python -m moejax.main --config FILE --workdir DIR [--config.key=value]``.

``launch.sh`` wraps this. Bad options and bad config values end with a one-paragraph message that
says how to fix them, before anything is compiled.

Multi-host (docs/multihost.md): the same command on every host, with the coordinator in the
environment; ``MOEJAX_LOCAL_PROCESSES=N`` runs N such processes on this machine instead.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

from absl import flags
from ml_collections import config_flags

from moejax.config import ConfigError

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment file with get_config().")
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for metrics, checkpoints and config.json.")


def _die(message: str) -> None:
    sys.stderr.write(f"moejax: error: {message}\n")
    sys.exit(2)


def _parse(argv: list[str]) -> None:
    try:
        flags.FLAGS(argv)
    except KeyError as e:  # an override naming a key the config does not have
        key = e.args[0] if e.args else e
        _die(
            f"unknown config key in a --config.* override: {key}. Overrides must name an existing key, "
            "e.g. --config.model.num_layers=4; see moejax/config.py for every key and its meaning."
        )
    except (flags.Error, TypeError, ValueError) as e:  # bad override value, or a bad experiment file
        _die(f"{e}. Run with --helpfull for the flags, see moejax/config.py for the config keys.")
    if _WORKDIR.value is None:
        _die("--workdir is required, e.g. --workdir runs/tiny.")


def _env_int(name: str, low: int, high: int | None = None) -> int:
    """An integer environment variable in [low, high); a message naming it and its value if not."""
    value = os.environ.get(name)
    try:
        number = int(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        number = None
    if number is None or number < low or (high is not None and number >= high):
        allowed = f"an integer >= {low}" + (f" and < {high}" if high is not None else "")
        _die(f"environment variable {name}={value!r}; allowed: {allowed}. See docs/multihost.md.")
    return number


def maybe_initialize_distributed() -> None:
    """Multi-host: one process per host, coordinated by JAX's own runtime.

    Set JAX_COORDINATOR_ADDRESS (host:port of process 0), JAX_NUM_PROCESSES and JAX_PROCESS_ID on
    every host; on TPU pods or under SLURM set MOEJAX_DISTRIBUTED=1 and JAX detects them itself.
    Must run before anything starts a JAX backend. On CPU, cross-process collectives use gloo
    (JAX's default for ``jax_cpu_collectives_implementation``).
    """
    address = os.environ.get("JAX_COORDINATOR_ADDRESS")
    if not (address or os.environ.get("MOEJAX_DISTRIBUTED")):
        return
    kwargs = {}
    if address:
        count = _env_int("JAX_NUM_PROCESSES", 1)
        kwargs = dict(
            coordinator_address=address, num_processes=count, process_id=_env_int("JAX_PROCESS_ID", 0, count)
        )
    import jax

    jax.distributed.initialize(**kwargs)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


# After one local process fails, the others get this long to finish on their own (a preemption
# ends them all together) before they are killed: a survivor would wait forever on collectives.
LOCAL_STRAGGLER_SECONDS = 30.0


def run_local_processes(count: int, args: list[str]) -> int:
    """``MOEJAX_LOCAL_PROCESSES=N``: N processes of this command on localhost, joined as one job.

    To try and test multi-host behaviour on one machine, on CPU unless JAX_PLATFORMS says
    otherwise (each process would claim every local GPU). Each child gets the coordinator address
    (a free port), the process count and its index. The children share this process's process
    group, so a Ctrl-C in the terminal reaches each of them once (here it is ignored) and killing
    the group ends them all; a SIGTERM sent here is forwarded. Returns the first non-zero exit
    code, else 0.
    """
    port = _free_port()
    children = []
    for index in range(count):
        env = {key: v for key, v in os.environ.items() if key != "MOEJAX_LOCAL_PROCESSES"}
        env.update(JAX_COORDINATOR_ADDRESS=f"localhost:{port}", JAX_NUM_PROCESSES=str(count),
                   JAX_PROCESS_ID=str(index))
        env.setdefault("JAX_PLATFORMS", "cpu")
        children.append(subprocess.Popen([sys.executable, "-m", "moejax.main", *args], env=env))

    def forward(signum, frame):
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, lambda signum, frame: None)  # the children got it too
    return _wait_for(children)


def _wait_for(children: list[subprocess.Popen]) -> int:
    """Waits for every child; kills stragglers once one has failed. The first failure's code, else 0."""
    failed_at = None
    while None in (codes := [child.poll() for child in children]):
        if failed_at is None and any(codes):
            failed_at = time.monotonic()
        if failed_at is not None and time.monotonic() - failed_at > LOCAL_STRAGGLER_SECONDS:
            for child, code in zip(children, codes):
                if code is None:
                    child.kill()
        time.sleep(0.2)
    return next((code for code in codes if code), 0)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv if argv is None else argv
    _parse(argv)
    if "MOEJAX_LOCAL_PROCESSES" in os.environ:
        sys.exit(run_local_processes(_env_int("MOEJAX_LOCAL_PROCESSES", 1), argv[1:]))
    maybe_initialize_distributed()
    import jax

    from moejax.train.loop import Diverged, train
    from moejax.train.preemption import Preempted

    try:
        summary = train(_CONFIG.value, _WORKDIR.value)
    except ConfigError as e:
        _die(f"{e}")
    except Preempted as e:
        sys.stderr.write(f"moejax: {e}; checkpoint saved. Rerun the same command to resume.\n")
        sys.exit(128 + e.signum)
    except Diverged as e:
        sys.stderr.write(f"moejax: {e}\n")
        sys.exit(3)
    if "eval_loss" in summary and jax.process_index() == 0:
        print(
            f"done: step {summary['final_step']}, eval_loss {summary.get('initial_eval_loss', float('nan')):.3f}"
            f" -> {summary['eval_loss']:.3f}, workdir {_WORKDIR.value}"
        )


if __name__ == "__main__":
    main()
