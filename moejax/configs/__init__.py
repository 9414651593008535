"""The built-in experiment configs, shipped inside the package so an installed moejax finds them.

An experiment config is a Python file whose ``get_config()`` returns the run's
``ml_collections.ConfigDict`` (see ``moejax.config.default_config``, where every key is defined
and documented). The three built-in ones live here, as modules of the package, so that
``moejax train tiny_moe`` works wherever moejax is installed, not only from a checkout;
``experiments/<name>.py`` in the repository re-exports each of them, so every path that named
them keeps working (``./launch.sh experiments/tiny_moe.py``, sweep plans, ``from experiments
import tiny_moe``).

Lookup (:func:`find`): a config is a file path if that file exists; otherwise a built-in's name
(``tiny_moe``), with ``.py`` (``tiny_moe.py``) or as its repository path
(``experiments/tiny_moe.py``), means the built-in file here. Anything else is not a built-in.
"""

from __future__ import annotations

import os

BUILTIN = ("tiny_moe", "small_moe", "deepseek_16b")
DEFAULT = "tiny_moe"
_HERE = os.path.dirname(os.path.abspath(__file__))


def path(name: str) -> str:
    """The file of built-in config ``name`` (one of ``BUILTIN``)."""
    if name not in BUILTIN:
        raise KeyError(f"{name!r} is not a built-in config; built-in: {', '.join(BUILTIN)}")
    return os.path.join(_HERE, f"{name}.py")


def builtin_name(spec: str) -> str | None:
    """The built-in config ``spec`` names (``tiny_moe``, ``tiny_moe.py`` or
    ``experiments/tiny_moe.py``), or None."""
    spec = spec.replace(os.sep, "/")
    if spec.startswith("./"):
        spec = spec[2:]
    if spec.startswith("experiments/"):
        spec = spec[len("experiments/"):]
    name = spec[:-3] if spec.endswith(".py") else spec
    return name if name in BUILTIN and "/" not in name else None


def find(spec: str) -> str | None:
    """The built-in config file ``spec`` names (:func:`builtin_name`), or None. The caller looks
    for a file at ``spec`` first: an existing file always wins over a built-in's name."""
    name = builtin_name(spec)
    return path(name) if name else None
