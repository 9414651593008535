"""Files: a Hugging Face checkpoint directory (``config.json`` + safetensors, one file or shards
listed by an index) read and written with numpy only."""

from __future__ import annotations

import json
import os
from typing import Any, Mapping

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load_file, save_file

from moejax.interop.hf.errors import InteropError

SINGLE_FILE, INDEX_FILE = "model.safetensors", "model.safetensors.index.json"


def read_hf_dir(path: str) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """config.json and every tensor of model.safetensors (or the shards its index lists)."""
    config_path = os.path.join(path, "config.json")
    if not os.path.isfile(config_path):
        raise InteropError(f"{path} has no config.json; expected a directory written by save_pretrained.")
    hf = _read_hf_json(config_path)
    index = os.path.join(path, INDEX_FILE)
    if os.path.isfile(index):
        files = sorted(set(_read_hf_json(index).get("weight_map", {}).values()))
    elif os.path.isfile(os.path.join(path, SINGLE_FILE)):
        files = [SINGLE_FILE]
    else:
        raise InteropError(
            f"{path} has neither {SINGLE_FILE} nor {INDEX_FILE}; only safetensors checkpoints are read "
            "(re-save a .bin checkpoint with save_pretrained(..., safe_serialization=True))."
        )
    tensors: dict[str, np.ndarray] = {}
    for name in files:
        try:
            tensors.update(load_file(os.path.join(path, name)))
        except (OSError, SafetensorError) as e:
            raise InteropError(f"{os.path.join(path, name)} cannot be read as safetensors ({e}); re-save the "
                               "checkpoint with save_pretrained(..., safe_serialization=True).") from None
    return hf, tensors


def _read_hf_json(path: str) -> dict[str, Any]:
    """A JSON object file of an HF directory; an ``InteropError`` naming it if it is not one."""
    try:
        with open(path) as f:
            value = json.load(f)
    except (OSError, ValueError) as e:
        raise InteropError(f"{path} is not readable JSON ({e}); is the checkpoint complete?") from None
    if not isinstance(value, dict):
        raise InteropError(f"{path} holds {type(value).__name__}, not a JSON object; is it a save_pretrained file?")
    return value


def write_hf_dir(path: str, hf: Mapping[str, Any], tensors: Mapping[str, np.ndarray]) -> None:
    """config.json and one model.safetensors (with the metadata transformers checks for)."""
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(hf, f, indent=2, sort_keys=True)
    save_file(dict(tensors), os.path.join(path, SINGLE_FILE), metadata={"format": "pt"})
