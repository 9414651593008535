"""Safetensors files read one tensor at a time and written as a stream of shards.

A safetensors file is an 8-byte little-endian header length, a JSON header (per tensor: dtype,
shape, byte offsets into the data; ``__metadata__``), then the raw bytes. Reading here takes one
tensor with a plain file read (no memory map, so the pages of tensors already converted are not
held by the process), and writing plans every shard's header from the tensors' names, shapes and
dtypes before any data exists, then appends each tensor's bytes as it is produced: the whole
state dict is never in memory at once.

Shards follow ``save_pretrained``: one ``model.safetensors`` when everything fits in
``max_shard_size``, else ``model-0000i-of-0000n.safetensors`` and ``model.safetensors.index.json``
(``metadata.total_size``, ``weight_map``: tensor -> file).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import struct
from typing import Any, Iterable, Iterator, Mapping

import ml_dtypes
import numpy as np

from moejax.interop.hf.errors import InteropError

SINGLE_FILE, INDEX_FILE = "model.safetensors", "model.safetensors.index.json"
DEFAULT_MAX_SHARD_SIZE = "50GB"  # save_pretrained's default (transformers 5)

DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype(np.float64), "F32": np.dtype(np.float32), "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16), "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2), "I64": np.dtype(np.int64), "I32": np.dtype(np.int32),
    "I16": np.dtype(np.int16), "I8": np.dtype(np.int8), "U8": np.dtype(np.uint8), "BOOL": np.dtype(np.bool_),
}
_CODES = {dtype: code for code, dtype in DTYPES.items()}
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_size(text: str | int) -> int:
    """Bytes of a size such as ``5GB`` (10^9), ``2GiB`` (2^30), ``500MB`` or a plain integer."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]I?B|B)?\s*", str(text), re.IGNORECASE)
    if not match or float(match.group(1)) <= 0:
        raise InteropError(f"--max-shard-size {text!r} is not a size; use e.g. 5GB, 500MB, 2GiB or a byte count.")
    return int(float(match.group(1)) * _UNITS[(match.group(2) or "").upper()])


