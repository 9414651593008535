"""Files: a Hugging Face checkpoint directory (``config.json`` + safetensors, one file or shards
listed by an index) read and written with numpy only (the streaming parts: ``safetensors_io``)."""

from __future__ import annotations

import json
import os
from typing import Any, Mapping

import numpy as np

from moejax.interop.hf.errors import InteropError
from moejax.interop.hf.safetensors_io import (
    DEFAULT_MAX_SHARD_SIZE,
    INDEX_FILE,
    SINGLE_FILE,
    HFTensors,
    Spec,
    parse_size,
    read_json,
    write_shards,
)

__all__ = ["INDEX_FILE", "SINGLE_FILE", "open_hf_dir", "read_hf_dir", "write_config", "write_hf_dir"]


def open_hf_dir(path: str) -> tuple[dict[str, Any], HFTensors]:
    """config.json and the checkpoint's tensors, read lazily (one tensor per lookup).

    A missing config.json, a missing shard or an unreadable header is an error here, before any
    tensor is read."""
    config_path = os.path.join(path, "config.json")
    if not os.path.isfile(config_path):
        raise InteropError(f"{path} has no config.json; expected a directory written by save_pretrained.")
    return read_json(config_path), HFTensors(path)


def read_hf_dir(path: str) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """config.json and every tensor of model.safetensors (or the shards its index lists), in memory."""
    hf, tensors = open_hf_dir(path)
    return hf, dict(tensors)


def write_config(path: str, hf: Mapping[str, Any]) -> None:
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(hf, f, indent=2, sort_keys=True)


def write_hf_dir(
    path: str, hf: Mapping[str, Any], tensors: Mapping[str, np.ndarray],
    max_shard_size: str | int = DEFAULT_MAX_SHARD_SIZE,
) -> list[str]:
    """config.json and the tensors as model.safetensors, or as shards of at most
    ``max_shard_size`` with model.safetensors.index.json; returns the safetensors file names."""
    write_config(path, hf)
    specs = [Spec(name, tuple(v.shape), v.dtype) for name, v in tensors.items()]
    return write_shards(path, specs, tensors.items(), parse_size(max_shard_size))
