"""moejax: Mixture-of-Experts pretraining in JAX, with data-mixture science built in."""

import functools
import os
import subprocess

__version__ = "0.1.0"


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
