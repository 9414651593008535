"""Commands printed for the user to run: runnable as printed, from the directory they are in.

Every moejax and data_mixture command that prints a command for the user to paste (``optimize``'s
"train with: ...", ``plan``'s "run it with: ...", a sweep's "each run trains as ...",
``hf import``'s next step) builds it here, so that all of them start the same way and all of them
run from any directory:

- **launcher**: from a source checkout (this file's repository has ``launch.sh``), the *absolute*
  path of that ``launch.sh`` (a printed ``./launch.sh`` fails outside the repository root); from an
  installed moejax (no ``launch.sh`` beside the package), the console scripts ``pip`` installs:
  ``moejax train`` for training, ``data-mixture`` for ``python -m data_mixture``, and
  ``python -m MODULE`` (this interpreter, absolute) for any other module;
- **paths**: the caller passes absolute paths for the files the command reads or writes
  (:func:`moejax.paths.user_path` makes them); an experiment file is made absolute when it exists
  where the user is or in the repository (``launch.sh`` would look in both);
- **quoting**: every argument quoted for a POSIX shell where it needs it (``shlex``).

:func:`train_command` and :func:`python_command` are the two entry points; data_mixture's
``data_mixture.sweep.targets.launch_command`` formats a plan's overrides and calls
:func:`train_command`.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
LAUNCH_SCRIPT = REPO_ROOT / "launch.sh"

# Modules with an installed console script (pyproject.toml [project.scripts]), for installs without launch.sh.
CONSOLE_SCRIPTS = {"data_mixture": ["data-mixture"], "moejax.main": ["moejax", "train"],
                   "moejax.eval": ["moejax", "eval"], "moejax.data.prepare": ["moejax", "prepare"]}


def has_launch_script() -> bool:
    """Whether moejax runs from a source checkout with its ``launch.sh`` (else: an installed package)."""
    return LAUNCH_SCRIPT.is_file()


def shell_join(argv: Sequence[str]) -> str:
    """``argv`` as one shell command line, each argument quoted where it needs it."""
    return " ".join(shlex.quote(str(a)) for a in argv)


def experiment_path(config_file: str) -> str:
    """An experiment file as a printed command should name it: absolute when it exists where the
    user is (:func:`moejax.paths.user_path`) or in the repository; else as given (a built-in
    config's name, which ``moejax train NAME`` takes)."""
    from moejax.paths import user_path

    for candidate in (user_path(config_file), str(REPO_ROOT / config_file)):
        if os.path.isfile(candidate):
            return os.path.abspath(candidate)
    return config_file


def train_command(config_file: str, workdir: str | os.PathLike[str], override_args: Sequence[str]) -> str:
    """The training command a user pastes into a shell, runnable as printed from any directory:
    ``/abs/path/launch.sh CONFIG --workdir DIR --config.KEY=VALUE ...`` from a source checkout,
    ``moejax train CONFIG --workdir DIR ...`` from an installed moejax. ``workdir`` and the paths in
    ``override_args`` should be absolute (the module docstring)."""
    launcher = [str(LAUNCH_SCRIPT)] if has_launch_script() else ["moejax", "train"]
    return shell_join([*launcher, experiment_path(config_file), "--workdir", str(workdir), *override_args])


def python_command(module: str, args: Sequence[str]) -> str:
    """``python -m MODULE ARGS`` as a user pastes it, runnable as printed from any directory:
    ``/abs/path/launch.sh python -m MODULE ...`` from a source checkout; from an installed moejax
    the module's console script (``data-mixture ...``) or this interpreter's ``-m``."""
    if has_launch_script():
        launcher = [str(LAUNCH_SCRIPT), "python", "-m", module]
    else:
        launcher = CONSOLE_SCRIPTS.get(module) or [sys.executable, "-m", module]
    return shell_join([*launcher, *args])
