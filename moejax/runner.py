"""One way to start a command: :func:`run` wraps the body of every command line.

Every console command and ``python -m`` entry (``moejax train|eval|generate|prepare|...``,
``data-mixture ...``) parses its own arguments, then hands its work to :func:`run`, which

- sets up logging at the command's ``-v/-q`` verbosity (:func:`moejax.log.setup_logging`), and
  for commands that only read checkpoints (``quiet_absl``) keeps absl to errors (orbax's notes
  about the items a parameters-only restore skips);
- turns a :class:`moejax.errors.UserError` (bad input: ``ConfigError``, ``DataError`` and every
  package's own kinds subclass it) into one paragraph, ``PROG: error: MESSAGE``, and exit status 2;
- turns Ctrl-C into one line, ``PROG: INTERRUPTED``, saying what was kept, and exit status 130;
- returns 0 when the body succeeds (or the code the body returns), and raises ``SystemExit`` with
  any other code, so ``main(argv)`` works the same from a shell, ``python -m`` and a test.

A command's own extra error kinds (``FileNotFoundError`` for data_mixture's inputs) are passed
as ``errors``: caught by the classes themselves, never looked up by name. Example::

    def main(argv=None):
        args = parser.parse_args(argv)
        return run(lambda: export(args), prog="moejax.data.export", verbosity=args.verbosity,
                   interrupted=f"interrupted; nothing was written to {args.out}. Rerun the command.")

A leaf above :mod:`moejax.errors` and :mod:`moejax.log`: it imports nothing else from moejax.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable

from moejax.errors import UserError
from moejax.log import setup_logging


def message(error: BaseException) -> str:
    """The one-paragraph text of a user error (a missing file says which)."""
    if isinstance(error, FileNotFoundError):
        return f"file not found: {error.filename or error}"
    return str(error)


def run(body: Callable[[], int | None], *, prog: str, verbosity: int = 0, interrupted: str | None = None,
        errors: tuple[type[BaseException], ...] = (), quiet_absl: bool = False) -> int:
    """Runs a command's ``body``; 0 when it succeeds, else ``SystemExit`` with its exit status.

    ``prog``: how the command names itself in its messages (``moejax``, ``prepare``,
    ``python -m data_mixture fit``). ``interrupted``: the line after ``PROG: `` on Ctrl-C, saying
    what was kept and what to do (None: Ctrl-C is not this command's to handle, it propagates).
    ``errors``: error kinds besides :class:`UserError` that mean bad input for this command.
    ``quiet_absl``: absl's messages below ERROR hidden (orbax's notes on a partial restore).
    """
    setup_logging(verbosity)
    if quiet_absl:
        from absl import logging as absl_logging

        absl_logging.set_verbosity(absl_logging.ERROR)
    try:
        code = body() or 0
    except (UserError, *errors) as e:
        sys.stderr.write(f"{prog}: error: {message(e)}\n")
        code = 2
    except KeyboardInterrupt:
        if interrupted is None:
            raise
        sys.stderr.write(f"{prog}: {interrupted}\n")
        code = 130
    if code:
        sys.exit(code)
    return 0


def one_line_warnings(prog: str, packages: tuple[str, ...] = ("moejax", "data_mixture")) -> None:
    """On the command line: warnings of the ``packages``' own kinds (about the user's input: a size
    the fit never saw, a small held-out split) as one line, ``PROG: warning: MESSAGE``, without
    Python's file, line number and library source line; other warnings as Python shows them. Only
    for a command's own process (its ``__main__``): tests and notebooks keep Python's machinery
    (``pytest.warns``, ``catch_warnings(record=True)``)."""
    previous = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if getattr(category, "__module__", "").split(".")[0] in packages:
            (file or sys.stderr).write(f"{prog}: warning: {message}\n")
        else:
            previous(message, category, filename, lineno, file, line)

    warnings.showwarning = show
