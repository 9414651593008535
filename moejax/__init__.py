"""moejax: Mixture-of-Experts pretraining in JAX, with data-mixture science built in."""

import functools
import importlib
import os
import subprocess
from typing import Any

__version__ = "0.1.0"

# The directory the user ran launch.sh from (launch.sh runs every command from the repository).
# Taken out of the environment at the first import, so that processes a moejax command starts do
# not resolve their own paths against it; moejax.paths.user_path uses it.
CALLER_CWD_ENV = "MOEJAX_CALLER_CWD"
CALLER_CWD = os.environ.pop(CALLER_CWD_ENV, None)


@functools.cache
def code_version() -> str:
    """The package version plus the git commit of the checkout, when there is one."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=os.path.dirname(__file__),
            capture_output=True, text=True, timeout=5, check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return __version__
    return f"{__version__}+g{commit}"


def __getattr__(name: str) -> Any:
    """``moejax.load`` (:func:`moejax.trained.load`: a checkpoint as a Python object), imported on
    first use, as ``moejax.data`` exports its names: ``import moejax`` stays free of JAX."""
    if name == "load":
        return importlib.import_module("moejax.trained").load
    raise AttributeError(f"module 'moejax' has no attribute {name!r}")
