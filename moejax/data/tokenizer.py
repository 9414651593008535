"""Tokenizers, named by the id recorded in dataset manifests and checkpoints.

Two kinds:

- ``ByteTokenizer`` (id ``byte``, the default): UTF-8 bytes are ids 0..255, followed by three
  special ids. Nothing to train and no file, so the id alone describes it.
- ``BPETokenizer`` (id ``bpe-<vocab>-<sha>``, see ``bpe``): trained on the user's corpus by
  ``moejax.data.prepare`` and saved as ``tokenizer.json`` beside the data. The id ends with a
  hash of that file, so two BPEs with the same id are the same tokenizer.
- ``HFTokenizer`` (id ``hf-<vocab>-<sha>``, see ``hf_tokenizer``): any Hugging Face tokenizer,
  a ``tokenizer.json`` or a model directory, with the BOS/EOS/PAD its files name (or the caller's).

``load_tokenizer`` turns any of ``"byte"``, a ``tokenizer.json`` path, a Hugging Face model
directory or a prepared dataset directory into a tokenizer; ``check_tokenizer_matches`` is the guard a resumed or evaluated
checkpoint goes through: the model only makes sense with the tokenizer it was trained with.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final, Protocol

import numpy as np
import numpy.typing as npt

from moejax.data import layout
from moejax.errors import DataError


class Tokenizer(Protocol):
    """What the data pipeline needs from a tokenizer. ``name`` is its id."""

    name: str
    eos_id: int
    pad_id: int
    vocab_size: int

    def encode(self, text: str) -> npt.NDArray[np.int32]: ...

    def encode_batch(self, texts: Sequence[str]) -> list[npt.NDArray[np.int32]]: ...

    def decode(self, ids: npt.ArrayLike) -> str: ...


class ByteTokenizer:
    """UTF-8 byte tokenizer: ids 0..255 are bytes, then BOS (256), EOS (257) and PAD (258)."""

    name: Final[str] = "byte"
    bos_id: Final[int] = 256
    eos_id: Final[int] = 257
    pad_id: Final[int] = 258
    vocab_size: Final[int] = 259

    def encode(self, text: str) -> npt.NDArray[np.int32]:
        """Return the UTF-8 bytes of ``text`` as int32 ids; no special ids are added."""
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int32)

    def encode_batch(self, texts: Sequence[str]) -> list[npt.NDArray[np.int32]]:
        """``encode`` of each text."""
        return [self.encode(text) for text in texts]

    def decode(self, ids: npt.ArrayLike) -> str:
        """Return the text of ``ids``, skipping special ids; invalid UTF-8 becomes U+FFFD."""
        ids_n = np.asarray(ids).reshape(-1)
        if ids_n.size and not np.issubdtype(ids_n.dtype, np.integer):
            raise TypeError(f"token ids must be integers, got dtype {ids_n.dtype}")
        outside = (ids_n < 0) | (ids_n >= self.vocab_size)
        if outside.any():
            bad = int(ids_n[outside][0])
            raise ValueError(f"token id {bad} is outside the vocabulary [0, {self.vocab_size})")
        return ids_n[ids_n < 256].astype(np.uint8).tobytes().decode("utf-8", errors="replace")


def get_tokenizer(name: str) -> Tokenizer:
    """The tokenizer with id ``name`` among those that need no file (only ``"byte"``)."""
    if name != ByteTokenizer.name:
        raise ValueError(
            f"unknown tokenizer name {name!r}; allowed names: ['byte'] (a BPE is loaded from its "
            "tokenizer.json with load_tokenizer)"
        )
    return ByteTokenizer()


def load_tokenizer(spec: str | os.PathLike[str], special_tokens: Mapping[str, str | None] | None = None) -> Tokenizer:
    """The tokenizer named by ``spec``: ``"byte"``, a prepared dataset directory, a moejax BPE's
    ``tokenizer.json``, or any Hugging Face tokenizer (a ``tokenizer.json`` or a model directory
    holding one; see ``hf_tokenizer``).

    A dataset directory yields the tokenizer its ``dataset.json`` records; the ``tokenizer.json``
    beside it must hash to the recorded id. ``special_tokens`` (role ``bos``/``eos``/``pad`` ->
    token text) overrides those a Hugging Face tokenizer's files name.
    """
    # Imports HF tokenizers: only when a file is asked for.
    from moejax.data.bpe import SPECIAL_TOKENS, BPETokenizer
    from moejax.data.hf_tokenizer import (CONFIG_FILE, TOKENIZER_FILE, is_byte_tokenizer, load_hf_tokenizer,
                                          parse_tokenizer_json, read_tokenizer_json)

    overrides = {role: token for role, token in (special_tokens or {}).items() if token is not None}
    path = Path(spec)
    is_dataset = path.is_dir() and (path / layout.DATASET_FILE).is_file()
    if overrides and (str(spec) == ByteTokenizer.name or is_dataset):
        flags = ", ".join(f"--{role}-token" for role in overrides)
        raise DataError(f"{flags} apply to a Hugging Face tokenizer file or model directory, not to tokenizer "
                        f"{str(spec)!r}, whose special tokens are fixed. Drop {flags}, or pass a tokenizer.json.")
    if str(spec) == ByteTokenizer.name:
        return ByteTokenizer()
    if path.is_file():
        if not overrides and not (path.parent / CONFIG_FILE).is_file():
            text = read_tokenizer_json(path)
            parsed = parse_tokenizer_json(text, str(path))
            if None not in [parsed.token_to_id(token) for token in SPECIAL_TOKENS]:
                return BPETokenizer(text, source=str(path))  # a BPE trained by moejax.data.prepare
        hf = load_hf_tokenizer(path, overrides)
        return ByteTokenizer() if is_byte_tokenizer(hf) else hf
    if path.is_dir() and not is_dataset and (path / TOKENIZER_FILE).is_file():
        hf = load_hf_tokenizer(path, overrides)  # an export of a byte-tokenizer run is the byte tokenizer
        return ByteTokenizer() if is_byte_tokenizer(hf) else hf
    if path.is_dir():
        recorded = dataset_tokenizer_id(path)
        if recorded == ByteTokenizer.name:
            return ByteTokenizer()
        tokenizer: Tokenizer
        if recorded.startswith("hf-"):
            tokenizer = load_hf_tokenizer(path)
        else:
            tokenizer = BPETokenizer.from_file(path / layout.TOKENIZER_FILE)
        if tokenizer.name != recorded:
            raise DataError(
                f"{path / layout.TOKENIZER_FILE} is tokenizer {tokenizer.name!r}, but "
                f"{path / layout.DATASET_FILE} says the data was tokenized with {recorded!r}: the "
                "file was replaced after preparing. Restore the original tokenizer.json, or "
                "prepare the sources again into a new directory."
            )
        return tokenizer
    if str(spec).startswith(("bpe-", "hf-")):
        raise DataError(
            f"tokenizer {str(spec)!r} is a {'trained BPE' if str(spec).startswith('bpe-') else 'tokenizer id'}: load it from the tokenizer.json beside its "
            "data, e.g. load_tokenizer('<dataset dir>') or load_tokenizer('<dataset dir>/tokenizer.json')."
        )
    raise DataError(
        f"tokenizer {str(spec)!r} is neither 'byte' nor an existing tokenizer.json, Hugging Face model "
        "directory or prepared dataset directory. Pass 'byte', a tokenizer.json path, a directory holding "
        "one, or a directory written by python -m moejax.data.prepare."
    )


def dataset_tokenizer_id(dataset_dir: str | os.PathLike[str]) -> str:
    """The tokenizer id a prepared dataset's ``dataset.json`` records."""
    path = Path(dataset_dir) / layout.DATASET_FILE
    if not path.is_file():
        raise DataError(
            f"{dataset_dir} is not a prepared dataset: it has no {layout.DATASET_FILE}. Create it "
            f"with: python -m moejax.data.prepare --source DOMAIN=PATH --out {dataset_dir}"
        )
    with open(path, encoding="utf-8") as f:
        return str(json.load(f)["tokenizer"])


def check_tokenizer_matches(
    data_tokenizer_id: str,
    checkpoint_tokenizer_id: str,
    *,
    data_source: str = "the data",
    checkpoint: str = "the checkpoint",
    fix: str | None = None,
) -> None:
    """Raise a ``DataError`` unless the data and the checkpoint use the same tokenizer.

    Call it before resuming or evaluating a checkpoint: token ids from another tokenizer would
    index the wrong embedding rows and produce meaningless losses without any other error.
    ``data_source`` and ``checkpoint`` (e.g. a path) make the message name both sides; ``fix``
    replaces the default advice.
    """
    if data_tokenizer_id == checkpoint_tokenizer_id:
        return
    raise DataError(
        f"tokenizer mismatch: {data_source} is tokenized with {data_tokenizer_id!r}, but "
        f"{checkpoint} was trained with {checkpoint_tokenizer_id!r}. "
        + (fix or "Use the data the checkpoint was trained on (the data.path recorded in its config.json, "
           "tokenized with the same tokenizer), or train from scratch in a fresh --workdir.")
    )
