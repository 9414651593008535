"""User text sources: which files a source names, how they split into pieces, and their documents.

A source is ``DOMAIN=PATH`` or ``DOMAIN=hf:PATH[:column]``; ``PATH`` is one of

- a directory: every file of a kind read by its suffix (``.txt``, ``.jsonl``, ``.parquet``,
  ``.txt.gz``, ``.txt.zst``, ``.jsonl.gz``, ``.jsonl.zst``) under it, recursively (names starting
  with ``.`` are skipped), in sorted order: one directory may mix them;
- a file;
- a glob pattern (quote it in the shell), e.g. ``'src/**/*.py'``: the matching files;
- after ``hf:``, a Hugging Face dataset saved with ``save_to_disk`` (:mod:`moejax.data.hf_source`),
  read from its string column ``column`` (default ``text_field``).

A file's suffix and first bytes set its format: ``.jsonl`` holds one JSON object per line whose
``text`` field (``text_field``) is a document; a Parquet file (``.parquet``, or any file that
starts with Parquet's magic bytes) has a string column ``text`` whose rows are documents;
``.jsonl.gz``/``.jsonl.zst`` and ``.txt.gz``/``.txt.zst`` are JSONL and plain text compressed with
gzip or zstd, streamed (:mod:`moejax.data.compressed`); any other text file is one plain-text
document. Text is UTF-8: a byte that is not is refused when it is read, naming the file, the
byte offset and the line. Files that are none of these are refused,
naming the file and the kinds that are read, never read as text: other compressed files (other
suffixes, bzip2, xz or zip; gzip or zstd bytes behind an uncompressed name), CSV/TSV, JSON,
binary files (a NUL byte near the start), and a compressed name over the wrong or no bytes (an
empty file). A directory skips the files whose suffix is not read, and says which it skipped (a
``SkippedFilesWarning``). Empty and whitespace-only documents, and JSON/Parquet/dataset nulls,
are skipped (and counted).

Work is split into ``Piece`` s of at most about ``max_bytes`` input bytes, so one large file is
tokenized in parallel too: a JSONL file by byte ranges (a piece owns the lines that *start* in
its range), a Parquet file by row groups (sized by their uncompressed bytes), a saved dataset by
row ranges, a text or compressed file whole (a stream cannot be entered in the middle).
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

from moejax.data import compressed, hf_source, layout
from moejax.errors import DataError, user_stacklevel

# Suffix -> kind, for the files a directory source reads (a file named directly or by a glob with
# another suffix is plain text if it is text). A compressed kind is "<kind>.<codec suffix>".
KINDS: Final = {".jsonl": "jsonl", ".parquet": "parquet", ".txt": "text", ".jsonl.gz": "jsonl.gz",
                ".jsonl.zst": "jsonl.zst", ".txt.gz": "text.gz", ".txt.zst": "text.zst"}
_CODEC_OF: Final = {".gz": "gzip", ".zst": "zstd"}
SUPPORTED: Final = ("plain text (.txt, or any text file named directly or by a glob), JSONL (.jsonl: one "
                    "JSON object per line), both also gzip- or zstd-compressed (.txt.gz, .txt.zst, .jsonl.gz, "
                    ".jsonl.zst), Parquet (.parquet) and Hugging Face datasets saved with save_to_disk "
                    "(hf:PATH[:column])")
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
    """One domain's input, as the user named it: files, or (``hf``) a saved Hugging Face dataset
    read from ``column`` ("": the text field)."""

    domain: str
    path: str
    hf: bool = False
    column: str = ""

    def __str__(self) -> str:
        if not self.hf:
            return f"{self.domain}={self.path}"
        return f"{self.domain}={hf_source.PREFIX}{self.path}" + (f":{self.column}" if self.column else "")


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
    column: str = ""  # a saved dataset's text column ("" for files: the text field)

    def fingerprint(self) -> list:
        """What a finished shard remembers of its input, to tell whether it changed."""
        found = [self.path, self.kind, self.start, self.stop, self.file_bytes, self.file_mtime_ns]
        return found + [self.column] if self.column else found


def parse_source(arg: str) -> Source:
    """``"DOMAIN=PATH"`` or ``"DOMAIN=hf:PATH[:column]"`` -> ``Source``, checking the domain name."""
    domain, sep, path = arg.partition("=")
    if not sep or not path:
        raise DataError(f"--source {arg!r} must look like DOMAIN=PATH, e.g. --source code=./src, or "
                        "DOMAIN=hf:PATH[:column] for a saved Hugging Face dataset")
    if not layout.DOMAIN_NAME.fullmatch(domain):
        raise DataError(
            f"--source {arg!r}: domain name {domain!r} must be 1-64 letters, digits, '_' or '-', "
            "starting with a letter or digit (it becomes a directory and a metric name)."
        )
    if not path.startswith(hf_source.PREFIX):
        return Source(domain, path)
    dataset, column = hf_source.split_spec(path[len(hf_source.PREFIX):])  # "PATH:" is PATH, its default column
    if not dataset:
        raise DataError(f"--source {arg!r} must look like DOMAIN=hf:PATH or DOMAIN=hf:PATH:COLUMN, e.g. "
                        "--source web=hf:datasets/web_saved:text")
    return Source(domain, dataset, hf=True, column=column)


def user_source(arg: str, resolve) -> str:
    """``DOMAIN=PATH`` (or ``DOMAIN=hf:PATH...``) with ``resolve`` applied to the path (a malformed
    argument is returned as it is, for :func:`parse_source` to report)."""
    domain, sep, path = arg.partition("=")
    if not (sep and path):
        return arg
    prefix = hf_source.PREFIX if path.startswith(hf_source.PREFIX) else ""
    return f"{domain}={prefix}{resolve(path[len(prefix):])}" if path[len(prefix):] else arg


def plan_source(source: Source, max_bytes: int, text_field: str) -> list[Piece]:
    """The pieces of ``source``: its files' (:func:`list_files`, :func:`plan_pieces`) or its saved
    dataset's (read from its column, else ``text_field``)."""
    if not source.hf:
        return plan_pieces(list_files(source), max_bytes, text_field)
    hf_source.check_dir(source.path, f"source {source}: ")
    path = os.path.abspath(source.path)
    file_bytes, mtime = hf_source.fingerprint(path)
    column = source.column or text_field
    return [Piece(path=path, kind="hf", start=start, stop=stop, size=size, file_bytes=file_bytes,
                  file_mtime_ns=mtime, column=column)
            for start, stop, size in hf_source.row_ranges(path, column, max_bytes)]


