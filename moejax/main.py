"""Command-line entry point: ``python -m moejax.main --config FILE --workdir DIR [--config.key=value]``.

``launch.sh`` wraps this. Every mistake on the command line (unknown options, misspelled keys at
any depth, values of the wrong type, unknown mixture domains, JSON text that does not parse,
conflicting values) ends with a one-paragraph ``moejax: error: ...`` naming the key and the fix,
exit status 2 and no traceback, before anything is compiled. The config itself comes from
:func:`moejax.config.load` (the library call: it raises ``ConfigError`` and never exits); this
module reads the command line's own options, resolves paths as the user typed them, and exits.
A mixture's keys are the dataset's domains: ``--config.data.mixture.DOMAIN=W`` per domain, or
``--config.data.mixture='{"DOMAIN": W, ...}'``.

Paths: ``--config``, ``--workdir`` and the path config keys (``config.PATH_KEYS``) set here mean
what the user typed: ``~`` expanded, relative to the directory launch.sh was run from
(``moejax/paths.py``). Ctrl-C during training saves a checkpoint and exits 130 (the loop's
preemption guard); before the loop starts it exits 130 with one line saying nothing was saved.

Multi-host (docs/multihost.md): the same command on every host, with the coordinator in the
environment; ``MOEJAX_LOCAL_PROCESSES=N`` runs N such processes on this machine instead.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import os
import re
import signal
import socket
import subprocess
import sys
import time
import warnings
from typing import Any, NoReturn


from moejax import config as config_lib
from moejax import configs as builtin_configs
from moejax import paths
from moejax.errors import ConfigError
from moejax.log import setup_logging
from moejax.runner import run

USAGE = (
    "usage: python -m moejax.main --config FILE --workdir DIR [--config.KEY=VALUE ...] "
    "(or ./launch.sh [FILE] [--workdir DIR] [--config.KEY=VALUE ...], or, installed, moejax train [FILE|NAME] "
    "[--workdir DIR] [--config.KEY=VALUE ...]). Every KEY and its meaning is in "
    "moejax/config.py; data.mixture takes one --config.data.mixture.DOMAIN=WEIGHT per domain or JSON "
    "text, --config.data.mixture='{\"code\": 0.5, \"math\": 0.5}'. -q/--quiet shows only warnings and errors "
    "(and the final line), -v/--verbose debug messages too."
)
# A config override: --config.a.b=v, --config.a.b v, --noconfig.a.b (absl's false for booleans).
_OVERRIDE = re.compile(r"^--?(no)?config\.([^=]*)(=.*)?$", re.DOTALL)


def _die(message: str) -> NoReturn:
    sys.stderr.write(f"moejax: error: {message}\n")
    sys.exit(2)


@dataclasses.dataclass(frozen=True)
class CommandLine:
    """What the command line asks for: the config (overrides applied), the workdir, the keys it set."""

    config: config_lib.ConfigDict
    workdir: str
    changed: tuple[str, ...]  # config keys set by --config.* overrides, e.g. "model.num_heads"
    verbosity: int = 0  # -1 --quiet, 1 --verbose (moejax.log.setup_logging)


def _split_overrides(args: list[str]) -> tuple[list[str], list[str]]:
    """(the command line's own arguments, the config overrides, each as ``--config.KEY[=VALUE]``).

    An override's value may follow as the next argument (``--config.optim.lr 0.1``), except for
    a switch (a key whose default is True or False: ``--config.train.scan_layers``) and for a key
    that is not known (reported by ``config.load``).
    """
    reference = config_lib.default_config()
    rest, overrides = [], []
    i = 0
    while i < len(args):
        match = _OVERRIDE.match(args[i])
        if not match:
            rest.append(args[i])
        elif match.group(3) is not None or match.group(1) or i + 1 >= len(args):
            overrides.append(args[i])
        else:
            try:
                switch = isinstance(config_lib.get_path(reference, match.group(2)), bool)
            except KeyError:
                switch = not match.group(2).startswith(config_lib.MIXTURE_KEY)
            if switch:
                overrides.append(args[i])
            else:
                overrides.append(f"{args[i]}={args[i + 1]}")
                i += 1
        i += 1
    return rest, overrides


def _config_file(args: list[str]) -> str | None:
    """The --config FILE[:ARG] of ``args``, with FILE resolved as the user meant it (``args`` is
    rewritten to hold the resolved name)."""
    for i, arg in enumerate(args):
        if arg.startswith("--config=") or (arg == "--config" and i + 1 < len(args)):
            index, value = (i, arg.split("=", 1)[1]) if arg.startswith("--config=") else (i + 1, args[i + 1])
            name, sep, rest = value.partition(":")
            found = paths.user_input_path(name)
            if not os.path.isfile(found):  # a built-in's name: tiny_moe, experiments/tiny_moe.py
                found = builtin_configs.find(name) or found
            value = found + sep + rest
            args[index] = f"--config={value}" if index == i else value
            return value
    return None


def _resolve_config_paths(cfg: config_lib.ConfigDict, changed: tuple[str, ...]) -> None:
    """'~' expanded in every path knob; the ones the command line set resolved against the
    directory the user ran it from (a path in the experiment file keeps its meaning there)."""
    for key in config_lib.PATH_KEYS:
        value = config_lib.get_path(cfg, key)
        if not value or (key == "data.schedule" and value.strip()[:1] in "[{"):
            continue
        value = paths.user_path(value) if key in changed else os.path.expanduser(value)
        section, _, name = key.rpartition(".")
        config_lib.get_path(cfg, section)[name] = value


class _OptionParser(argparse.ArgumentParser):
    """The command line's own options; a mistake is one paragraph (``_die``), not argparse's two lines."""

    def error(self, message: str) -> NoReturn:
        missing = re.match(r"argument (--\w+): expected one argument", message)
        _die(f"{f'Missing value for flag {missing.group(1)}' if missing else message}. {USAGE}")


def _own_options() -> argparse.ArgumentParser:
    parser = _OptionParser(prog="python -m moejax.main", add_help=False, allow_abbrev=False)
    parser.add_argument("--config", help="experiment file with get_config(), or a built-in config's name")
    parser.add_argument("--workdir", type=paths.path_type, help="directory for metrics, checkpoints and config.json")
    parser.add_argument("-v", "--verbose", action="store_true", help="also show debug messages")
    parser.add_argument("-q", "--quiet", action="store_true", help="show only warnings and errors")
    parser.add_argument("--noverbose", dest="verbose", action="store_false", help=argparse.SUPPRESS)
    parser.add_argument("--noquiet", dest="quiet", action="store_false", help=argparse.SUPPRESS)
    return parser


def _unknown_option(arg: str) -> str:
    name = arg.lstrip("-").split("=", 1)[0]
    near = difflib.get_close_matches(name, ["config", "workdir", "help", "verbose", "quiet"], n=1)
    hint = f" Did you mean --{near[0]}?" if near else ""
    return f"unknown option --{name}.{hint} {USAGE}"


def parse_command_line(argv: list[str]) -> CommandLine:
    """The config and workdir ``argv`` asks for; every mistake ends in ``_die`` (exit 2, one paragraph).

    A thin wrapper over :func:`moejax.config.load` (which raises ``ConfigError`` and never exits):
    this reads the command line's own options (``--config``, ``--workdir``, ``-v/-q``, with
    argparse like every other command), resolves paths as the user typed them, and exits on a
    mistake.
    """
    args = list(argv[1:])
    if any(arg in ("-h", "--help", "--helpfull", "-help") for arg in args):
        print(USAGE)
        sys.exit(0)
    args, overrides = _split_overrides(args)
    config_file = _config_file(args)
    own, rest = _own_options().parse_known_args(args)
    unknown = [arg for arg in rest if arg.startswith("-") and arg != "-"]
    if unknown:
        _die(_unknown_option(unknown[0]))
    positional = rest
    try:
        cfg, changed = config_lib.load(config_file or "", overrides) if config_file else (None, ())
    except ConfigError as e:
        _die(f"{e}")
    if config_file is None:
        _die(f"--config FILE is required, e.g. --config experiments/configs/tiny_moe.py. {USAGE}")
    if positional:
        _die(f"unexpected argument {positional[0]!r}. {USAGE}")
    if own.workdir is None:
        _die("--workdir is required, e.g. --workdir runs/tiny.")
    if own.verbose and own.quiet:
        _die("--verbose and --quiet ask for opposite things; give one of them.")
    _resolve_config_paths(cfg, changed)
    return CommandLine(cfg, own.workdir, changed, int(own.verbose) - int(own.quiet))


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
    kwargs: dict[str, Any] = {}
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
        caller_cwd = paths.caller_cwd()
        if caller_cwd:  # the children resolve the user's relative paths as this process did
            env[paths.CALLER_CWD_ENV] = caller_cwd
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


def _show_warning(message, category, filename, lineno, file=None, line=None, _default=warnings.showwarning):
    """moejax's own warnings (MixtureWarning, HeldoutWarning, ...) as one line, without a source line:
    on the command line they are about the user's input, not about a line of library code."""
    if getattr(category, "__module__", "").startswith("moejax"):
        (file or sys.stderr).write(f"moejax: warning: {message}\n")
    else:
        _default(message, category, filename, lineno, file, line)


