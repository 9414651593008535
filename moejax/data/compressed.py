"""Streaming reads of gzip- and zstd-compressed sources (``.jsonl.gz``, ``.txt.zst``, ...).

Decompressed in chunks as they are read, never whole in memory or on disk (a ``.txt`` document
is one file, so its text is joined in memory; a JSONL file streams line by line). A file that is
cut short or corrupt is a ``DataError`` naming the file. zstd is read frame by frame with
zstandard's decompression objects rather than its ``stream_reader``, which passes a file that
ends inside a frame as a shorter file; multi-frame zstd files (``pzstd``, concatenated frames)
and multi-member gzip files are read whole.
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import zstandard

from moejax.errors import DataError

# codec -> (magic bytes, the command that checks a file)
CODECS: Final = {"gzip": (b"\x1f\x8b", "gzip -t"), "zstd": (b"\x28\xb5\x2f\xfd", "zstd -t")}
CHUNK: Final = 1 << 20


def chunks(path: Path | str, codec: str) -> Iterator[bytes]:
    """The decompressed bytes of ``path``, in chunks."""
    try:
        with open(path, "rb") as f:
            yield from (_gzip_chunks(f) if codec == "gzip" else _zstd_chunks(f, path))
    except (OSError, EOFError, zlib.error, zstandard.ZstdError) as e:  # gzip.BadGzipFile is an OSError
        raise _corrupt(path, codec, e) from None


def lines(path: Path | str, codec: str) -> Iterator[bytes]:
    """The decompressed lines of ``path`` (each with its newline, the last one maybe without)."""
    rest = b""
    for chunk in chunks(path, codec):
        parts = (rest + chunk).split(b"\n")
        rest = parts.pop()
        for part in parts:
            yield part + b"\n"
    if rest:
        yield rest


def read_all(path: Path | str, codec: str) -> bytes:
    return b"".join(chunks(path, codec))


def _gzip_chunks(f) -> Iterator[bytes]:
    with gzip.GzipFile(fileobj=f, mode="rb") as stream:
        while chunk := stream.read(CHUNK):
            yield chunk


def _zstd_chunks(f, path: Path | str) -> Iterator[bytes]:
    data = f.read(CHUNK)
    while data:  # one frame per pass
        frame = zstandard.ZstdDecompressor().decompressobj()
        while True:
            if out := frame.decompress(data):
                yield out
            if frame.eof:
                data = frame.unused_data or f.read(CHUNK)
                break
            data = f.read(CHUNK)
            if not data:
                raise _corrupt(path, "zstd", "it ends inside a compressed frame")


def _corrupt(path: Path | str, codec: str, why: object) -> DataError:
    return DataError(f"{path} cannot be read as {codec}-compressed data ({why}): it is cut short or corrupt. "
                     f"Check it with {CODECS[codec][1]} {path}, then recompress or replace it.")
