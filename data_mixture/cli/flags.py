"""What every data_mixture command shares: its name, help texts, and the parsers of flag values.

Each parser turns the text a user typed into a value or raises :class:`UsageError` naming the flag,
the value and the allowed form; none imports more than the standard library and moejax.paths, so a
command parses all its flags before it imports its library (and JAX).

**Paths.** Every flag whose value is a path declares one of the path types (``PATH_TYPES``) as its
argparse ``type``: :func:`path_type`, :func:`named_path_type` (``NAME=PATH``), :func:`input_path_type` (a
``--config``: the user's file, else the repository's), :func:`dataset_path_type` (``builtin`` or a
directory), :func:`json_or_path_type` (JSON text or a file). argparse applies it to the typed value
and to a default, so a relative path means the directory the user ran the command from
(:func:`moejax.paths.user_path`), for every path flag of every command; the parsers are the list
of path flags (``tests/test_dm_path_flags.py`` checks that every flag that reads like a path has
one).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from moejax import paths
from moejax.errors import UserError

PROG = "python -m data_mixture"

TARGET_HELP = ("what the mixture is chosen for, when not the training mix: a validation domain (heldout_qa), a weighted "
               "set (code=0.6,prose=0.4) or a benchmark log-probability (logprob:know_type); docs/mixture/tables.md, 'Targets'")
# What --size means, said the same way by every command that takes one (docs/mixture/commands.md, "Model sizes").
FIT_SIZE_HELP = ("the target model's parameter count in the fit's size column: params_total (every parameter, all "
                 "experts: fit's default --size-column) or params_active (parameters used per token) when the fit was "
                 "made with --size-column params_active; docs/mixture/commands.md, 'Model sizes'")
SIZE_COLUMN_HELP = ("which parameter count is a model's size: params_total (every parameter, all experts; the default) "
                    "or params_active (parameters used per token); docs/mixture/commands.md, 'Model sizes'")
FORCE_HELP = "replace an existing --out (default: refuse it); the new file is renamed into place when complete"


class UsageError(UserError):
    """A bad flag value found by the CLI itself."""


# The path types moejax's commands use too (moejax.paths): a relative path means the user's directory.
path_type = paths.path_type
named_path_type = paths.named_path_type
input_path_type = paths.input_path_type


@paths.path_flag_type
def dataset_path_type(text: str) -> str:
    """``builtin`` (the built-in corpus) or a prepared dataset's directory (resolved as :func:`path_type`)."""
    return text if text == "builtin" else paths.user_path(text)


@paths.path_flag_type
def json_or_path_type(text: str) -> str:
    """JSON text as it is, or the path of a JSON file (resolved as :func:`path_type`)."""
    return text if text.strip()[:1] in "[{" else paths.user_path(text)


PATH_TYPES = (path_type, named_path_type, input_path_type, dataset_path_type, json_or_path_type)


def parse_weights(items: list[str] | None, flag: str) -> dict[str, float]:
    """``['code=0.1', 'math=0.4']`` or ``['code=0.1,math=0.4']`` -> dict; errors name the flag."""
    out: dict[str, float] = {}
    for item in items or []:
        for part in filter(None, (p.strip() for p in item.split(","))):
            name, sep, value = part.partition("=")
            try:
                if not sep or not name:
                    raise ValueError
                number = float(value)
            except ValueError:
                raise UsageError(f"{flag} {part!r}: expected DOMAIN=NUMBER, e.g. {flag} code=0.1") from None
            name = name.strip()
            if name in out and out[name] != number:
                raise UsageError(f"{flag} gives {name!r} twice, as {out[name]:g} and {number:g}; give each "
                                 f"domain once (every {flag} counts, e.g. {flag} code=0.1 {flag} math=0.4).")
            out[name] = number
    return out


def parse_pairs(items: list[str], flag: str) -> list[tuple[str, str]]:
    """``['camel=fit_camel.json']`` -> [("camel", "fit_camel.json")]; errors name the flag."""
    out = []
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name or not value:
            raise UsageError(f"{flag} {item!r}; allowed: NAME=PATH, e.g. {flag} camel=fit_camel.json.")
        out.append((name.strip(), value.strip()))
    return out


def numbers(text: str, flag: str) -> list[float]:
    """``'20,40'`` -> [20.0, 40.0]; errors name the flag."""
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"{flag} {text!r}: expected comma-separated numbers, e.g. {flag} 20,40") from None


def json_arg(text: str, flag: str):
    """JSON text, or the path of a JSON file."""
    try:
        if text.strip()[:1] in "[{":
            return json.loads(text)
        return json.loads(Path(text).read_text())
    except FileNotFoundError:
        raise UsageError(f"{flag}: file {text!r} does not exist.") from None
    except IsADirectoryError:
        raise UsageError(f"{flag}: {text!r} is a directory; give JSON text or the path of a JSON file.") from None
    except ValueError as e:
        where = "" if text.strip()[:1] in "[{" else f" {text}"
        raise UsageError(f"{flag}{where}: not valid JSON: {e}") from None


def target(args: argparse.Namespace):
    """The parsed ``--target`` (None when not given); a TableError naming the part at fault."""
    from data_mixture.target import parse_target

    return parse_target(args.target) if getattr(args, "target", None) else None


def progress(args: argparse.Namespace) -> bool:
    """Progress bars only on a terminal, and not with -q/--no-progress: a pipe or a log file gets
    the messages, not a bar's redraws."""
    return not args.no_progress and getattr(args, "verbosity", 0) >= 0 and sys.stderr.isatty()
