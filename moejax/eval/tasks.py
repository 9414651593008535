"""Benchmark tasks: JSONL files of multiple-choice or exact-match items, checked line by line.

One JSON object per line (blank lines are skipped), one kind per file:

- multiple choice: ``{"context": str, "choices": [str, ...], "gold": int}``, at least two choices;
  ``gold`` indexes the right one. Choices are appended to the context as they are, so they carry
  the separator they need (e.g. a leading space).
- exact match: ``{"prompt": str, "answer": str}``; the model's greedy continuation of ``prompt``,
  up to its first newline, must equal ``answer`` (both stripped of surrounding whitespace).

Other fields (e.g. ``id``) are kept and ignored. The built-in corpus ships its benchmarks in this
format (:mod:`moejax.eval.benchmarks`): ``benchmarks-v1`` one file per domain (tasks ``code``,
``prose``, ``math``, ``knowledge``), ``benchmarks-v2`` graded tasks (``code_chars``, ...,
``know_type``, ``math_copy``). The names of the two versions
differ, so any built-in name of either version resolves; a user file works the same way and its
task name is the file's stem. A bad file fails before anything runs, naming the file, the line and the field.
"""

from __future__ import annotations

import dataclasses
import json
import numbers
import os
from pathlib import Path
from typing import Any

from moejax.data.dataset import BUILTIN_CORPUS_SEED
from moejax.errors import UserError
from moejax.eval.benchmarks import VERSIONS, load_benchmarks, task_names

MULTIPLE_CHOICE, EXACT_MATCH = "multiple_choice", "exact_match"
FIELDS = {MULTIPLE_CHOICE: ("context", "choices", "gold"), EXACT_MATCH: ("prompt", "answer")}


class TaskFileError(UserError):
    """A benchmark file that is not valid JSONL in one of the two item formats."""


@dataclasses.dataclass(frozen=True)
class Task:
    name: str
    kind: str  # MULTIPLE_CHOICE | EXACT_MATCH
    items: tuple[dict[str, Any], ...]
    source: str  # the file it was read from


def load_task_file(path: str | os.PathLike[str]) -> Task:
    """A task from a JSONL file; raises :class:`TaskFileError` naming the line and field at fault."""
    path = Path(path)
    if not path.is_file():
        raise TaskFileError(f"benchmark file {path} does not exist.")
    items, kind, first_line = [], None, 0
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}, line {number}"
            try:
                item = json.loads(line)
            except json.JSONDecodeError as e:
                raise TaskFileError(f"{where}: not valid JSON ({e.msg} at column {e.colno}).") from None
            line_kind = _check_item(item, where)
            if kind is None:
                kind, first_line = line_kind, number
            elif line_kind != kind:
                raise TaskFileError(
                    f"{where}: {_a(line_kind)} item, but line {first_line} is {_a(kind)} item; "
                    "use one kind per file."
                )
            items.append(item)
    if not items:
        raise TaskFileError(f"benchmark file {path} holds no items.")
    return Task(path.stem, kind, tuple(items), str(path))


def builtin_task_versions() -> dict[str, str]:
    """Built-in task name -> the benchmarks version that holds it (names of versions never clash)."""
    return {name: version for version in VERSIONS for name in task_names(version)}


def resolve_tasks(specs: list[str], cache_dir: str | None) -> list[Task]:
    """Tasks named by ``specs``: built-in names (of any benchmarks version) or paths of JSONL files."""
    tasks, builtin = [], builtin_task_versions()
    for spec in specs:
        if spec in builtin:
            directory = load_benchmarks(BUILTIN_CORPUS_SEED, cache_dir, builtin[spec]).directory  # built on first use
            tasks.append(load_task_file(directory / f"{spec}.jsonl"))
        elif spec.endswith(".jsonl") or os.path.exists(spec):
            tasks.append(load_task_file(spec))
        else:
            raise TaskFileError(
                f"task {spec!r} is neither a built-in task ({', '.join(builtin)}) nor a .jsonl file."
            )
    names = [t.name for t in tasks]
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:
        raise TaskFileError(f"task name(s) {duplicated} given twice; task names are file stems and must differ.")
    return tasks


def _check_item(item: Any, where: str) -> str:
    if not isinstance(item, dict):
        raise TaskFileError(f"{where}: expected a JSON object, got {type(item).__name__}.")
    kinds = [k for k, fields in FIELDS.items() if any(f in item for f in fields)]
    if len(kinds) != 1:
        raise TaskFileError(
            f"{where}: expected either a multiple-choice item {{\"context\", \"choices\", \"gold\"}} or an "
            f"exact-match item {{\"prompt\", \"answer\"}}; got fields {sorted(item)}."
        )
    kind = kinds[0]
    for field in FIELDS[kind]:
        if field not in item:
            raise TaskFileError(f"{where}: {_a(kind)} item lacks field {field!r}.")
    if kind == EXACT_MATCH:
        _check_string(item, "prompt", where, nonempty=True)
        _check_string(item, "answer", where, nonempty=False)
        return kind
    _check_string(item, "context", where, nonempty=True)
    choices = item["choices"]
    if not isinstance(choices, list) or len(choices) < 2:
        raise TaskFileError(f"{where}: field 'choices' must be a list of at least 2 strings, got {choices!r}.")
    for i, choice in enumerate(choices):
        if not isinstance(choice, str) or not choice:
            raise TaskFileError(f"{where}: field 'choices' entry {i} must be a non-empty string, got {choice!r}.")
    gold = item["gold"]
    if isinstance(gold, bool) or not isinstance(gold, numbers.Integral) or not 0 <= gold < len(choices):
        raise TaskFileError(
            f"{where}: field 'gold' must be an integer index into 'choices' (0..{len(choices) - 1}), got {gold!r}."
        )
    return kind


def _check_string(item: dict, field: str, where: str, *, nonempty: bool) -> None:
    value = item[field]
    if not isinstance(value, str) or (nonempty and not value):
        raise TaskFileError(
            f"{where}: field {field!r} must be a {'non-empty ' if nonempty else ''}string, got {value!r}."
        )


def _a(kind: str) -> str:
    return "a multiple-choice" if kind == MULTIPLE_CHOICE else "an exact-match"
