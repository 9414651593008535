"""moejax: Mixture-of-Experts pretraining in JAX, with data-mixture science built in."""

import functools
import os
import subprocess

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
