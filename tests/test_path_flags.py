"""Every path flag of every moejax command means what the user typed: relative to the directory they
ran the command from (``MOEJAX_CALLER_CWD``, :func:`moejax.paths.user_path`). The list of path
flags is the parsers' own (their argparse ``type`` is a path type, :func:`moejax.paths.is_path_type`),
not a hand-kept list: this reads each command's parser (as its ``main`` builds it, stopped at
``parse_args``), checks that every flag that reads like a path has a path type, and that each
resolves against the caller's directory. ``tests/test_dm_path_flags.py`` does the same for the
data_mixture commands."""

from __future__ import annotations

import argparse
import importlib
import re

import pytest

import moejax
from moejax import cli, paths
from moejax import main as train_main

# Words that mark a flag whose value is a path: in its name, or in its help or metavar.
NAME_LIKE = re.compile(r"\b(files?|dir|workdir|path|out|output|from|source|tokenizer|config|data)\b")
PATH_LIKE = re.compile(r"\b(files?|director(y|ies)|dir|workdirs?|path|json|jsonl|csv)\b", re.IGNORECASE)
# Flags whose name or help reads like a path but whose value is not one, and why.
NOT_PATHS = {
    ("train", "--config"): "a file or a built-in config's name, resolved by moejax.main._config_file "
                           "(test_relative_paths.py checks it from another directory)",
    ("prepare", "--text-field"): "a JSONL field / Parquet column",
    ("prepare", "--bos-token"): "a token", ("prepare", "--eos-token"): "a token", ("prepare", "--pad-token"): "a token",
    ("hf export", "--max-shard-size"): "a size",
    ("prepare", "--unique-tokens"): "DOMAIN=N token counts (its help names dataset.json, where they are recorded)",
}
# The path a flag is tried with, where not sub/f.jsonl (its type tells files from names by suffix).
SAMPLE = {("lm-eval", "--tasks"): "sub/f.yaml"}
COMMANDS = [name for name in cli.COMMANDS if name != "configs"]


class _Parsed(Exception):
    def __init__(self, parser: argparse.ArgumentParser):
        self.parser = parser


def _parser(name: str, monkeypatch) -> argparse.ArgumentParser:
    """The parser command ``name`` builds, caught as it starts to parse (nothing else runs)."""
    if name == "train":
        return train_main._own_options()
    module = importlib.import_module(cli.COMMANDS[name][0])

    def catch(self, *args, **kwargs):
        raise _Parsed(self)

    with monkeypatch.context() as patch:
        patch.setattr(argparse.ArgumentParser, "parse_args", catch)
        try:
            getattr(module, "parse_args", module.main)([])
        except _Parsed as parsed:
            return parsed.parser
    raise AssertionError(f"moejax {name} did not parse its arguments with argparse")


def _parsers(name: str, monkeypatch) -> list[tuple[str, argparse.ArgumentParser]]:
    """``(name, parser)`` of the command and of each of its subcommands (``hf import``)."""
    parser = _parser(name, monkeypatch)
    out = [(name, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            out += [(f"{name} {sub}", subparser) for sub, subparser in action.choices.items()]
    return out


def _flag(action) -> str:
    return action.option_strings[-1] if action.option_strings else action.dest


def _path_like(action) -> bool:
    if action.nargs == 0 or action.dest == "help" or isinstance(action, argparse._SubParsersAction):
        return False
    name = _flag(action).lstrip("-").replace("-", " ").replace("_", " ")
    return bool(NAME_LIKE.search(name) or PATH_LIKE.search(" ".join(str(x) for x in (action.help, action.metavar) if x)))


@pytest.mark.parametrize("name", COMMANDS)
def test_every_path_like_flag_is_declared_a_path(name, monkeypatch):
    undeclared = [f"{command} {_flag(action)}" for command, parser in _parsers(name, monkeypatch)
                  for action in parser._actions
                  if _path_like(action) and not paths.is_path_type(action.type)
                  and (command, _flag(action)) not in NOT_PATHS]
    assert not undeclared, f"path-like flags without a path type (moejax.paths): {undeclared}"


@pytest.mark.parametrize("name", COMMANDS)
def test_every_path_flag_resolves_against_the_caller_s_directory(name, tmp_path, monkeypatch):
    """Each path flag parsed as a user in ``tmp_path`` typed it, while the process runs elsewhere."""
    monkeypatch.setattr(moejax, "CALLER_CWD", str(tmp_path))
    assert paths.caller_cwd() == str(tmp_path)
    checked = 0
    for command, parser in _parsers(name, monkeypatch):
        for action in parser._actions:
            if not paths.is_path_type(action.type):
                continue
            named = "=" in (action.metavar or "")  # DOMAIN=PATH
            sample = SAMPLE.get((command, _flag(action)), "sub/f.jsonl")
            typed = f"code={sample}" if named else sample
            expected = str(tmp_path / sample)
            resolved = action.type(typed)
            assert resolved == (f"code={expected}" if named else expected), (command, _flag(action), resolved)
            checked += 1
    assert checked, f"moejax {name} has no path flag"


def test_a_whole_command_line_is_resolved_by_the_parser(tmp_path, monkeypatch):
    """prepare's flags as its parser returns them: paths resolved, keywords kept."""
    monkeypatch.setattr(moejax, "CALLER_CWD", str(tmp_path))
    parser = _parser("prepare", monkeypatch)
    args = parser.parse_args(["--source", "code=data/code", "--source", "web=hf:saved/web:text", "--out", "ds"])
    assert args.source == [f"code={tmp_path / 'data' / 'code'}", f"web=hf:{tmp_path / 'saved' / 'web'}:text"]
    assert args.out == str(tmp_path / "ds") and args.tokenizer == "byte"
    assert parser.parse_args(["--out", "ds", "--tokenizer", "tok.json"]).tokenizer == str(tmp_path / "tok.json")
    eval_parser = _parser("eval", monkeypatch)
    args = eval_parser.parse_args(["--workdir", "runs/a", "--tasks", "code_chars", "mine.jsonl"])
    assert args.workdir == str(tmp_path / "runs" / "a")
    assert args.tasks == ["code_chars", str(tmp_path / "mine.jsonl")]
    args = _parser("lm-eval", monkeypatch).parse_args(["--workdir", "w", "--tasks", "hellaswag,mine.yaml"])
    assert args.tasks == [f"hellaswag,{tmp_path / 'mine.yaml'}"]
    assert train_main._own_options().parse_known_args(["--workdir", "r"])[0].workdir == str(tmp_path / "r")
