"""User text sources: which files a source names, how they split into pieces, and their documents.

A source is ``DOMAIN=PATH``; ``PATH`` is one of

- a directory: every ``.txt``, ``.jsonl`` and ``.parquet`` file under it, recursively (names
  starting with ``.`` are skipped), in sorted order;
- a file;
- a glob pattern (quote it in the shell), e.g. ``'src/**/*.py'``: the matching files.

A file's suffix and first bytes set its format: ``.jsonl`` holds one JSON object per line whose
``text`` field (``text_field``) is a document; a Parquet file (``.parquet``, or any file that
starts with Parquet's magic bytes) has a string column ``text`` whose rows are documents; any
other text file is one plain-text document (UTF-8; undecodable bytes become U+FFFD). Files that
are none of these are refused, never read as text: compressed files (by suffix, or gzip, zstd,
bzip2, xz or zip magic bytes), CSV/TSV, JSON, and binary files (a NUL byte near the start). A
directory skips them, and says which it skipped (a ``SkippedFilesWarning``). Empty and
whitespace-only documents, and JSON/Parquet nulls, are skipped (and counted).

Work is split into ``Piece`` s of at most about ``max_bytes`` input bytes, so one large file is
tokenized in parallel too: a JSONL file by byte ranges (a piece owns the lines that *start* in
its range), a Parquet file by row groups (sized by their uncompressed bytes), a text file whole.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from moejax.data import layout
from moejax.errors import DataError, user_stacklevel

KINDS: Final = {".jsonl": "jsonl", ".parquet": "parquet", ".txt": "text"}
SUPPORTED: Final = ("plain text (.txt, or any text file named directly or by a glob), JSONL (.jsonl: one "
                    "JSON object per line) and Parquet (.parquet)")
_GLOB_CHARS: Final = frozenset("*?[")
PARQUET_MAGIC: Final = b"PAR1"
# Compressed formats: magic bytes (b"": known by the suffix only, as "BZh" can start a text), name,
# and the command that decompresses FILE.
_COMPRESSED: Final = ((b"\x1f\x8b", "gzip", "gunzip"), (b"\x28\xb5\x2f\xfd", "zstd", "unzstd"),
                      (b"", "bzip2", "bunzip2"), (b"\xfd7zXZ\x00", "xz", "unxz"), (b"PK\x03\x04", "zip", "unzip"))
_COMPRESSED_SUFFIXES: Final = {".gz": 0, ".tgz": 0, ".zst": 1, ".zstd": 1, ".bz2": 2, ".xz": 3, ".zip": 4}
_TABLE_SUFFIXES: Final = {".csv": "a CSV table", ".tsv": "a TSV table", ".json": "a JSON document"}


class SkippedFilesWarning(UserWarning):
    """A directory source held files that are not read (wrong kind); the message lists them."""


@dataclasses.dataclass(frozen=True)
class Source:
    """One domain's input, as the user named it."""

    domain: str
    path: str

    def __str__(self) -> str:
        return f"{self.domain}={self.path}"


@dataclasses.dataclass(frozen=True)
class Piece:
    """A unit of tokenization work: ``[start, stop)`` of one file, in bytes or row groups."""

    path: str
    kind: str
    start: int
    stop: int
    size: int  # input bytes it covers (Parquet: uncompressed bytes of its row groups)
    file_bytes: int
    file_mtime_ns: int

    def fingerprint(self) -> list:
        """What a finished shard remembers of its input, to tell whether it changed."""
        return [self.path, self.kind, self.start, self.stop, self.file_bytes, self.file_mtime_ns]


def parse_source(arg: str) -> Source:
    """``"DOMAIN=PATH"`` -> ``Source``, checking the domain name."""
    domain, sep, path = arg.partition("=")
    if not sep or not path:
        raise DataError(f"--source {arg!r} must look like DOMAIN=PATH, e.g. --source code=./src")
    if not layout.DOMAIN_NAME.fullmatch(domain):
        raise DataError(
            f"--source {arg!r}: domain name {domain!r} must be 1-64 letters, digits, '_' or '-', "
            "starting with a letter or digit (it becomes a directory and a metric name)."
        )
    return Source(domain, path)


