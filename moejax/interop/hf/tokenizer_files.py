"""Tokenizer files of a Hugging Face directory: copied into a workdir on import, written on export.

Import copies ``tokenizer.json`` and the files that name its special tokens
(``tokenizer_config.json``, ``special_tokens_map.json``, a chat template), byte for byte, into
``WORKDIR/tokenizer/`` and records the tokenizer's id (``hf-<vocab>-<sha>``, see
``moejax.data.hf_tokenizer``) in the step-0 checkpoint. ``python -m moejax.data.prepare --tokenizer
WORKDIR/tokenizer`` then makes a dataset with the same id, the only kind that training from the
import (or evaluating it) accepts.

Export writes the tokenizer of the checkpoint (its recorded id) next to the weights, taken from
the first of: the workdir's ``tokenizer/``, the run's dataset (``data.path``), the ``tokenizer/``
of the workdir it started from (``checkpoint.init_from``). Copied source files are written as they
were; a tokenizer that has only a ``tokenizer.json`` gets a ``tokenizer_config.json`` naming its
special tokens, so ``transformers.AutoTokenizer.from_pretrained(OUT)`` reads it either way.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Final

from moejax.data.hf_tokenizer import (CONFIG_FILE, SPECIAL_MAP_FILE, TOKENIZER_FILE, HFTokenizer, byte_tokenizer,
                                      is_byte_tokenizer, load_hf_tokenizer)
from moejax.interop.hf.errors import InteropError

TOKENIZER_DIR: Final = "tokenizer"  # in an imported workdir
COPIED: Final = (TOKENIZER_FILE, CONFIG_FILE, SPECIAL_MAP_FILE, "chat_template.jinja", "chat_template.json")
NO_TOKENIZER_PREFIX: Final = "huggingface:"  # the id recorded for an import without tokenizer files


def source_tokenizer(hf_dir: str, model_vocab: int) -> HFTokenizer | None:
    """The tokenizer of a Hugging Face directory (None if it has no ``tokenizer.json``), checked to
    fit the model's embedding of ``model_vocab`` rows; raises ``DataError``/``InteropError``
    naming the file otherwise."""
    if not os.path.isfile(os.path.join(hf_dir, TOKENIZER_FILE)):
        return None
    tokenizer = load_hf_tokenizer(hf_dir)
    if tokenizer.vocab_size > model_vocab:
        raise InteropError(
            f"{os.path.join(hf_dir, TOKENIZER_FILE)} has a vocabulary of {tokenizer.vocab_size} tokens, but the "
            f"model's embedding ({os.path.join(hf_dir, 'config.json')}: vocab_size {model_vocab}) has only "
            f"{model_vocab} rows; allowed: a tokenizer of at most {model_vocab} tokens. Put the tokenizer the "
            "checkpoint was trained with in the directory (AutoTokenizer.from_pretrained(its name)"
            ".save_pretrained(DIR)), or remove the tokenizer files to import the weights alone."
        )
    return tokenizer


def tokenizer_id(tokenizer: HFTokenizer | None, hf_dir: str) -> str:
    """The id an import records: the tokenizer's (``byte`` for an export of a byte-tokenizer run),
    or a name that matches no dataset's tokenizer."""
    if tokenizer is None:
        return f"{NO_TOKENIZER_PREFIX}{os.path.abspath(hf_dir)}"
    return "byte" if is_byte_tokenizer(tokenizer) else tokenizer.name


def copy_tokenizer(hf_dir: str, workdir: str) -> list[str]:
    """Copy the tokenizer files of ``hf_dir`` into ``workdir/tokenizer/``; returns the names copied."""
    return _copy_files(hf_dir, os.path.join(workdir, TOKENIZER_DIR))


def _copy_files(source: str, dest: str) -> list[str]:
    """The tokenizer files of ``source`` copied byte for byte into ``dest`` (none without a tokenizer.json)."""
    names = [name for name in COPIED if os.path.isfile(os.path.join(source, name))]
    if TOKENIZER_FILE not in names:
        return []
    os.makedirs(dest, exist_ok=True)
    for name in names:
        shutil.copyfile(os.path.join(source, name), os.path.join(dest, name))
    return names


def prepare_command(workdir: str) -> str:
    """The ``prepare`` command that tokenizes data for a model imported into ``workdir``."""
    from moejax.commands import python_command
    from moejax.paths import user_path

    return python_command("moejax.data.prepare", ["--tokenizer", user_path(os.path.join(workdir, TOKENIZER_DIR)),
                                                  "--source", "DOMAIN=PATH", "--out", "datasets/NAME"])


def special_token_ids(out_dir: str) -> dict[str, int]:
    """``{"bos_token_id": ..., "eos_token_id": ..., "pad_token_id": ...}`` of the tokenizer written to
    ``out_dir`` (BOS left out when it has none), for the exported ``config.json``."""
    tokenizer = load_hf_tokenizer(out_dir)
    ids = {"bos": tokenizer.bos_id, "eos": tokenizer.eos_id, "pad": tokenizer.pad_id}
    return {f"{role}_token_id": int(i) for role, i in ids.items() if i is not None}


def export_tokenizer(workdir: str, cfg: Any, tokenizer_id: str | None, out_dir: str) -> str | None:
    """Write the tokenizer a checkpoint was trained with (``tokenizer_id``) into ``out_dir``.

    Returns where it came from, or None when no file holds it (an import without tokenizer files,
    a dataset that was moved). The byte tokenizer is written as ``byte_tokenizer()``.
    """
    from moejax.data.tokenizer import load_tokenizer
    from moejax.errors import ConfigError

    if tokenizer_id == "byte":
        byte_tokenizer().save_files(out_dir)
        return "the byte tokenizer"
    if not tokenizer_id or tokenizer_id.startswith(NO_TOKENIZER_PREFIX):
        return None
    candidates = [os.path.join(workdir, TOKENIZER_DIR), cfg.data.path]
    if cfg.checkpoint.init_from:
        candidates.append(os.path.join(cfg.checkpoint.init_from, TOKENIZER_DIR))
    for candidate in candidates:
        if not candidate or not os.path.isdir(candidate):
            continue
        try:
            tokenizer = load_tokenizer(candidate)
        except ConfigError:  # a DataError: not this one
            continue
        if tokenizer.name != tokenizer_id or not isinstance(tokenizer, HFTokenizer):
            continue
        if os.path.basename(os.path.normpath(candidate)) == TOKENIZER_DIR:  # an import's own files
            _copy_files(candidate, out_dir)
            if not os.path.isfile(os.path.join(out_dir, CONFIG_FILE)):
                config = json.dumps(tokenizer.tokenizer_config(), indent=2, sort_keys=True)
                Path(out_dir, CONFIG_FILE).write_text(config + "\n", encoding="utf-8")
        else:
            tokenizer.save_files(out_dir)
        return candidate
    return None