def format_size(n: int) -> str:
    for unit, scale in (("GB", 10**9), ("MB", 10**6), ("KB", 10**3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


# ----------------------------------------------------------------------------------------- read


def _read_header(path: str) -> tuple[dict[str, Any], int]:
    """(the JSON header, the byte offset where the data starts) of one safetensors file."""
    try:
        with open(path, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            if length > 100 * 2**20:
                raise ValueError(f"header length {length} is implausible")
            header = json.loads(f.read(length))
    except (OSError, ValueError, struct.error) as e:
        raise InteropError(f"{path} cannot be read as safetensors ({e}); re-save the checkpoint with "
                           "save_pretrained(..., safe_serialization=True).") from None
    return header, 8 + length


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    file: str
    dtype: np.dtype
    shape: tuple[int, ...]
    start: int  # absolute byte offset in ``file``
    nbytes: int


class HFTensors(Mapping[str, np.ndarray]):
    """The tensors of a checkpoint directory, read one at a time when indexed.

    Only the headers are read when it is opened; a shard the index names but the directory lacks
    is an error before any tensor is read.
    """

    def __init__(self, directory: str):
        self.directory = directory
        self.info: dict[str, TensorInfo] = {}
        for name in checkpoint_files(directory):
            path = os.path.join(directory, name)
            header, data_start = _read_header(path)
            for key, entry in header.items():
                if key == "__metadata__":
                    continue
                if entry["dtype"] not in DTYPES:
                    raise InteropError(f"{path}: tensor {key!r} has dtype {entry['dtype']}; readable: "
                                       f"{', '.join(DTYPES)}.")
                begin, end = entry["data_offsets"]
                self.info[key] = TensorInfo(path, DTYPES[entry["dtype"]], tuple(entry["shape"]),
                                            data_start + begin, end - begin)

    def __getitem__(self, name: str) -> np.ndarray:
        info = self.info[name]
        with open(info.file, "rb") as f:
            f.seek(info.start)
            data = np.fromfile(f, dtype=info.dtype, count=info.nbytes // info.dtype.itemsize)
        if data.nbytes != info.nbytes:
            raise InteropError(f"{info.file} ends inside tensor {name!r}; the file is truncated (copy it again).")
        return data.reshape(info.shape)

    def __iter__(self) -> Iterator[str]:
        return iter(self.info)

    def __len__(self) -> int:
        return len(self.info)

    def dtype(self, name: str) -> np.dtype:
        return self.info[name].dtype

    def shape(self, name: str) -> tuple[int, ...]:
        return self.info[name].shape


def checkpoint_files(directory: str) -> list[str]:
    """The safetensors files of a checkpoint directory (the index's shards, or the single file).

    Every shard the index names must exist: a missing one is named with a tensor it holds.
    """
    index = os.path.join(directory, INDEX_FILE)
    if os.path.isfile(index):
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise InteropError(f"{index} has no 'weight_map' (tensor name -> shard file); is it a "
                               "save_pretrained index?")
        files = sorted(set(weight_map.values()))
        missing = [f for f in files if not os.path.isfile(os.path.join(directory, f))]
        if missing:
            example = next(t for t, f in weight_map.items() if f == missing[0])
            raise InteropError(
                f"{index} lists shard {missing[0]!r} (holding e.g. {example!r}), which {directory} does not "
                f"have ({len(missing)} of {len(files)} shard(s) missing: {missing[:4]}); copy or download the "
                "complete checkpoint."
            )
        return files
    if os.path.isfile(os.path.join(directory, SINGLE_FILE)):
        return [SINGLE_FILE]
    raise InteropError(
        f"{directory} has neither {SINGLE_FILE} nor {INDEX_FILE}; only safetensors checkpoints are read "
        "(re-save a .bin checkpoint with save_pretrained(..., safe_serialization=True))."
    )


def read_json(path: str) -> dict[str, Any]:
    """A JSON object file of an HF directory; an ``InteropError`` naming it if it is not one."""
    try:
        with open(path) as f:
            value = json.load(f)
    except (OSError, ValueError) as e:
        raise InteropError(f"{path} is not readable JSON ({e}); is the checkpoint complete?") from None
    if not isinstance(value, dict):
        raise InteropError(f"{path} holds {type(value).__name__}, not a JSON object; is it a save_pretrained file?")
    return value


# ---------------------------------------------------------------------------------------- write


@dataclasses.dataclass(frozen=True)
class Spec:
    """A tensor to be written: its name, shape and dtype (its bytes come later)."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


def plan_shards(specs: list[Spec], max_shard_size: int) -> list[list[Spec]]:
    """Consecutive tensors packed into shards of at most ``max_shard_size`` bytes.

    A tensor larger than the limit is an error (before anything is written) naming it.
    """
    largest = max(specs, key=lambda s: s.nbytes)
    if largest.nbytes > max_shard_size:
        raise InteropError(
            f"tensor {largest.name!r} {list(largest.shape)} {largest.dtype.name} takes {largest.nbytes} bytes "
            f"({format_size(largest.nbytes)}), more than --max-shard-size {max_shard_size} bytes "
            f"({format_size(max_shard_size)}); a tensor is never split across shards. Pass --max-shard-size "
            f"{largest.nbytes} or more."
        )
    shards: list[list[Spec]] = [[]]
    size = 0
    for spec in specs:
        if shards[-1] and size + spec.nbytes > max_shard_size:
            shards.append([])
            size = 0
        shards[-1].append(spec)
        size += spec.nbytes
    return shards


def shard_names(count: int) -> list[str]:
    if count == 1:
        return [SINGLE_FILE]
    return [f"model-{i + 1:05d}-of-{count:05d}.safetensors" for i in range(count)]


def _header(specs: list[Spec]) -> bytes:
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}  # transformers checks for it
    offset = 0
    for spec in specs:
        if spec.dtype not in _CODES:
            raise InteropError(f"tensor {spec.name!r} has dtype {spec.dtype}, which safetensors cannot hold.")
        header[spec.name] = {"dtype": _CODES[spec.dtype], "shape": list(spec.shape),
                             "data_offsets": [offset, offset + spec.nbytes]}
        offset += spec.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned
    return struct.pack("<Q", len(raw)) + raw


def write_shards(
    directory: str, specs: list[Spec], tensors: Iterable[tuple[str, np.ndarray]], max_shard_size: int,
) -> list[str]:
    """Writes ``tensors`` (yielded in the order of ``specs``, matching them) into shards; returns
    the file names. Holds one tensor at a time (plus what the caller's iterator holds)."""
    shards = plan_shards(specs, max_shard_size)
    names = shard_names(len(shards))
    source = iter(tensors)
    for name, shard in zip(names, shards):
        with open(os.path.join(directory, name), "wb") as f:
            f.write(_header(shard))
            for spec in shard:
                key, value = next(source)
                if key != spec.name or tuple(value.shape) != spec.shape or value.dtype != spec.dtype:
                    raise AssertionError(f"tensor {key} {value.shape} {value.dtype} does not match the plan {spec}")
                f.write(np.ascontiguousarray(value).reshape(-1).view(np.uint8).data)
                del value  # (often a view of a larger array the source is about to release)
    if next(source, None) is not None:
        raise AssertionError("more tensors than planned")
    if len(shards) > 1:
        weight_map = {spec.name: name for name, shard in zip(names, shards) for spec in shard}
        index = {"metadata": {"total_size": sum(s.nbytes for s in specs)}, "weight_map": weight_map}
        with open(os.path.join(directory, INDEX_FILE), "w") as f:
            json.dump(index, f, indent=2)
    return names