def summary_line(summary: dict, workdir: str) -> str:
    """The last line of a run: its steps and its first and last held-out losses, with their steps.

    After a resume the first evaluation (step 0) happened in an earlier process; the loop reads it
    back from metrics.jsonl, so the line is the whole run's, not this process's part of it.
    """
    parts = [f"done: step {summary['final_step']}"]
    if summary.get("resumed_from") is not None:
        parts[0] += f" (resumed from step {summary['resumed_from']})"
    first, last = summary.get("first_eval"), summary.get("last_eval")
    if first and last:
        parts.append(f"eval_loss {first[1]:.3f} at step {first[0]} -> {last[1]:.3f} at step {last[0]}")
    elif last:
        parts.append(f"eval_loss {last[1]:.3f} at step {last[0]}")
    return ", ".join(parts + [f"workdir {workdir}"])


def summary_problem(summary: dict) -> str | None:
    """Why a finished run's summary is not a result (a held-out loss that is not finite), or None."""
    import math

    bad = [f"{what} evaluation (step {pair[0]}) is {pair[1]}" for what, pair in
           (("first", summary.get("first_eval")), ("last", summary.get("last_eval")))
           if pair and not math.isfinite(pair[1])]
    if not bad:
        return None
    return (f"the run reached step {summary['final_step']}, but its held-out loss is not finite: {'; '.join(bad)}. "
            "This is not a result: check the data (moejax.data.verify_dataset(path)) and metrics.jsonl.")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv if argv is None else argv
    command = parse_command_line(argv)
    if "MOEJAX_LOCAL_PROCESSES" in os.environ:
        setup_logging(command.verbosity)
        sys.exit(run_local_processes(_env_int("MOEJAX_LOCAL_PROCESSES", 1), argv[1:]))
    # Ctrl-C before the loop took it over (the loop saves, then raises Preempted): nothing was saved.
    return run(lambda: _train(command), prog="moejax", verbosity=command.verbosity,
               interrupted=f"interrupted before training started; nothing new was saved in {command.workdir}. "
                           "Rerun the same command to start (or resume).")


