"""The one exception type of the data package.

``DataError`` subclasses ``moejax.config.ConfigError`` on purpose: bad data input (a missing
path, an empty source, a mixture naming a domain without data, a tokenizer mismatch) is a
problem with what the user asked for, found before anything is compiled, and the command line
prints it as one paragraph (``moejax: error: ...``) rather than a traceback. Every message names
the source (a path, a config key or a domain) and says how to fix it.
"""

from __future__ import annotations

from moejax.config import ConfigError


class DataError(ConfigError):
    """Bad data input, found before training starts; the message names the source and the fix."""


def user_stacklevel() -> int:
    """The ``stacklevel`` for ``warnings.warn`` that points at the first caller outside moejax.

    Called from the function that warns; a fixed level would point into whichever moejax module
    happened to call it (and print that library line under the message), not at the user's code.
    """
    import os
    import sys

    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    frame, level = sys._getframe(1), 1  # the function that warns is level 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package + os.sep):
        frame, level = frame.f_back, level + 1
    return level
