"""Command-line entry point: ``python -m moejax.main --config FILE --workdir DIR [--config.key=value]``.

``launch.sh`` wraps this. Every mistake on the command line (unknown options, misspelled keys at
any depth, values of the wrong type, unknown mixture domains, JSON text that does not parse,
conflicting values) ends with a one-paragraph ``moejax: error: ...`` naming the key and the fix,
exit status 2 and no traceback, before anything is compiled. Override paths are checked here
against ``config.default_config()`` (ml_collections' own errors are tracebacks), absl parses the
values, and the ``data.mixture`` overrides are taken out and applied by
``config.apply_mixture_overrides``, because a mixture's keys are the dataset's domains, which the
config cannot know in advance: ``--config.data.mixture.DOMAIN=W`` per domain, or
``--config.data.mixture='{"DOMAIN": W, ...}'``.

Paths: ``--config``, ``--workdir`` and the path config keys (``config.PATH_KEYS``) set here mean
what the user typed: ``~`` expanded, relative to the directory launch.sh was run from
(``moejax/paths.py``). Ctrl-C during training saves a checkpoint and exits 130 (the loop's
preemption guard); before the loop starts it exits 130 with one line saying nothing was saved.

Multi-host (docs/multihost.md): the same command on every host, with the coordinator in the
environment; ``MOEJAX_LOCAL_PROCESSES=N`` runs N such processes on this machine instead.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import warnings
from typing import Any, NoReturn

from absl import flags
from ml_collections import config_flags
from ml_collections.config_flags import config_flags as _config_flags_module

from moejax import config as config_lib
from moejax import configs as builtin_configs
from moejax import paths
from moejax.errors import ConfigError
from moejax.log import setup_logging

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
_MIXTURE = "data.mixture"
# ml_collections loads every experiment file as the one module "config_config" (below): one load at a time.
_CONFIG_LOAD_LOCK = threading.Lock()


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


def _split_mixture(args: list[str]) -> tuple[list[str], list[tuple[str | None, str]]]:
    """Takes the data.mixture overrides out of ``args``: (the rest, [(domain or None, text)]).

    ml_collections can only override keys the config already has, and a mixture's keys are the
    dataset's domains, so these are applied here (``config.apply_mixture_overrides``).
    """
    rest, mixture = [], []
    i = 0
    while i < len(args):
        match = _OVERRIDE.match(args[i])
        path = match.group(2) if match else ""
        if match and (path == _MIXTURE or path.startswith(_MIXTURE + ".")):
            domain = path[len(_MIXTURE) + 1:] or None
            if match.group(1):
                _die(f"{args[i]}: data.mixture{'.' + domain if domain else ''} is not a switch; give a "
                     f"weight, e.g. --config.data.mixture.{domain or 'code'}=0.5.")
            if match.group(3) is not None:
                text = match.group(3)[1:]
            elif i + 1 < len(args):
                i, text = i + 1, args[i + 1]
            else:
                _die(f"{args[i]} needs a value, e.g. {args[i]}=" + ("0.5" if domain else "'{\"code\": 1}'") + ".")
            mixture.append((domain, text))
        else:
            rest.append(args[i])
        i += 1
    return rest, mixture


def _check_override_paths(args: list[str]) -> list[str]:
    """The config keys the overrides name, each checked against the defaults at every depth."""
    reference = config_lib.default_config()
    paths = []
    for arg in args:
        match = _OVERRIDE.match(arg)
        if not match:
            continue
        path = match.group(2)
        problem = config_lib.describe_unknown_key(reference, path)
        if problem:
            _die(f"{arg}: {problem}.")
        paths.append(path)
    return paths


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


def _resolve_config_paths(cfg: config_lib.ConfigDict, changed: list[str]) -> None:
    """'~' expanded in every path knob; the ones the command line set resolved against the
    directory the user ran it from (a path in the experiment file keeps its meaning there)."""
    for key in config_lib.PATH_KEYS:
        value = config_lib.get_path(cfg, key)
        if not value or (key == "data.schedule" and value.strip()[:1] in "[{"):
            continue
        value = paths.user_path(value) if key in changed else os.path.expanduser(value)
        section, _, name = key.rpartition(".")
        config_lib.get_path(cfg, section)[name] = value


def _describe_flag_error(error: flags.Error, reference: config_lib.ConfigDict, args: list[str]) -> str:
    """A one-paragraph message for absl's parse errors (bad override values, unknown options)."""
    text = str(error)
    if "Error whilst parsing config file" in text:  # the experiment file raised while loading
        given = re.match(r"flag --config=(.*?): Error whilst", text, re.DOTALL)
        return _describe_config_file_error(text[text.index("Error whilst"):], given.group(1) if given else "")
    if isinstance(error, _config_flags_module.FlagOrderError):
        return f"{text.rstrip('.')}. Put --config FILE first, then the --config.KEY=VALUE overrides, each key once."
    if isinstance(error, flags.UnrecognizedFlagError):
        name = getattr(error, "flagname", "") or text
        near = difflib.get_close_matches(name, ["config", "workdir", "help", "verbose", "quiet"], n=1)
        hint = f" Did you mean --{near[0]}?" if near else ""
        return f"unknown option --{name}.{hint} {USAGE}"
    match = re.match(r"flag --config\.([A-Za-z0-9_.]+)", text)
    if match:
        path = match.group(1)
        try:
            default = config_lib.get_path(reference, path)
        except KeyError:
            default = None
        if default is not None:
            typed = [arg.split("=", 1)[1] for arg in args if arg.startswith(f"--config.{path}=")]
            value = f"={typed[-1]}" if typed else ""
            return f"flag --config.{path}{value}: {config_lib.describe_expected(path, default)}"
    return f"{text}. {USAGE}"


