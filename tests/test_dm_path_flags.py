"""Every path flag of every data_mixture command means what the user typed: relative to the
directory they ran the command from. The list of path flags is the parsers' own (their path
types, ``data_mixture.cli.flags``), not a hand-kept list; this checks that every flag that reads
like a path is declared one, and that each resolves against the caller's directory."""

from __future__ import annotations

import re

import pytest

import moejax
from data_mixture.__main__ import COMMANDS, build_parser
from data_mixture.cli import flags

# Words that mark a flag whose value is a path (its help, metavar or name).
PATH_LIKE = re.compile(r"\b(files?|director(y|ies)|dir|csv|json|jsonl|workdirs?|root|cache)\b", re.IGNORECASE)
# Flags whose help reads like a path but whose value is not one, and why.
NOT_PATHS = {
    "--target": "a target expression (its help names the docs page that describes it)",
    "--eval-args": "moejax.eval flags for the collected runs",
    "--expert-eval-args": "moejax.eval flags for the experts",
    "--holdout": "a holdout rule",
    "--tokens": "'all' or 'last'",
    "--baselines": "names of baselines",
    "--validation-only": "column names",
}


def _commands():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return [(name, sub.choices[name]) for name in COMMANDS]


def _flag(action) -> str:
    return action.option_strings[-1] if action.option_strings else action.dest


def test_every_path_like_flag_of_every_command_is_declared_a_path():
    undeclared = []
    for name, parser in _commands():
        for action in parser._actions:
            text = " ".join(str(x) for x in (action.help, action.metavar, action.dest.replace("_", " ")) if x)
            if PATH_LIKE.search(text) and action.type not in flags.PATH_TYPES and _flag(action) not in NOT_PATHS \
                    and action.nargs != 0 and action.dest != "help":
                undeclared.append(f"{name} {_flag(action)}")
    assert not undeclared, f"path-like flags without a path type: {undeclared}"


@pytest.mark.parametrize("name", COMMANDS)
def test_every_path_flag_resolves_against_the_caller_s_directory(name, tmp_path, monkeypatch):
    monkeypatch.setattr(moejax, "CALLER_CWD", str(tmp_path))
    parser = dict(_commands())[name]
    typed = [a for a in parser._actions if a.type in flags.PATH_TYPES]
    for action in typed:
        value = "law=sub/f.json" if action.type is flags.named_path_type else "sub/f.json"
        resolved = action.type(value)
        expected = str(tmp_path / "sub" / "f.json")
        assert resolved == (f"law={expected}" if action.type is flags.named_path_type else expected), (name, _flag(action))
    if name == "register":  # the case a user hit: --fits NAME=F.json from another directory
        args = parser.parse_args(["--rule", "r", "--candidates", "c.json", "--fits", "camel=fit.json",
                                  "--baselines-from", "runs.csv", "--out", "reg.json"])
        assert args.fits == [f"camel={tmp_path / 'fit.json'}"] and args.candidates == str(tmp_path / "c.json")
        assert args.baselines_from == [str(tmp_path / "runs.csv")] and args.out == str(tmp_path / "reg.json")
