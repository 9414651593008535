"""A prepared dataset's shards checked where training reads them.

``check_shards(path, vocab_size)`` is cheap enough to run at every start (``check_data_config``
calls it, before anything is compiled): every shard file's ``.npy`` header and byte size against
its manifest entry (a truncated or cut-short file is named), and, for the first shard of each
domain split (what the first batches read), the sha256 recorded when it was written and the token
ids against the vocabulary. Every other shard gets the same content check the first time the
pipeline reads a window of it (``ShardCheck``, which ``dataset.open_dataset`` attaches to each
token stream): a file whose bytes were replaced (header intact) would otherwise train on garbage
ids, its steps non-finite and skipped. Each file is hashed once per process (the cost is one read
of the dataset, spread over the first batches that touch each shard; the data-throughput
benchmark reports it). ``verify_dataset`` (moejax.data) checks every file at once.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path

import numpy as np

from moejax.data import layout
from moejax.errors import DataError

_VERIFIED: set[tuple[str, int, int]] = set()  # (path, size, mtime_ns) hashed once per process


def check_shards(path: str | os.PathLike[str], vocab_size: int) -> None:
    """Raises a ``DataError`` naming the first shard file that is cut short, does not match its
    manifest, or (first shard of a split) fails its checksum or holds ids outside ``vocab_size``."""
    directory = Path(path)
    with open(directory / layout.DATASET_FILE, encoding="utf-8") as f:
        domains = sorted(json.load(f).get("domains", ()))
    for domain in domains:
        manifest_path = directory / domain / layout.MANIFEST_FILE
        if not manifest_path.is_file():
            continue  # describe_dataset / open_dataset name it
        with open(manifest_path, encoding="utf-8") as f:
            manifest = json.load(f)
        for index, shard in enumerate(manifest["shards"]):
            for split in layout.SPLITS:
                entry = shard["splits"][split]
                for array, dtype, length in (("tokens", manifest["dtype"], entry["tokens"]),
                                             ("doc_starts", "int32", entry["documents"])):
                    file = entry["files"][array]
                    file_path = directory / domain / file["name"]
                    _check_size(file_path, np.dtype(dtype), int(length))
                    if index == 0 and array == "tokens":
                        ShardCheck(str(file_path), file.get("sha256"), vocab_size)()


@dataclasses.dataclass(frozen=True)
class ShardCheck:
    """One token file's content check: its sha256 against the manifest's (when recorded) and its
    ids against the vocabulary; raises a ``DataError`` naming the file and the fix. Cheap to call
    again: a file is hashed once per process (keyed by path, size and modification time)."""

    path: str
    sha256: str | None
    vocab_size: int

    def __call__(self) -> None:
        _check_content(Path(self.path), self.sha256, self.vocab_size)


def check_checksum(file_path: Path, sha256: str) -> None:
    """Raises a ``DataError`` unless the file's sha256 is ``sha256`` (what its manifest recorded)."""
    h = hashlib.sha256()
    with open(file_path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    if h.hexdigest() != sha256:
        raise DataError(f"shard file {file_path} does not match the sha256 recorded in its manifest when it was "
                        f"written: its bytes changed. {_fix(file_path)}")


def _fix(file_path: Path) -> str:
    return (f"The file is damaged: rerun the prepare command that wrote {file_path.parent.parent} (delete "
            f"{file_path.parent / (file_path.name.split('.')[0] + '.json')} first, so that shard is redone).")


def _check_size(file_path: Path, dtype: np.dtype, length: int) -> None:
    try:
        with open(file_path, "rb") as f:
            version = np.lib.format.read_magic(f)
            read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, _, found = read_header(f)
            offset = f.tell()
        size = os.path.getsize(file_path)
    except FileNotFoundError:
        raise DataError(f"shard file {file_path} is missing. {_fix(file_path)}") from None
    except (OSError, ValueError) as e:
        raise DataError(f"shard file {file_path} is not a readable .npy file ({e}). {_fix(file_path)}") from None
    if found != dtype or tuple(shape) != (length,):
        raise DataError(f"shard file {file_path} holds {found}[{', '.join(map(str, shape))}], but its manifest "
                        f"says {dtype}[{length}]. {_fix(file_path)}")
    expected = offset + length * dtype.itemsize
    if size != expected:
        what = "cut short (truncated)" if size < expected else "longer than its header says"
        raise DataError(f"shard file {file_path} is {what}: {size:,} bytes where its header and manifest need "
                        f"{expected:,}. {_fix(file_path)}")


def _check_content(file_path: Path, sha256: str | None, vocab_size: int) -> None:
    stat = os.stat(file_path)
    key = (str(file_path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key in _VERIFIED:
        return
    if sha256:
        check_checksum(file_path, sha256)
    tokens = np.load(file_path, mmap_mode="r", allow_pickle=False)
    top = int(tokens.max()) if tokens.size else -1
    if top >= vocab_size:
        raise DataError(f"shard file {file_path} holds token id {top}, outside the tokenizer's vocabulary of "
                        f"{vocab_size} ids. {_fix(file_path)}")
    _VERIFIED.add(key)
