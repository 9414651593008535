"""Any Hugging Face tokenizer: a ``tokenizer.json`` (the ``tokenizers`` library's format), alone
or in a model directory, with its special tokens read from the files beside it.

Special tokens are named by their text. Each comes from, in order: the caller's override (``prepare
--bos-token/--eos-token/--pad-token``), ``tokenizer_config.json``, ``special_tokens_map.json``.
EOS is required (moejax ends every document with it); PAD defaults to the tokenizer's own padding
token when its special tokens hold exactly one (``<pad>``, ``<|pad|>``, ``[PAD]``, ``<|padding|>``),
else to EOS; BOS is optional (moejax adds no special tokens when encoding). The unknown token is
the model's own (``unk_token``/``unk_id`` in ``tokenizer.json``), written to the exported
``tokenizer_config.json`` so transformers knows it. No moejax-specific token is needed.

The id is ``hf-<vocab>-<sha>``: ``<sha>`` is the first 12 hex digits of the sha256 of the
tokenizer's canonical serialisation (``tokenizers``' ``to_str()``), so the same tokenizer saved
with other whitespace or key order has the same id, and any change to its vocabulary, merges,
normalisation or pre-tokenisation gives another. The special tokens are recorded beside it.

A tokenizer is saved as ``tokenizer.json`` plus a ``tokenizer_config.json`` naming its special
tokens (``save_files``): a directory ``transformers.AutoTokenizer.from_pretrained`` reads.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import tokenizers
from tokenizers import decoders, models, pre_tokenizers

from moejax.errors import DataError

log = logging.getLogger(__name__)

TOKENIZER_FILE: Final = "tokenizer.json"
CONFIG_FILE: Final = "tokenizer_config.json"
SPECIAL_MAP_FILE: Final = "special_tokens_map.json"
ROLES: Final = ("bos", "eos", "pad")
# Written into tokenizer_config.json: the transformers class that reads a bare tokenizer.json.
FAST_CLASS: Final = "PreTrainedTokenizerFast"


def parse_tokenizer_json(json_text: str, source: str) -> tokenizers.Tokenizer:
    """``json_text`` as a ``tokenizers.Tokenizer``; a ``DataError`` naming ``source`` if it is not one."""
    try:
        return tokenizers.Tokenizer.from_str(json_text)
    except Exception as e:  # tokenizers raises a bare Exception on malformed JSON
        raise DataError(
            f"{source} is not a tokenizer file the tokenizers library can read ({e}). Allowed: a "
            f"{TOKENIZER_FILE} written by tokenizers' Tokenizer.save or transformers' save_pretrained, or "
            f"a directory holding one. Re-save it with AutoTokenizer.from_pretrained(...).save_pretrained(DIR) "
            f"and pass DIR."
        ) from None


def read_tokenizer_json(file: Path) -> str:
    """The text of a tokenizer file; a ``DataError`` naming it if it cannot be read as UTF-8."""
    try:
        return file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"tokenizer file {file} cannot be read as text ({e}); pass a {TOKENIZER_FILE} "
                        "written by tokenizers or transformers.") from None


def hf_id(canonical_json: str, vocab_size: int) -> str:
    """The id of the tokenizer whose canonical serialisation is ``canonical_json``."""
    return f"hf-{vocab_size}-{hashlib.sha256(canonical_json.encode('utf-8')).hexdigest()[:12]}"


class HFTokenizer:
    """A ``tokenizers`` tokenizer with named BOS (optional), EOS and PAD tokens.

    ``vocab_size`` is one more than the largest id (added tokens included): what the model's
    embedding must hold. ``encode`` adds no special tokens; ``decode`` skips them.
    """

    def __init__(self, json_text: str, *, eos: str, pad: str | None = None, bos: str | None = None,
                 source: str = "<string>"):
        self._tokenizer = parse_tokenizer_json(json_text, source)
        self.source = source
        self.json_text = self._tokenizer.to_str()
        vocab = self._tokenizer.get_vocab(with_added_tokens=True)
        self.vocab_size = max(vocab.values(), default=-1) + 1
        self.name = hf_id(self.json_text, self.vocab_size)
        self.bos_token, self.eos_token, self.pad_token = bos, eos, eos if pad is None else pad
        self.bos_id = None if bos is None else self._special_id("bos", bos)
        self.eos_id = self._special_id("eos", eos)
        self.pad_id = self._special_id("pad", self.pad_token)
        self.unk_token = model_unk_token(self.json_text)  # the model's own: not a choice, so not in special_tokens

    def _special_id(self, role: str, token: str) -> int:
        token_id = self._tokenizer.token_to_id(token)
        if token_id is None:
            raise DataError(
                f"{self.source}: the {role} token {token!r} is not in the tokenizer's vocabulary. Allowed: "
                f"one of its tokens, e.g. its special tokens {special_tokens(self._tokenizer)[:12]}. Pass "
                f"--{role}-token TOKEN."
            )
        return int(token_id)

    @property
    def special_tokens(self) -> dict[str, str | None]:
        """``{"bos": ..., "eos": ..., "pad": ...}``: the token texts (BOS may be None)."""
        return {"bos": self.bos_token, "eos": self.eos_token, "pad": self.pad_token}

    def encode(self, text: str) -> npt.NDArray[np.int32]:
        """Token ids of ``text`` (int32); no special ids are added."""
        return np.asarray(self._tokenizer.encode(text, add_special_tokens=False).ids, np.int32)

    def encode_batch(self, texts: Sequence[str]) -> list[npt.NDArray[np.int32]]:
        """``encode`` of each text, in parallel inside the Rust library."""
        encodings = self._tokenizer.encode_batch_fast(list(texts), add_special_tokens=False)
        return [np.asarray(e.ids, np.int32) for e in encodings]

    def decode(self, ids: npt.ArrayLike) -> str:
        """The text of ``ids``, special ids skipped."""
        ids_n = np.asarray(ids).reshape(-1)
        if ids_n.size and not np.issubdtype(ids_n.dtype, np.integer):
            raise TypeError(f"token ids must be integers, got dtype {ids_n.dtype}")
        outside = (ids_n < 0) | (ids_n >= self.vocab_size)
        if outside.any():
            bad = int(ids_n[outside][0])
            raise ValueError(f"token id {bad} is outside the vocabulary [0, {self.vocab_size})")
        return self._tokenizer.decode(ids_n.tolist(), skip_special_tokens=True)

    def tokenizer_config(self) -> dict[str, Any]:
        """The ``tokenizer_config.json`` that makes ``transformers.AutoTokenizer`` read this tokenizer."""
        config: dict[str, Any] = {"tokenizer_class": FAST_CLASS, "add_bos_token": False, "add_eos_token": False}
        config.update({f"{role}_token": token for role, token in self.special_tokens.items() if token is not None})
        if self.unk_token is not None:
            config["unk_token"] = self.unk_token
        return config

    def save_files(self, directory: str | os.PathLike[str]) -> list[Path]:
        """Write ``tokenizer.json`` and ``tokenizer_config.json`` into ``directory``; returns their paths."""
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        (out / TOKENIZER_FILE).write_text(self.json_text, encoding="utf-8")
        (out / CONFIG_FILE).write_text(json.dumps(self.tokenizer_config(), indent=2, sort_keys=True) + "\n",
                                       encoding="utf-8")
        return [out / TOKENIZER_FILE, out / CONFIG_FILE]


@functools.cache
def byte_tokenizer() -> HFTokenizer:
    """moejax's byte tokenizer (``tokenizer.ByteTokenizer``) in the tokenizers format, for
    ``transformers``: ids 0..255 are the UTF-8 bytes (GPT-2's byte-level alphabet, no merges),
    256..258 ``<|bos|>``, ``<|eos|>``, ``<|pad|>``; invalid UTF-8 decodes to U+FFFD, as moejax's."""
    tokenizer = tokenizers.Tokenizer(models.BPE(vocab={char: byte for byte, char in _byte_chars().items()}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(list(BYTE_SPECIAL_TOKENS))
    bos, eos, pad = BYTE_SPECIAL_TOKENS
    return HFTokenizer(tokenizer.to_str(), bos=bos, eos=eos, pad=pad, source="the byte tokenizer")


BYTE_SPECIAL_TOKENS: Final = ("<|bos|>", "<|eos|>", "<|pad|>")


def is_byte_tokenizer(tokenizer: HFTokenizer) -> bool:
    """Whether ``tokenizer`` is ``byte_tokenizer()``: the same ids for the same text."""
    reference = byte_tokenizer()
    return tokenizer.json_text == reference.json_text and tokenizer.special_tokens == reference.special_tokens


def _byte_chars() -> dict[int, str]:
    """GPT-2's byte-level alphabet (what ``ByteLevel`` pre-tokenizes a byte into): printable
    Latin-1 bytes stand for themselves, the others for the characters from U+0100 up, in order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    return {**{b: chr(b) for b in printable}, **{b: chr(256 + i) for i, b in enumerate(others)}}


def special_tokens(tokenizer: tokenizers.Tokenizer) -> list[str]:
    """The texts of a tokenizer's special added tokens, by id."""
    decoder = tokenizer.get_added_tokens_decoder()
    return [decoder[i].content for i in sorted(decoder) if decoder[i].special]


# Texts that end a document in widely used tokenizers (GPT-2 and its descendants, T5/Llama, Gemma).
END_OF_TEXT_TOKENS: Final = ("<|endoftext|>", "</s>", "<eos>")


def obvious_eos(tokenizer: tokenizers.Tokenizer) -> tuple[str, str] | None:
    """(token, why) when a tokenizer's special tokens leave one obvious end-of-text token: its only
    special token, or its only one among ``END_OF_TEXT_TOKENS``; else None."""
    specials = special_tokens(tokenizer)
    if len(specials) == 1:
        return specials[0], "the tokenizer's only special token"
    known = [token for token in specials if token in END_OF_TEXT_TOKENS]
    if len(known) == 1:
        return known[0], f"its only special token of {', '.join(END_OF_TEXT_TOKENS)}"
    return None


# Texts of a padding token in widely used tokenizers (T5/sentencepiece, moejax's BPE, BERT, Pythia).
PAD_TOKENS: Final = ("<pad>", "<|pad|>", "[PAD]", "<|padding|>")


def obvious_pad(tokenizer: tokenizers.Tokenizer) -> str | None:
    """The tokenizer's padding token when its special tokens hold exactly one of ``PAD_TOKENS``
    (a tokenizer with ``<pad>`` pads with it, not with EOS); else None (PAD is then EOS)."""
    known = [token for token in special_tokens(tokenizer) if token in PAD_TOKENS]
    return known[0] if len(known) == 1 else None


def model_unk_token(json_text: str) -> str | None:
    """The unknown token of a tokenizer's model, from its ``tokenizer.json``: BPE's and WordPiece's
    ``unk_token``, Unigram's ``vocab[unk_id]``; None for a model without one (a byte-level BPE
    needs none: every byte is a token)."""
    model = json.loads(json_text).get("model") or {}
    if isinstance(model.get("unk_token"), str):
        return model["unk_token"]
    unk_id, vocab = model.get("unk_id"), model.get("vocab")
    if isinstance(unk_id, int) and isinstance(vocab, list) and 0 <= unk_id < len(vocab):
        return str(vocab[unk_id][0])
    return None


def load_hf_tokenizer(path: str | os.PathLike[str], overrides: Mapping[str, str | None] | None = None) -> HFTokenizer:
    """The tokenizer of ``path``: a ``tokenizer.json``, or a directory holding one.

    Special tokens: ``overrides`` (role -> token text; None or missing: not overridden), then the
    ``tokenizer_config.json`` and ``special_tokens_map.json`` beside the file.
    """
    path = Path(path)
    file = path / TOKENIZER_FILE if path.is_dir() else path
    if not file.is_file():
        others = sorted(p.name for p in path.iterdir()) if path.is_dir() else []
        hint = (" It holds only a sentencepiece tokenizer.model: convert it with transformers, "
                "AutoTokenizer.from_pretrained(DIR).save_pretrained(DIR), which writes tokenizer.json."
                if "tokenizer.model" in others else "")
        raise DataError(
            f"tokenizer {path} has no {TOKENIZER_FILE}{' (it holds ' + ', '.join(others[:8]) + ')' if others else ''}. "
            f"Allowed: 'byte', 'bpe', a {TOKENIZER_FILE} or a directory holding one (a Hugging Face model "
            f"directory).{hint}"
        )
    json_text = read_tokenizer_json(file)
    tokenizer = parse_tokenizer_json(json_text, str(file))
    chosen = configured_special_tokens(file.parent)
    chosen.update({role: token for role, token in (overrides or {}).items() if token is not None})
    if chosen.get("eos") is None and (obvious := obvious_eos(tokenizer)):
        chosen["eos"], why = obvious
        log.info(f"tokenizer {file}: EOS token {chosen['eos']!r} ({why}; no file names one). --eos-token TOKEN "
                 "chooses another.")
    if chosen.get("pad") is None and (pad := obvious_pad(tokenizer)):
        chosen["pad"] = pad
        log.info(f"tokenizer {file}: PAD token {pad!r} (its only special token of {', '.join(PAD_TOKENS)}; no file "
                 "names one). --pad-token TOKEN chooses another.")
    if chosen.get("eos") is None:
        raise DataError(
            f"tokenizer {file}: no EOS token is named (moejax ends every document with it), neither in "
            f"{file.parent / CONFIG_FILE} ('eos_token') nor in {file.parent / SPECIAL_MAP_FILE}. Pass --eos-token "
            f"TOKEN, e.g. one of its special tokens {special_tokens(tokenizer)[:12]}."
        )
    return HFTokenizer(json_text, bos=chosen.get("bos"), eos=str(chosen["eos"]), pad=chosen.get("pad"),
                       source=str(file))


def configured_special_tokens(directory: Path) -> dict[str, str | None]:
    """BOS/EOS/PAD texts named by ``tokenizer_config.json``, else ``special_tokens_map.json``."""
    found: dict[str, str | None] = {}
    for name in (SPECIAL_MAP_FILE, CONFIG_FILE):  # the config file wins: read last
        path = directory / name
        if not path.is_file():
            continue
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise DataError(f"{path} is not readable JSON ({e}); fix or delete it, or pass --eos-token "
                            "(and --bos-token, --pad-token) instead.") from None
        if not isinstance(config, dict):
            raise DataError(f"{path} holds {type(config).__name__}, not a JSON object; fix or delete it.")
        for role in ROLES:
            if f"{role}_token" in config:
                found[role] = _token_text(config[f"{role}_token"], path, f"{role}_token")
    return found


def _token_text(value: Any, path: Path, key: str) -> str | None:
    """A special token entry: a string, an AddedToken object ``{"content": ...}``, or null."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    raise DataError(f"{path}: key {key!r} has value {value!r}; allowed: a token string, "
                    "{\"content\": TOKEN, ...} or null. Fix the file, or pass --" + key.replace("_", "-") + ".")
