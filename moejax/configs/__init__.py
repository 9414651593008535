"""The built-in experiment configs, shipped inside the package so an installed moejax finds them.

An experiment config is a Python file whose ``get_config()`` returns the run's
``ml_collections.ConfigDict`` (see ``moejax.config.default_config``, where every key is defined
and documented). The three built-in ones live here, as modules of the package, so that
``moejax train tiny_moe`` works wherever moejax is installed, not only from a checkout;
``experiments/configs/<name>.py`` in the repository re-exports each of them
(``./launch.sh experiments/configs/tiny_moe.py``, ``from experiments.configs import tiny_moe``).

Lookup (:func:`find`): a config is a file path if that file exists; otherwise a built-in's name
(``tiny_moe``), with ``.py`` (``tiny_moe.py``) or as its repository path
(``experiments/configs/tiny_moe.py``), means the built-in file here. So does the repository path
the configs had before they moved to ``experiments/configs/`` (``experiments/tiny_moe.py``, which
older sweep plans and commands name): :func:`find` then prints a one-line note naming the new
path. Anything else is not a built-in.
"""

from __future__ import annotations

import os
import sys

BUILTIN = ("tiny_moe", "small_moe", "deepseek_16b")
DEFAULT = "tiny_moe"
REPO_DIR = "experiments/configs"  # the built-ins' re-exports in the repository
OLD_REPO_DIR = "experiments"  # where those lived before; still accepted, with a note
_HERE = os.path.dirname(os.path.abspath(__file__))
_noted: set[str] = set()  # old paths already noted in this process


def path(name: str) -> str:
    """The file of built-in config ``name`` (one of ``BUILTIN``)."""
    if name not in BUILTIN:
        raise KeyError(f"{name!r} is not a built-in config; built-in: {', '.join(BUILTIN)}")
    return os.path.join(_HERE, f"{name}.py")


def _normalised(spec: str) -> str:
    spec = spec.replace(os.sep, "/")
    return spec[2:] if spec.startswith("./") else spec


def builtin_name(spec: str) -> str | None:
    """The built-in config ``spec`` names (``tiny_moe``, ``tiny_moe.py``,
    ``experiments/configs/tiny_moe.py`` or the old ``experiments/tiny_moe.py``), or None."""
    spec = _normalised(spec)
    for prefix in (REPO_DIR + "/", OLD_REPO_DIR + "/"):
        if spec.startswith(prefix):
            spec = spec[len(prefix):]
            break
    name = spec[:-3] if spec.endswith(".py") else spec
    return name if name in BUILTIN and "/" not in name else None


def repo_path(spec: str) -> str:
    """``spec`` with a built-in's old repository path (``experiments/tiny_moe.py``) replaced by
    its current one (``experiments/configs/tiny_moe.py``); any other ``spec`` unchanged."""
    name = builtin_name(spec)
    if name and _normalised(spec) == f"{OLD_REPO_DIR}/{name}.py":
        return f"{REPO_DIR}/{name}.py"
    return spec


def find(spec: str) -> str | None:
    """The built-in config file ``spec`` names (:func:`builtin_name`), or None. The caller looks
    for a file at ``spec`` first: an existing file always wins over a built-in's name. A
    built-in's old repository path is found too, with a one-line note on stderr (once per path
    and process) naming the current one."""
    name = builtin_name(spec)
    if name and repo_path(spec) != spec and spec not in _noted:
        _noted.add(spec)
        print(f"note: {spec} is now {repo_path(spec)} (the old path still works)", file=sys.stderr)
    return path(name) if name else None


_INIT_FROM_WORKDIR = '''
import json
import os

from moejax.config import from_dict

HERE = os.path.dirname(os.path.abspath(__file__))


def get_config():
    with open(os.path.join(HERE, "config.json")) as f:
        cfg = from_dict(json.load(f))
    cfg.checkpoint.init_from = HERE
    return cfg
'''


def init_from_workdir_source(doc: str) -> str:
    """The source of a workdir's ``experiment.py``: the workdir's ``config.json`` with
    ``checkpoint.init_from`` set to the workdir (a new run from its parameters, fresh optimizer);
    ``doc`` is its docstring."""
    return f'"""{doc}\n"""\n' + _INIT_FROM_WORKDIR
