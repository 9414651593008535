"""Offline tasks only: the lm-eval tasks asked for are found, and none needs a dataset download.

moejax runs lm-eval with ``HF_DATASETS_OFFLINE=1`` and ``HF_HUB_OFFLINE=1``: a task reads a local
file, not a dataset on the Hugging Face Hub. A task qualifies when its YAML names one of the
``datasets`` library's file builders with local files::

    dataset_path: json            # or csv, parquet, text, arrow
    dataset_kwargs:
      data_files:
        test: path/to/items.jsonl  # relative to the directory lm-eval runs in, or absolute

or ``dataset_path`` is a local directory, or the task builds its own data (``custom_dataset``).
Anything else (``dataset_path: Rowan/hellaswag``, a missing file) is refused here, before the model
is loaded, with the task, its YAML file and the fix; lm-eval would otherwise fail deep inside the
``datasets`` library after the model was built.
"""

from __future__ import annotations

import glob
import os
from pathlib import Path
from typing import Any, Iterable

from lm_eval.tasks import TaskManager
from lm_eval.tasks._index import Entry, Kind, TaskIndex

from moejax.errors import UserError

FILE_BUILDERS = ("json", "csv", "parquet", "text", "arrow")
HOW = ("moejax runs offline tasks only: write a local task YAML with `dataset_path: json` and "
       "`dataset_kwargs: {data_files: {test: path/to/items.jsonl}}` (docs/eval.md, 'lm-evaluation-harness') "
       "and pass its directory with --include_path.")


class OfflineTaskError(UserError):
    """A task that cannot run offline, or a task name that is not found."""


def task_manager(specs: list[str], include_path: list[str] | None) -> TaskManager:
    """A task manager that knows every spec. Only the ``include_path`` directories are indexed when
    they hold every task asked for (lm-eval's own few thousand task files take seconds to index);
    otherwise lm-eval's built-in tasks too, so that a built-in name gets the offline error below."""
    if include_path:
        local = TaskManager(include_path=include_path, include_defaults=False)
        if all(_entry(local, spec) is not None for spec in specs):
            return local
    return TaskManager(include_path=include_path or None)


def check_offline(manager: TaskManager, specs: Iterable[str]) -> None:
    """Raises :class:`OfflineTaskError` for the first spec that is unknown or needs a download."""
    for spec in specs:
        entry = _entry(manager, spec)
        if entry is None:
            local = sorted(n for n, e in manager.task_index.items()
                           if e.yaml_path and "lm_eval/tasks" not in e.yaml_path.as_posix())
            raise OfflineTaskError(
                f"task {spec!r} is neither an lm-eval task name nor a task YAML file. Tasks found under "
                f"--include_path: {', '.join(local) or 'none'}."
            )
        try:
            _check_entry(manager, entry, seen=set())
        except OfflineTaskError as e:
            if entry.name == spec:
                raise
            raise OfflineTaskError(f"{spec!r} includes {e}") from None


def _entry(manager: TaskManager, spec: str) -> Entry | None:
    entry = manager.task_index.get(spec)
    if entry is None and spec.endswith((".yaml", ".yml")) and os.path.isfile(spec):
        entry = TaskIndex.entry_from_path(Path(spec))
    return entry


def _check_entry(manager: TaskManager, entry: Entry, seen: set[str]) -> None:
    if entry.name in seen:
        return
    seen.add(entry.name)
    if entry.kind == Kind.TAG:
        children = [e for e in manager.task_index.values() if entry.name in e.tags]
    elif entry.kind == Kind.GROUP:
        listed = (entry.cfg or {}).get("task") or []
        children = []
        for child in listed if isinstance(listed, list) else [listed]:
            if isinstance(child, dict):
                _check_config(child, child.get("task", entry.name), entry.yaml_path)
                child = child.get("task")
            found = manager.task_index.get(child) if isinstance(child, str) else None
            if found is not None:
                children.append(found)
    else:
        _check_config(entry.cfg or {}, entry.name, entry.yaml_path)
        return
    for child_entry in children:
        _check_entry(manager, child_entry, seen)


def _check_config(cfg: dict[str, Any], name: str, yaml_path: Path | None) -> None:
    where = f"task {name!r}" + (f" ({yaml_path})" if yaml_path else "")
    if cfg.get("custom_dataset") or cfg.get("class"):
        return  # builds its own data; nothing to check before it runs
    path = cfg.get("dataset_path")
    if path is None:
        return  # inherits its dataset from a group's config, checked there
    if path in FILE_BUILDERS:
        data_files = (cfg.get("dataset_kwargs") or {}).get("data_files")
        if not data_files:
            raise OfflineTaskError(f"{where}: `dataset_path: {path}` needs `dataset_kwargs: {{data_files: ...}}` "
                                   "naming the local files. " + HOW)
        missing = [f for f in _files(data_files) if not glob.glob(os.path.expanduser(f))]
        if missing:
            raise OfflineTaskError(
                f"{where}: data file(s) {missing} not found (relative paths are read from the directory "
                f"lm-eval runs in, here {os.getcwd()}). Run from the directory they are relative to, or "
                "write absolute paths."
            )
        return
    if os.path.isdir(os.path.expanduser(str(path))):
        return
    raise OfflineTaskError(f"{where} needs a dataset download (`dataset_path: {path}` is a dataset on the "
                           f"Hugging Face Hub). " + HOW)


def _files(data_files: Any) -> list[str]:
    if isinstance(data_files, str):
        return [data_files]
    if isinstance(data_files, dict):
        return [f for value in data_files.values() for f in _files(value)]
    return [f for value in data_files for f in _files(value)]
