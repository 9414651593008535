"""The user-facing errors of moejax and their helpers; this module imports nothing from moejax.

``UserError``: the base of every error whose message is written for the user (bad input, not a
bug): every command starts through :func:`moejax.runner.run`, which prints one as one paragraph
(``PROG: error: ...``) and exits 2. Each package's own kinds subclass it (``ConfigError`` here,
``InteropError``, ``TaskFileError``, data_mixture's ``TableError``, ...), so a command catches
them all by this one class, and a renamed subclass is still caught.

``ConfigError``: a configuration problem, found before anything is compiled. ``DataError``
subclasses it on purpose: bad data input (a missing path, an empty source, a mixture naming a
domain without data, a tokenizer mismatch, a bad L3 allocation file) is a problem with what the
user asked for too, and the command line prints either as one paragraph (``moejax: error: ...``)
rather than a traceback. Every message names the key, the value or the source, and says how to
fix it.

Every package raises these, so they live below all of them.
"""

from __future__ import annotations

import os
import sys
import types
from typing import Any, NoReturn


class UserError(ValueError):
    """Bad input, found before the work it would spoil; the message names it and says how to fix it."""


class ConfigError(UserError):
    """A configuration problem, found before any compilation; the message says how to fix it."""


class DataError(ConfigError):
    """Bad data input, found before training starts; the message names the source and the fix."""


class RunStopped(RuntimeError):
    """A run that stopped on purpose, with a one-paragraph reason: the command line prints it
    (``moejax: ...``, no traceback) and exits with ``exit_code``."""

    exit_code = 1


def fail_config_key(key: str, value: Any, allowed: str, fix: str = "") -> NoReturn:
    """Raises the ``ConfigError`` of one key: "config key 'KEY' has value VALUE; allowed: ALLOWED."
    followed by ``fix`` (how to fix it) when given."""
    msg = f"config key '{key}' has value {value!r}; allowed: {allowed}."
    if fix:
        msg += f" {fix}"
    raise ConfigError(msg)


def user_stacklevel() -> int:
    """The ``stacklevel`` for ``warnings.warn`` that points at the first caller outside moejax.

    Called from the function that warns; a fixed level would point into whichever moejax module
    happened to call it (and print that library line under the message), not at the user's code.
    """
    package = os.path.dirname(os.path.abspath(__file__))  # this module sits at the package's top
    frame: types.FrameType | None = sys._getframe(1)  # the function that warns is level 1
    level = 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package + os.sep):
        frame, level = frame.f_back, level + 1
    return level
