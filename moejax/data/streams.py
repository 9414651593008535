"""Text to tokens: documents become one token stream plus document start offsets.

A ``TokenStream`` is the on-disk and in-memory form of one domain split (or one shard of it):
every document's tokens followed by EOS, concatenated, and the offset at which each document
starts. The pipeline cuts training windows from the stream and uses the offsets to build
segment ids.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt

from moejax.data.tokenizer import Tokenizer


@dataclasses.dataclass(frozen=True)
class TokenStream:
    """Documents as one token stream (each followed by EOS) and their int32 start offsets.

    ``tokens`` is int32, or uint16 where the vocabulary fits (prepared datasets store that to
    halve the disk and page-cache footprint). ``doc_starts`` is sorted, starts at 0 when there
    is at least one document, and ``tokens[doc_starts[i + 1] - 1]`` is the EOS that ends
    document ``i``. ``check`` (optional) verifies the file behind ``tokens`` once, on first read.
    """

    tokens: npt.NDArray[np.integer]
    doc_starts: npt.NDArray[np.int32]
    # Called before the first window is read (a prepared dataset's shard: its checksum and id range
    # against the manifest, ``shard_check.ShardCheck``); raises ``DataError`` on a damaged file.
    check: Callable[[], None] | None = dataclasses.field(default=None, compare=False, repr=False)

    @property
    def num_tokens(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def num_documents(self) -> int:
        return int(self.doc_starts.shape[0])


def token_dtype(vocab_size: int) -> np.dtype:
    """The smallest of uint16 and int32 that holds every id of a ``vocab_size`` vocabulary."""
    return np.dtype(np.uint16) if vocab_size <= 2**16 else np.dtype(np.int32)


def tokenize_documents(
    documents: Sequence[str], tokenizer: Tokenizer, dtype: npt.DTypeLike = np.int32
) -> TokenStream:
    """Encode ``documents`` and concatenate them, each followed by ``tokenizer.eos_id``."""
    encoded = tokenizer.encode_batch(documents) if documents else []
    lengths = np.array([ids.shape[0] + 1 for ids in encoded], dtype=np.int64)
    total = int(lengths.sum())
    if total > np.iinfo(np.int32).max:
        raise ValueError(f"{total} tokens do not fit int32 offsets; split the documents")
    ends = np.cumsum(lengths)
    tokens = np.full(total, tokenizer.eos_id, dtype=dtype)
    is_text = np.ones(total, dtype=bool)
    is_text[ends - 1] = False
    if encoded:
        tokens[is_text] = np.concatenate(encoded)
    return TokenStream(tokens=tokens, doc_starts=(ends - lengths).astype(np.int32))
