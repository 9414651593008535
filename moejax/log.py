"""How moejax reports: library code logs, a command line decides how much of it to show.

Library modules report through ``logging.getLogger(__name__)`` (the ``moejax`` and
``data_mixture`` loggers and their children); progress bars stay tqdm bars, and what a command
exists to print (its result, a table, the path it wrote) stays on stdout. Every command line adds
:func:`add_verbosity_flags` to its parser and calls :func:`setup_logging` once:

- by default INFO and up, each message as its plain text;
- ``-q/--quiet``: warnings and errors only;
- ``-v/--verbose``: debug messages too.

Messages below WARNING go to stdout and warnings and errors to stderr, where the commands printed
them before they logged. Each is written with ``tqdm.write``, so it does not tear a progress bar,
to the stream ``sys.stdout``/``sys.stderr`` is at that moment (a redirected one, pytest's capture
or a notebook's, gets it). In a notebook or script, ``setup_logging()`` shows what the commands
show; without it only warnings reach the console (Python's default), unless you configure the
loggers yourself.

A leaf module: it imports nothing from moejax.
"""

from __future__ import annotations

import argparse
import logging
import sys

import tqdm

LOGGERS = ("moejax", "data_mixture")
LEVELS = {-1: logging.WARNING, 0: logging.INFO, 1: logging.DEBUG}  # verbosity -> level


class ConsoleHandler(logging.Handler):
    """INFO and below to stdout, WARNING and above to stderr, written around tqdm's bars."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter("%(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        stream = sys.stderr if record.levelno >= logging.WARNING else sys.stdout
        if stream is None:  # no console (pythonw)
            return
        try:
            tqdm.tqdm.write(self.format(record), file=stream)
            stream.flush()
        except Exception:  # noqa: BLE001 - logging's rule: a message that fails never stops the program
            self.handleError(record)


def setup_logging(verbosity: int = 0) -> None:
    """Shows the ``moejax`` and ``data_mixture`` loggers on the console: ``verbosity`` -1
    (``--quiet``) warnings and errors, 0 INFO and up, 1 (``--verbose``) DEBUG too. A second call
    replaces the first."""
    level = LEVELS[max(-1, min(1, verbosity))]
    for name in LOGGERS:
        logger = logging.getLogger(name)
        for handler in [h for h in logger.handlers if isinstance(h, ConsoleHandler)]:
            logger.removeHandler(handler)
        logger.addHandler(ConsoleHandler())
        logger.setLevel(level)
        logger.propagate = False  # shown once, whatever handlers the root logger has


def add_verbosity_flags(parser: argparse.ArgumentParser) -> None:
    """``-v/--verbose`` and ``-q/--quiet`` (one or the other): ``args.verbosity`` 1 or -1, else 0."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("-v", "--verbose", dest="verbosity", action="store_const", const=1, default=0,
                       help="also show debug messages")
    group.add_argument("-q", "--quiet", dest="verbosity", action="store_const", const=-1,
                       help="show only warnings and errors (no progress messages)")