def list_files(source: Source) -> list[Path]:
    """The files ``source`` names, sorted, each of a kind that is read (:func:`kind_of`); a
    ``DataError`` if there are none, or if a file named directly or by a glob is of another kind."""
    path = source.path
    if _GLOB_CHARS.intersection(path):
        files = [Path(p) for p in sorted(glob.glob(path, recursive=True)) if os.path.isfile(p)]
        what = "matches no file"
    elif os.path.isdir(path):
        files = _directory_files(source)
        what = "is a directory without .jsonl, .parquet, .txt files (nor .jsonl/.txt compressed: .gz, .zst)"
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
            (files if known_suffix(name) else skipped).append(Path(dirpath, name))
    if skipped:
        skipped.sort()
        shown = ", ".join(f"{p.relative_to(source.path)} ({_unread_kind(p) or 'unknown suffix'})"
                          for p in skipped[:5])
        more = f" and {len(skipped) - 5} more" if len(skipped) > 5 else ""
        warnings.warn(f"source {source}: skipped {len(skipped)} file(s) that are not {', '.join(KINDS)}: "
                      f"{shown}{more}. Convert them (e.g. CSV to JSONL, bzip2 to zstd) to include them.",
                      SkippedFilesWarning, stacklevel=user_stacklevel())
    return sorted(files)


def known_suffix(name: str) -> str:
    """The suffix of ``name`` that :data:`KINDS` knows (the longest: ``.jsonl.gz``), or ""."""
    return max((suffix for suffix in KINDS if name.endswith(suffix) and len(name) > len(suffix)), key=len,
               default="")


def kind_of(path: Path, source: Source | str = "") -> str:
    """The format of a file (a value of :data:`KINDS`; "text" for other text files), from its
    suffix and first bytes; a ``DataError`` naming the file and the fix for a file of a kind
    that is not read, or a compressed name over other (or no) bytes."""
    where = f"source {source}: " if source else ""
    suffix = known_suffix(path.name)
    if KINDS.get(suffix, "").endswith((".gz", ".zst")):
        codec = _CODEC_OF[os.path.splitext(suffix)[1]]
        head = _head(path)
        if not head.startswith(compressed.CODECS[codec][0]):
            what = "is empty (0 bytes)" if not head else f"does not start with {codec}'s magic bytes"
            raise DataError(f"{where}{path} is named {suffix} but {what}, so it is not {codec}-compressed "
                            f"data. Recompress it, or rename it to its real kind; prepare reads {SUPPORTED}.")
        return KINDS[suffix]
    problem = _unread_kind(path)
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
        name, command = next((name, c) for _, name, c in _COMPRESSED if problem.startswith(name))
        codec_suffix = {"gzip": ".gz", "zstd": ".zst"}.get(name)
        inner = known_suffix(path.name)
        if codec_suffix and KINDS.get(inner) in ("jsonl", "text"):  # e.g. gzip bytes named .jsonl
            what = "JSONL" if KINDS[inner] == "jsonl" else "plain text"
            return f" Rename it to {path.name}{codec_suffix} so that prepare reads it as compressed {what}."
        if codec_suffix:
            return (f" Compressed files are read as JSONL or plain text named .jsonl{codec_suffix} or "
                    f".txt{codec_suffix}: rename it if it holds one of those, or decompress it ({command} "
                    f"{path}) and convert it.")
        return (f" Decompress it first ({command} {path}) and prepare the decompressed file, or recompress "
                "it with zstd or gzip (.jsonl.zst, .txt.gz, ...).")
    if "table" in problem:
        return (" Convert it to JSONL, one object per row with the document in a \"text\" field (or "
                "name the field with --text-field), or to Parquet.")
    if "JSON document" in problem:
        return " Write one JSON object per line to a .jsonl file instead."
    return " If it is text in another encoding (e.g. UTF-16), convert it to UTF-8."


