"""Tokenizers, looked up by the string name recorded in checkpoints and cache manifests.

The only tokenizer so far is ``ByteTokenizer``: UTF-8 bytes are ids 0..255, followed by three
special ids. It needs no training and no vocabulary file, so a run's data is fully described by
the corpus manifest plus the tokenizer name.
"""

from __future__ import annotations

from typing import Final, Protocol

import numpy as np
import numpy.typing as npt


class Tokenizer(Protocol):
    """What the data pipeline needs from a tokenizer."""

    name: str
    eos_id: int
    pad_id: int
    vocab_size: int

    def encode(self, text: str) -> npt.NDArray[np.int32]: ...

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


_TOKENIZERS: Final = {ByteTokenizer.name: ByteTokenizer}


def get_tokenizer(name: str) -> Tokenizer:
    """Return the tokenizer registered under ``name`` (e.g. the name stored in a checkpoint)."""
    if name not in _TOKENIZERS:
        raise ValueError(f"unknown tokenizer name {name!r}; allowed names: {sorted(_TOKENIZERS)}")
    return _TOKENIZERS[name]()