def list_files(source: Source) -> list[Path]:
    """The files ``source`` names, sorted, each of a kind that is read (:func:`kind_of`); a
    ``DataError`` if there are none, or if a file named directly or by a glob is of another kind."""
    path = source.path
    if _GLOB_CHARS.intersection(path):
        files = [Path(p) for p in sorted(glob.glob(path, recursive=True)) if os.path.isfile(p)]
        what = "matches no file"
    elif os.path.isdir(path):
        files = _directory_files(source)
        what = f"is a directory without {', '.join(sorted(KINDS))} files"
    elif os.path.isfile(path):
        files, what = [Path(path)], ""
    else:
        raise DataError(f"source {source}: path {path!r} does not exist{_relative_note(path)}. Check "
                        "the path, or quote a glob pattern so the shell does not expand it.")
    if not files:
        raise DataError(f"source {source}: {path!r} {what}; there is nothing to prepare. Point "
                        f"it at {SUPPORTED}.")
    for file in files:
        kind_of(file, source)
    return files


def _relative_note(path: str) -> str:
    return "" if os.path.isabs(path) else f" (relative to {os.getcwd()})"


def _directory_files(source: Source) -> list[Path]:
    """The files of a directory source whose suffix is read; warns about the others it skips."""
    files, skipped = [], []
    for dirpath, dirnames, filenames in os.walk(source.path):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for name in filenames:
            if name.startswith("."):
                continue
            (files if os.path.splitext(name)[1] in KINDS else skipped).append(Path(dirpath, name))
    if skipped:
        skipped.sort()
        shown = ", ".join(f"{p.relative_to(source.path)} ({_unread_kind(p) or 'unknown suffix'})"
                          for p in skipped[:5])
        more = f" and {len(skipped) - 5} more" if len(skipped) > 5 else ""
        warnings.warn(f"source {source}: skipped {len(skipped)} file(s) that are not .txt, .jsonl or "
                      f".parquet: {shown}{more}. Convert them (decompress, or CSV to JSONL) to include them.",
                      SkippedFilesWarning, stacklevel=user_stacklevel())
    return sorted(files)


def kind_of(path: Path, source: Source | str = "") -> str:
    """The format of a file ("text", "jsonl" or "parquet"), from its suffix and first bytes; a
    ``DataError`` naming the file and the fix for a file of a kind that is not read."""
    problem = _unread_kind(path)
    where = f"source {source}: " if source else ""
    if problem:
        raise DataError(f"{where}{path} is {problem}, which prepare does not read; it reads {SUPPORTED}."
                        f"{_fix_for(path, problem)}")
    head = _head(path)
    if head.startswith(PARQUET_MAGIC):
        return "parquet"
    if path.suffix == ".parquet":
        raise DataError(f"{where}{path} is named .parquet but is not a Parquet file (no PAR1 magic "
                        "bytes); write it with a Parquet writer, or rename it to its real kind.")
    return KINDS.get(path.suffix, "text")


def _head(path: Path, size: int = 8192) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(size)
    except OSError as e:
        raise DataError(f"{path} cannot be read ({e.strerror or e}); check its permissions.") from None


def _unread_kind(path: Path) -> str:
    """'' for a file prepare reads, else what it is (e.g. 'gzip-compressed')."""
    try:
        head = _head(path)
    except DataError:
        head = b""
    for magic, name, _ in _COMPRESSED:
        if magic and head.startswith(magic):
            return f"{name}-compressed"
    if path.suffix.lower() in _COMPRESSED_SUFFIXES:
        return f"{_COMPRESSED[_COMPRESSED_SUFFIXES[path.suffix.lower()]][1]}-compressed (by its name)"
    if head.startswith(PARQUET_MAGIC):
        return ""
    if path.suffix.lower() in _TABLE_SUFFIXES:
        return _TABLE_SUFFIXES[path.suffix.lower()]
    if b"\x00" in head:
        return "a binary file (it holds NUL bytes)"
    return ""


def _fix_for(path: Path, problem: str) -> str:
    if "compressed" in problem:
        command = next(c for _, name, c in _COMPRESSED if problem.startswith(name))
        return (f" Compressed input is not supported yet; decompress it first ({command} {path}) and "
                "prepare the decompressed file.")
    if "table" in problem:
        return (" Convert it to JSONL, one object per row with the document in a \"text\" field (or "
                "name the field with --text-field), or to Parquet.")
    if "JSON document" in problem:
        return " Write one JSON object per line to a .jsonl file instead."
    return " If it is text in another encoding (e.g. UTF-16), convert it to UTF-8."