def _describe_config_file_error(text: str, config_file: str) -> str:
    """ml_collections wraps an error raised while loading the experiment file with its whole
    traceback; one paragraph keeps the error and the innermost place it was raised."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines or "Error whilst parsing config file" not in lines[0]:
        return text
    places = [line for line in lines if line.startswith("File ") and "site-packages" not in line]
    where = f" ({places[-1]})" if places else ""
    return (f"config file {config_file!r} could not be loaded: {lines[-1]}{where}. Fix the file's "
            "get_config(), or the ':argument' after the file name if you gave one.")


def parse_command_line(argv: list[str]) -> CommandLine:
    """The config and workdir ``argv`` asks for; every mistake ends in ``_die`` (exit 2, one paragraph).

    A fresh ``FlagValues`` per call (not absl's global ``FLAGS``), so the function can be called
    more than once in a process (the tests do), from several threads at once (the sweep's runners).
    """
    args = list(argv[1:])
    if any(arg in ("-h", "--help", "--helpfull", "-help") for arg in args):
        print(USAGE)
        sys.exit(0)
    args, mixture = _split_mixture(args)
    changed = _check_override_paths(args)
    config_file = _config_file(args)
    if config_file is None:
        _die(f"--config FILE is required, e.g. --config experiments/configs/tiny_moe.py. {USAGE}")
    if not os.path.isfile(config_file.split(":", 1)[0]):
        _die(f"config file {config_file!r} not found{paths.relative_to_note(config_file)}; give the path "
             "of an experiment file, e.g. experiments/configs/tiny_moe.py, or the name of a built-in config: "
             f"{', '.join(builtin_configs.BUILTIN)}.")
    values = flags.FlagValues()
    argv = [argv[0], *args]
    config = config_flags.DEFINE_config_file(
        "config", None, "Experiment file with get_config().", flag_values=values, sys_argv=argv)
    workdir = flags.DEFINE_string("workdir", None, "Directory for metrics, checkpoints and config.json.",
                                  flag_values=values)
    verbose = flags.DEFINE_boolean("verbose", False, "Also show debug messages.", short_name="v", flag_values=values)
    quiet = flags.DEFINE_boolean("quiet", False, "Show only warnings and errors.", short_name="q", flag_values=values)
    try:
        with _CONFIG_LOAD_LOCK:
            # ml_collections loads the file as module "config_config" with the deprecated load_module(),
            # which executes it into the module object a previous call left in sys.modules: a file that
            # defines no get_config() would then return the previous file's config.
            sys.modules.pop("config_config", None)
            positional = values(argv)[1:]
    except flags.Error as e:  # a bad override value, an unknown option, overrides in a bad order
        _die(_describe_flag_error(e, config_lib.default_config(), args))
    except (TypeError, ValueError) as e:  # a broken experiment file (the message holds its traceback)
        _die(_describe_config_file_error(str(e), config_file))
    except (AttributeError, SyntaxError, ImportError, NameError) as e:  # not an experiment file at all
        _die(f"config file {config_file!r} could not be loaded: {type(e).__name__}: {e}. An experiment file is "
             "a Python file whose get_config() returns the config, e.g. experiments/configs/tiny_moe.py.")
    if positional:
        _die(f"unexpected argument {positional[0]!r}. {USAGE}")
    if workdir.value is None:
        _die("--workdir is required, e.g. --workdir runs/tiny.")
    if verbose.value and quiet.value:
        _die("--verbose and --quiet ask for opposite things; give one of them.")
    cfg = config.value
    try:
        cfg = config_lib.apply_mixture_overrides(cfg, mixture)
    except ConfigError as e:
        _die(f"{e}")
    _resolve_config_paths(cfg, changed)
    changed += [_MIXTURE + (f".{domain}" if domain else "") for domain, _ in mixture]
    return CommandLine(cfg, paths.user_path(workdir.value), tuple(changed), int(verbose.value) - int(quiet.value))


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


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv if argv is None else argv
    command = parse_command_line(argv)
    setup_logging(command.verbosity)
    if "MOEJAX_LOCAL_PROCESSES" in os.environ:
        sys.exit(run_local_processes(_env_int("MOEJAX_LOCAL_PROCESSES", 1), argv[1:]))
    maybe_initialize_distributed()
    import jax

    from moejax.errors import RunStopped
    from moejax.train.loop import train
    from moejax.train.precompile import use_persistent_cache
    from moejax.train.preemption import Preempted

    use_persistent_cache()  # a rerun, a resume or the next sweep run reads the compiled steps back

    try:  # ``changed``: a conflict between two keys is reported against the one the user set
        summary = train(command.config, command.workdir, changed=command.changed)
    except ConfigError as e:
        _die(f"{e}")
    except KeyboardInterrupt:  # before the loop took over Ctrl-C (it saves, then raises Preempted)
        sys.stderr.write(f"moejax: interrupted before training started; nothing new was saved in "
                         f"{command.workdir}. Rerun the same command to start (or resume).\n")
        sys.exit(130)
    except Preempted as e:
        sys.stderr.write(f"moejax: {e}; checkpoint saved. Rerun the same command to resume.\n")
        sys.exit(128 + e.signum)
    except RunStopped as e:  # diverged (3), a failed save (74): one paragraph
        sys.stderr.write(f"moejax: {e}\n")
        sys.exit(e.exit_code)
    if jax.process_index() == 0:
        print(summary_line(summary, command.workdir))


if __name__ == "__main__":
    warnings.showwarning = _show_warning
    main()
