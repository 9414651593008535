"""Packed training examples: fixed windows of a token stream, with document boundaries marked.

Window ``i`` of a stream is ``tokens[i * seq_len : i * seq_len + seq_len + 1]``. Neighbouring
windows share one token, so every stream token after the first is a target exactly once per
epoch. A window usually holds the end of one document and the start of others; the example
records where they meet so that attention never crosses a document boundary:

==============  ========  =============================================================
field           dtype     meaning, shape ``[seq_len]`` (``domain`` is a scalar)
==============  ========  =============================================================
``inputs``      int32     ``window[:-1]``
``targets``     int32     ``window[1:]``
``segment_ids`` int32     document of each input within the window, counting from 1
``positions``   int32     position of each input within its document
``loss_mask``   float32   0.0 where the target starts a new document (predicting it from the
                          previous document's EOS is impossible), else 1.0
``domain``      int32     index of the example's domain in the run's domain list
==============  ========  =============================================================

Positions restart at 0 at every document start *and at the window start*: a document that began
in an earlier window counts from 0 here too. The model never sees that document's earlier
tokens, so offsets relative to the window are what its attention actually spans.

Padding examples (``padding_example``) have segment id 0 and an all-zero loss mask.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import numpy as np
import numpy.typing as npt

from moejax.data.streams import TokenStream

Example = dict[str, np.ndarray]
FIELDS: Final = ("inputs", "targets", "segment_ids", "positions", "loss_mask", "domain")


def num_windows(num_tokens: int, seq_len: int) -> int:
    """How many full windows of ``seq_len + 1`` tokens a stream of ``num_tokens`` holds."""
    return max(0, (num_tokens - 1) // seq_len)


def window_starts_mask(
    doc_starts: npt.NDArray[np.integer], start: int, length: int
) -> npt.NDArray[np.bool_]:
    """A ``[length]`` mask, True where a document begins in ``stream[start : start + length]``."""
    lo, hi = np.searchsorted(doc_starts, [start, start + length], side="left")
    mask = np.zeros(length, dtype=bool)
    mask[np.asarray(doc_starts[lo:hi], dtype=np.int64) - start] = True
    return mask


def pack_window(
    window: npt.NDArray[np.integer], starts: npt.NDArray[np.bool_], domain: int
) -> Example:
    """The packed example of a ``[seq_len + 1]`` window and its document-start mask."""
    if window.ndim != 1 or window.shape != starts.shape or window.shape[0] < 2:
        raise ValueError(
            f"window and starts must be 1-D of equal length >= 2, got {window.shape} "
            f"and {starts.shape}"
        )
    seq_len = window.shape[0] - 1
    new_doc = starts.copy()
    new_doc[0] = False  # The window's first token opens segment 1 either way.
    segment_ids = 1 + np.cumsum(new_doc, dtype=np.int32)
    index = np.arange(seq_len, dtype=np.int32)
    last_start = np.maximum.accumulate(np.where(new_doc[:-1], index, 0))
    return {
        "inputs": np.asarray(window[:-1], dtype=np.int32),
        "targets": np.asarray(window[1:], dtype=np.int32),
        "segment_ids": segment_ids[:-1],
        "positions": index - last_start,
        "loss_mask": (~new_doc[1:]).astype(np.float32),
        "domain": np.asarray(domain, dtype=np.int32),
    }


def padding_example(seq_len: int, domain: int, pad_id: int) -> Example:
    """An example that contributes nothing: PAD tokens, segment id 0, loss mask 0."""
    pad = np.full(seq_len, pad_id, dtype=np.int32)
    zeros = np.zeros(seq_len, dtype=np.int32)
    return {
        "inputs": pad,
        "targets": pad.copy(),
        "segment_ids": zeros,
        "positions": zeros.copy(),
        "loss_mask": np.zeros(seq_len, dtype=np.float32),
        "domain": np.asarray(domain, dtype=np.int32),
    }


def stack_examples(examples: list[Example]) -> Example:
    """A batch: each field stacked along a new leading axis."""
    return {field: np.stack([ex[field] for ex in examples]) for field in FIELDS}


class WindowPacker:
    """Window index -> packed example, for one domain's stream (a grain map function)."""

    def __init__(self, stream: TokenStream, seq_len: int, domain: int):
        self.stream = stream
        self.seq_len = seq_len
        self.domain = domain
        self.num_windows = num_windows(stream.num_tokens, seq_len)
        self._unchecked = stream.check is not None

    def __call__(self, index: int) -> Example:
        if not 0 <= index < self.num_windows:
            raise IndexError(f"window {index} out of range [0, {self.num_windows})")
        if self._unchecked:  # the stream's file verified the first time a window is read from it
            self.stream.check()  # type: ignore[misc]
            self._unchecked = False
        start, length = int(index) * self.seq_len, self.seq_len + 1
        window = self.stream.tokens[start : start + length]
        starts = window_starts_mask(self.stream.doc_starts, start, length)
        return pack_window(window, starts, self.domain)


class ShardedPacker:
    """Window index -> packed example, over a domain split stored as several shards.

    Windows are numbered shard after shard; a window never spans two shards (each shard's last
    partial window is dropped, at most ``seq_len`` tokens per shard).
    """

    def __init__(self, shards: Sequence[TokenStream], seq_len: int, domain: int):
        self.packers = [WindowPacker(stream, seq_len, domain) for stream in shards]
        self.seq_len = seq_len
        self.domain = domain
        self._first = np.cumsum([0] + [p.num_windows for p in self.packers], dtype=np.int64)
        self.num_windows = int(self._first[-1])
        self.num_tokens = sum(stream.num_tokens for stream in shards)

    def __call__(self, index: int) -> Example:
        if not 0 <= index < self.num_windows:
            raise IndexError(f"window {index} out of range [0, {self.num_windows})")
        shard = int(np.searchsorted(self._first, index, side="right")) - 1
        return self.packers[shard](int(index - self._first[shard]))
