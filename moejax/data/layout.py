"""Where a prepared dataset keeps its files (written by ``prepare``, read by ``dataset``).

::

    DIR/
      dataset.json                      format, tokenizer id, heldout fraction, domain summaries
      tokenizer.json                    the trained BPE or the --tokenizer PATH one (absent for byte)
      tokenizer_config.json             a --tokenizer PATH tokenizer's BOS/EOS/PAD, as transformers reads them
      <domain>/
        manifest.json                   documents, tokens, checksums, shards of the domain
        shard-00000.json                one shard's record, written last: the shard is complete
        shard-00000.train.tokens.npy    token ids, every document followed by EOS
        shard-00000.train.doc_starts.npy
        shard-00000.heldout.tokens.npy
        shard-00000.heldout.doc_starts.npy

Files being written carry a leading ``.`` and a ``.tmp`` suffix and are renamed into place when
complete, so a reader (or a resumed ``prepare``) never sees a partial file under a final name.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final

FORMAT: Final = "moejax-prepared-v1"
DATASET_FILE: Final = "dataset.json"
TOKENIZER_FILE: Final = "tokenizer.json"
MANIFEST_FILE: Final = "manifest.json"
SPLITS: Final = ("train", "heldout")
ARRAYS: Final = ("tokens", "doc_starts")
TMP_SUFFIX: Final = ".tmp"
# Domain names become directory names and metric keys (``tokens/<domain>``).
DOMAIN_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")


def shard_name(index: int) -> str:
    return f"shard-{index:05d}"


def shard_record_path(dataset_dir: Path, domain: str, index: int) -> Path:
    return dataset_dir / domain / f"{shard_name(index)}.json"


def shard_array_name(index: int, split: str, array: str) -> str:
    return f"{shard_name(index)}.{split}.{array}.npy"


def tmp_path(final: Path) -> Path:
    """The name a file is written under before it is renamed to ``final``."""
    return final.with_name(f".{final.name}{TMP_SUFFIX}")