def _train(command: CommandLine) -> int:
    """Trains what the command line asks for; the exit status (0, 3 diverged or a non-finite held-out loss, 74 a
    failed save, 128 + signal preempted)."""
    maybe_initialize_distributed()
    import jax

    from moejax.errors import RunStopped
    from moejax.train.loop import train
    from moejax.train.precompile import use_persistent_cache
    from moejax.train.preemption import Preempted

    use_persistent_cache()  # a rerun, a resume or the next sweep run reads the compiled steps back

    try:  # ``changed``: a conflict between two keys is reported against the one the user set
        summary = train(command.config, command.workdir, changed=command.changed)
    except Preempted as e:
        sys.stderr.write(f"moejax: {e}; checkpoint saved. Rerun the same command to resume.\n")
        return 128 + e.signum
    except RunStopped as e:  # diverged (3), a failed save (74): one paragraph
        sys.stderr.write(f"moejax: {e}\n")
        return e.exit_code
    if jax.process_index() == 0:
        problem = summary_problem(summary)
        if problem:
            sys.stderr.write(f"moejax: error: {problem}\n")
            return 3
        print(summary_line(summary, command.workdir))
    return 0


if __name__ == "__main__":
    from moejax.allocator import reexec_with_mimalloc

    reexec_with_mimalloc("moejax")  # mimalloc, as launch.sh and `moejax train` start training
    warnings.showwarning = _show_warning
    main()