def plan_pieces(files: list[Path], max_bytes: int, text_field: str) -> list[Piece]:
    """Cut ``files`` into pieces of at most about ``max_bytes`` input bytes, in file order
    (compressed files whole, their size counted compressed)."""
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
    """The documents of ``piece`` in file order; ``None`` stands for a JSON/Parquet/dataset null."""
    kind, _, codec_suffix = piece.kind.partition(".")
    codec = _CODEC_OF.get(f".{codec_suffix}", "")
    if piece.kind == "hf":
        yield from hf_source.documents(piece.path, piece.column or text_field, piece.start, piece.stop)
    elif piece.kind == "jsonl":
        yield from _jsonl_documents(piece, text_field)
    elif piece.kind == "parquet":
        yield from _parquet_documents(piece, text_field)
    elif kind == "jsonl":
        offset = 0
        for number, line in enumerate(compressed.lines(piece.path, codec), 1):
            offset += len(line)
            if line.strip():
                decode_utf8(line, piece.path, "(decompressed) ", offset=offset - len(line), line=number)
                yield _jsonl_text(line, piece.path, f"line {number} (decompressed)", text_field)
    elif codec:
        yield decode_utf8(compressed.read_all(piece.path, codec), piece.path, "(decompressed) ")
    else:
        with open(piece.path, "rb") as f:
            yield decode_utf8(f.read(), piece.path)


def decode_utf8(data: bytes, path: str, where: str = "", offset: int = 0, line: int | None = 1) -> str:
    """``data`` decoded as UTF-8; a ``DataError`` naming the file, the byte offset and the line of
    the first byte that is not UTF-8 (``offset``/``line``: where ``data`` starts in the file; line
    None: not counted)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        newlines = data.count(b"\n", 0, e.start)
        at_line = "" if line is None else f" (line {line + newlines:,})"
        raise DataError(
            f"{path}: {where}byte {offset + e.start:,}{at_line} is not valid UTF-8 ({e.reason}: "
            f"{data[e.start:e.end + 3]!r}). prepare reads UTF-8 text only; convert the file first, e.g. "
            f"iconv -f LATIN1 -t UTF-8 {path} > {path}.utf8 (with its real encoding), and prepare that."
        ) from None


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
            if line.strip():
                decode_utf8(line, piece.path, f"the line at byte {offset:,}: ", offset, None)  # a non-UTF-8 byte
                yield _jsonl_text(line, piece.path, f"the line at byte {offset}", text_field)


def _jsonl_text(line: bytes, path: str, where: str, text_field: str) -> str | None:
    """The document of one JSONL line (None for a null); ``where``: the line, for the errors."""
    try:
        record = json.loads(line)
    except ValueError as e:
        raise DataError(
            f"{path}: {where} is not valid JSON ({e}). A .jsonl file holds one JSON object per line, "
            f"with the document in {text_field!r}."
        ) from None
    text = record.get(text_field, 0) if isinstance(record, dict) else 0
    if text is not None and not isinstance(text, str):  # Missing fields fail here too.
        raise DataError(
            f"{path}: {where} has no string field {text_field!r}. Each line must be an object like "
            "{\"" + text_field + "\": \"...\"}; use --text-field to name another field."
        )
    return text


def _parquet_file(path: Path | str, text_field: str):
    try:  # Only Parquet sources need pyarrow (the parquet extra).
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError(f"{path}: reading Parquet needs pyarrow, which the base install leaves out: pip install "
                        "'moejax[parquet]' (or give the text as JSONL or plain text files).") from None

    try:
        parquet = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as e:
        raise DataError(f"{path} cannot be read as Parquet ({e}): it is cut short or corrupt. Write it "
                        "again with a Parquet writer.") from None
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
