"""Command line: ``python -m data_mixture {collect,fit,predict,evaluate,register,optimize,recommend,plan,sweep,mergemix} ...``.

Every subcommand has ``--help`` with an example; docs/data_mixture.md ("CLI") walks through the
whole pipeline. Bad input (a runs table off the simplex, a query with unknown domains,
infeasible constraints, ...) ends with a one-paragraph message naming the rows/columns/flags at
fault and exit code 2, before any fitting; no traceback. Paths mean what the user typed, an
existing output is refused unless ``--force`` and replaced whole, and both are checked before any
work (:mod:`data_mixture.user_files`); Ctrl-C prints one line saying what was kept and exits 130.

This module only dispatches: each command's arguments and body live in its own module,
``data_mixture/cli/<command>.py`` (the contract, and how to add a command: :mod:`data_mixture.cli`).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import textwrap
from types import ModuleType

from moejax.cli import preload_allocator
from moejax.log import add_verbosity_flags
from moejax.runner import one_line_warnings, run

from data_mixture.cli.flags import PROG

# The commands, in the order --help lists them; each is the module data_mixture/cli/<name>.py.
COMMANDS = ("collect", "fit", "laws", "predict", "evaluate", "register", "optimize", "recommend", "plan", "sweep",
            "mergemix")


def command_module(name: str) -> ModuleType:
    """``data_mixture.cli.<name>``: the command's HELP, EXAMPLE, INTERRUPTED, add_arguments and run."""
    return importlib.import_module(f"data_mixture.cli.{name}")


def build_parser() -> argparse.ArgumentParser:
    modules = {name: command_module(name) for name in COMMANDS}
    parser = argparse.ArgumentParser(prog=PROG, description=(__doc__ or "").split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="examples:\n" + "\n".join(textwrap.indent(m.EXAMPLE, "  ")
                                                                       for m in modules.values()))
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module in modules.items():
        p = sub.add_parser(name, help=module.HELP, description=module.HELP,
                           epilog="example:\n" + textwrap.indent(module.EXAMPLE, "  "),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        add_verbosity_flags(p)
        module.add_arguments(p)
        p.set_defaults(func=module.run)
    return parser


def main(argv: list[str] | None = None, *, command_line: bool = False) -> int:
    """``data-mixture COMMAND ...`` (= ``python -m data_mixture COMMAND ...``): bad input (a
    :class:`moejax.errors.UserError`, which every error kind of data_mixture subclasses, or a
    missing file) ends in one paragraph and exit 2, Ctrl-C in one line and exit 130.
    ``command_line``: this process is the command (not a test or notebook calling it): our own
    warnings print as one line (:func:`moejax.runner.one_line_warnings`)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if command_line:
        one_line_warnings(f"{PROG} {args.command}")
    os.environ.setdefault("MPLBACKEND", "Agg")

    def command() -> None:
        from data_mixture.user_files import check_inputs, check_outputs

        check_inputs(args)  # the paths are the user's already (data_mixture.cli.flags' path types)
        check_outputs(args)
        args.func(args)

    kept = command_module(args.command).INTERRUPTED
    return run(command, prog=f"{PROG} {args.command}", verbosity=args.verbosity,
               interrupted=f"interrupted: {kept}" if kept is not None else None, errors=(FileNotFoundError,))


def console(argv: list[str] | None = None) -> int:
    """The installed ``data-mixture COMMAND [arguments]`` = ``python -m data_mixture``, with mimalloc
    preloaded for the training runs a sweep or MergeMix starts (:func:`moejax.cli.preload_allocator`)."""
    args = sys.argv[1:] if argv is None else list(argv)
    if argv is None and not any(a in ("-h", "--help") for a in args[:1]):
        preload_allocator()
    return main(args, command_line=True)


if __name__ == "__main__":
    main(command_line=True)
