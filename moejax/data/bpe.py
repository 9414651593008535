"""Byte-level BPE trained on the user's corpus with HF ``tokenizers``; nothing is downloaded.

The model is GPT-2 style: text is split by the byte-level pre-tokenizer (words, numbers,
punctuation, whitespace runs), every byte has a base token (so no text is ever unknown), and
merges are learned from the corpus up to ``vocab_size``. Three special tokens take ids 0..2:
``<|bos|>``, ``<|eos|>``, ``<|pad|>``; they are never produced by ``encode``.

The tokenizer is saved as one ``tokenizer.json``; its id is ``bpe-<vocab>-<sha>`` where
``<sha>`` is the first 12 hex digits of that file's sha256. Training is deterministic: the same
texts in the same order give the same file, hence the same id.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Final

import tokenizers
from tokenizers import decoders, models, pre_tokenizers, trainers

from moejax.data.hf_tokenizer import HFTokenizer, parse_tokenizer_json
from moejax.errors import DataError

BOS, EOS, PAD = "<|bos|>", "<|eos|>", "<|pad|>"
SPECIAL_TOKENS: Final = (BOS, EOS, PAD)
MIN_VOCAB_SIZE: Final = 256 + len(SPECIAL_TOKENS) + 1  # every byte, the specials, one merge


def bpe_id(json_text: str, vocab_size: int) -> str:
    """The id of the BPE serialised as ``json_text``."""
    return f"bpe-{vocab_size}-{hashlib.sha256(json_text.encode('utf-8')).hexdigest()[:12]}"


class BPETokenizer(HFTokenizer):
    """A trained byte-level BPE; ``name`` is its id ``bpe-<vocab>-<sha>`` (the hash of the file's text)."""

    def __init__(self, json_text: str, *, source: str = "<string>"):
        tokenizer = parse_tokenizer_json(json_text, source)
        if None in [tokenizer.token_to_id(token) for token in SPECIAL_TOKENS]:
            raise DataError(f"{source} lacks the special tokens {SPECIAL_TOKENS}: it was not "
                            "written by moejax.data.prepare. Prepare the dataset again, or pass it as an "
                            "external tokenizer (prepare --tokenizer PATH).")
        super().__init__(json_text, bos=BOS, eos=EOS, pad=PAD, source=source)
        self.json_text = json_text
        self.name = bpe_id(json_text, self.vocab_size)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> BPETokenizer:
        """Load a ``tokenizer.json`` written by ``save``."""
        if not Path(path).is_file():
            raise DataError(f"tokenizer file {path} does not exist; prepare the dataset again "
                            "(python -m moejax.data.prepare ... --tokenizer bpe).")
        return cls(Path(path).read_text(encoding="utf-8"), source=str(path))

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the ``tokenizer.json`` (byte-identical to the text the id was computed from)."""
        Path(path).write_text(self.json_text, encoding="utf-8")


def train_bpe(texts: Iterable[str], vocab_size: int) -> BPETokenizer:
    """Train a byte-level BPE of at most ``vocab_size`` tokens on ``texts`` (its speed: docs/data.md,
    "Throughput"). A small corpus may stop short of ``vocab_size``: no merge is left."""
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < MIN_VOCAB_SIZE:
        raise DataError(f"BPE vocab size must be an int >= {MIN_VOCAB_SIZE} (256 bytes, "
                        f"{len(SPECIAL_TOKENS)} special tokens and one merge), got {vocab_size!r}.")
    tokenizer = tokenizers.Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    return BPETokenizer(tokenizer.to_str())