def plan_pieces(files: list[Path], max_bytes: int, text_field: str) -> list[Piece]:
    """Cut ``files`` into pieces of at most about ``max_bytes`` input bytes, in file order."""
    pieces = []
    for path in files:
        stat = path.stat()
        common = dict(path=os.path.abspath(path), file_bytes=stat.st_size, file_mtime_ns=stat.st_mtime_ns)
        kind = kind_of(path)
        if kind == "parquet":
            pieces += _parquet_pieces(path, max_bytes, text_field, common)
        elif kind == "jsonl":
            for start in range(0, max(stat.st_size, 1), max_bytes):
                stop = min(start + max_bytes, stat.st_size)
                pieces.append(Piece(kind=kind, start=start, stop=stop, size=stop - start, **common))
        else:
            pieces.append(Piece(kind=kind, start=0, stop=stat.st_size, size=stat.st_size, **common))
    return pieces


def read_documents(piece: Piece, text_field: str) -> Iterator[str | None]:
    """The documents of ``piece`` in file order; ``None`` stands for a JSON/Parquet null."""
    if piece.kind == "jsonl":
        yield from _jsonl_documents(piece, text_field)
    elif piece.kind == "parquet":
        yield from _parquet_documents(piece, text_field)
    else:
        with open(piece.path, "rb") as f:
            yield f.read().decode("utf-8", errors="replace")


def _jsonl_documents(piece: Piece, text_field: str) -> Iterator[str | None]:
    with open(piece.path, "rb") as f:
        if piece.start > 0:
            f.seek(piece.start - 1)
            f.readline()  # The line straddling ``start`` belongs to the previous piece.
        position = f.tell()
        while position < piece.stop:
            line = f.readline()
            if not line:
                break
            offset, position = position, position + len(line)
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as e:
                raise DataError(
                    f"{piece.path}: the line at byte {offset} is not valid JSON ({e}). A .jsonl "
                    f"file holds one JSON object per line, with the document in {text_field!r}."
                ) from None
            text = record.get(text_field, 0) if isinstance(record, dict) else 0
            if text is not None and not isinstance(text, str):  # Missing fields fail here too.
                raise DataError(
                    f"{piece.path}: the line at byte {offset} has no string field {text_field!r}. "
                    "Each line must be an object like {\"" + text_field + "\": \"...\"}; use "
                    "--text-field to name another field."
                )
            yield text


def _parquet_file(path: Path | str, text_field: str):
    try:  # Only Parquet sources need pyarrow (the parquet extra).
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError(f"{path}: reading Parquet needs pyarrow, which the base install leaves out: pip install "
                        "'moejax[parquet]' (or give the text as JSONL or plain text files).") from None

    parquet = pq.ParquetFile(path)
    schema = parquet.schema_arrow
    if text_field not in schema.names:
        raise DataError(f"{path}: no column {text_field!r}; its columns are {schema.names}. Use "
                        "--text-field to name the column that holds the text.")
    column_type = schema.field(text_field).type
    if not (pa.types.is_string(column_type) or pa.types.is_large_string(column_type)):
        raise DataError(f"{path}: column {text_field!r} has type {column_type}, not string; "
                        "use --text-field to name the column that holds the text.")
    return parquet


def _parquet_pieces(path: Path, max_bytes: int, text_field: str, common: dict) -> list[Piece]:
    metadata = _parquet_file(path, text_field).metadata
    pieces, start, size = [], 0, 0
    for group in range(metadata.num_row_groups):
        group_bytes = metadata.row_group(group).total_byte_size
        if group > start and size + group_bytes > max_bytes:
            pieces.append(Piece(kind="parquet", start=start, stop=group, size=size, **common))
            start, size = group, 0
        size += group_bytes
    if metadata.num_row_groups:
        pieces.append(Piece(kind="parquet", start=start, stop=metadata.num_row_groups, size=size,
                            **common))
    return pieces


def _parquet_documents(piece: Piece, text_field: str) -> Iterator[str | None]:
    parquet = _parquet_file(piece.path, text_field)
    batches = parquet.iter_batches(row_groups=range(piece.start, piece.stop), columns=[text_field])
    for batch in batches:
        yield from batch.column(0).to_pylist()
