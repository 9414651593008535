"""Sources that are Hugging Face datasets saved with ``Dataset.save_to_disk``: ``hf:PATH[:column]``.

``PATH`` is the directory ``save_to_disk`` wrote (``state.json``, ``dataset_info.json`` and its
``.arrow`` files); ``column`` (default: ``--text-field``, ``text``) is a string column whose rows
are documents. A ``DatasetDict``'s directory holds one directory per split: name the split, e.g.
``hf:PATH/train``. The dataset is memory-mapped (``datasets.load_from_disk``, imported only
here; a clear error without the ``datasets`` package) and cut into pieces of contiguous rows
of about ``max_bytes`` of its Arrow files.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

from moejax.errors import DataError

PREFIX: Final = "hf:"
_STATE: Final = "state.json"  # what save_to_disk writes beside the Arrow files of a Dataset
_DICT: Final = "dataset_dict.json"  # ... and beside the split directories of a DatasetDict
_BATCH: Final = 1024


def split_spec(spec: str) -> tuple[str, str]:
    """``"PATH[:column]"`` (after ``hf:``) -> (path, column or ""): a ``:`` ends the path unless the
    whole of ``spec`` is a directory."""
    if os.path.isdir(spec) or ":" not in spec:
        return spec, ""
    path, _, column = spec.rpartition(":")
    return path, column


def check_dir(path: str, where: str) -> None:
    """A ``DataError`` unless ``path`` is a directory that ``Dataset.save_to_disk`` wrote."""
    if not os.path.isdir(path):
        what = "is a file" if os.path.exists(path) else "does not exist"
        raise DataError(f"{where}{path!r} {what}; hf: names a directory written by a Hugging Face "
                        "Dataset's save_to_disk.")
    if os.path.isfile(os.path.join(path, _DICT)):
        splits = sorted(d for d in os.listdir(path) if os.path.isfile(os.path.join(path, d, _STATE)))
        example = "train" if "train" in splits or not splits else splits[0]
        raise DataError(f"{where}{path} holds a DatasetDict (splits: {', '.join(splits) or 'none'}); name one "
                        f"split's directory, e.g. hf:{os.path.join(path, example)}.")
    if not os.path.isfile(os.path.join(path, _STATE)):
        raise DataError(f"{where}{path} is not a dataset saved with save_to_disk (it has no {_STATE}); save it "
                        "with datasets' Dataset.save_to_disk, or give its files as JSONL or Parquet.")


def load(path: str) -> Any:
    """``datasets.load_from_disk(path)``, a ``DataError`` naming the path if it fails."""
    try:
        import datasets
    except ImportError:
        raise DataError(f"{path}: reading a Hugging Face dataset needs the datasets package, which the base "
                        "install leaves out: pip install 'moejax[parquet]' (or give the text as JSONL, Parquet or "
                        "plain text files).") from None
    try:
        dataset = datasets.load_from_disk(path)
    except Exception as e:  # missing or corrupt Arrow files, a state.json from another version
        raise DataError(f"{path}: the saved Hugging Face dataset cannot be loaded ({type(e).__name__}: {e}); "
                        "save it again with save_to_disk.") from None
    if not isinstance(dataset, datasets.Dataset):
        raise DataError(f"{path} holds a {type(dataset).__name__}, not one Dataset; name one split's directory.")
    return dataset


def check_column(dataset: Any, path: str, column: str) -> None:
    if column not in dataset.column_names:
        raise DataError(f"{path}: no column {column!r}; its columns are {dataset.column_names}. Name the "
                        "column that holds the text: hf:PATH:COLUMN (or --text-field).")
    feature = dataset.features[column]
    if getattr(feature, "dtype", None) not in ("string", "large_string"):
        raise DataError(f"{path}: column {column!r} is {feature}, not a string column; name the column "
                        "that holds the text: hf:PATH:COLUMN.")


def fingerprint(path: str) -> tuple[int, int]:
    """(bytes, newest modification time in ns) of the dataset's files: a rerun redoes its shards
    when they change."""
    files = [p for p in Path(path).iterdir() if p.is_file()]
    stats = [p.stat() for p in files]
    return sum(s.st_size for s in stats), max((s.st_mtime_ns for s in stats), default=0)


def arrow_bytes(path: str) -> int:
    state = json.loads(Path(path, _STATE).read_text())
    return sum(Path(path, f["filename"]).stat().st_size for f in state.get("_data_files", []))


def row_ranges(path: str, column: str, max_bytes: int) -> Iterator[tuple[int, int, int]]:
    """(start, stop, estimated bytes) of each piece: contiguous rows of about ``max_bytes``."""
    dataset = load(path)
    check_column(dataset, path, column)
    rows = dataset.num_rows
    if not rows:
        raise DataError(f"{path}: the saved dataset has no rows; there is nothing to prepare.")
    per_row = max(1.0, arrow_bytes(path) / rows)
    step = max(1, int(max_bytes // per_row))
    for start in range(0, rows, step):
        stop = min(start + step, rows)
        yield start, stop, math.ceil((stop - start) * per_row)


def documents(path: str, column: str, start: int, stop: int) -> Iterator[str | None]:
    """The ``column`` values of rows ``[start, stop)``; ``None`` for a null."""
    dataset = load(path)
    check_column(dataset, path, column)
    part = dataset.select_columns([column]).select(range(start, stop))
    for batch in part.iter(batch_size=_BATCH):
        yield from batch[column]
