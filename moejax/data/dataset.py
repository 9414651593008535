"""One view of the data a run trains on: the built-in corpus or a prepared dataset directory.

``describe_dataset(path)`` reads only what a config check needs (domains, tokenizer), in
milliseconds and without building anything; ``open_dataset(path)`` memory-maps every shard.
``path == ""`` means the built-in corpus (cached under ``cache_dir``, built on first use);
anything else is a directory written by ``python -m moejax.data.prepare``.

Either way a domain split is a tuple of ``TokenStream`` shards (the built-in corpus has one per
split) and the dataset carries a content hash, so runs on different machines can tell whether
they trained on the same data. Domains are listed in ``corpus.DOMAINS`` order for the built-in
corpus and in name order for a prepared dataset, so batch ``domain`` ids never depend on the
order sources were given to ``prepare``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from moejax.data import corpus as corpus_lib
from moejax.data import layout
from moejax.data.shard_check import ShardCheck, check_checksum
from moejax.data.streams import TokenStream
from moejax.data.tokenizer import ByteTokenizer, Tokenizer, load_tokenizer
from moejax.errors import DataError

BUILTIN_CORPUS_SEED = 0
# Written by ``prepare`` while it runs, and kept with the error when it fails; dataset.json, which
# makes the directory a dataset, is written only once every domain is complete.
PROGRESS_FILE = "prepare-progress.json"
# Below these a domain's held-out loss is noise: with a few documents it measures those documents
# (between-document spread dominates the per-token spread), and 8,192 tokens is what one
# evaluation of the tiny default reads (train.eval_batches 2 x batch 16 x seq_len 256). `prepare`
# warns below either, and training warns too when an evaluation would read more tokens than exist.
MIN_HELDOUT_DOCUMENTS = 20
MIN_HELDOUT_TOKENS = 8192


class HeldoutWarning(UserWarning):
    """A domain's held-out split is too small for its evaluation loss to mean much."""


def small_heldout_message(domain: str, documents: int, tokens: int, *, total_documents: int,
                          total_tokens: int, fraction: float | None,
                          min_tokens: int = MIN_HELDOUT_TOKENS) -> str:
    """'' if the held-out split is big enough, else a warning that says how to fix it."""
    if documents >= MIN_HELDOUT_DOCUMENTS and tokens >= min_tokens:
        return ""
    message = (f"domain {domain!r} has a held-out split of {documents:,} documents / {tokens:,} tokens, "
               f"below the minimum of {MIN_HELDOUT_DOCUMENTS} documents and {min_tokens:,} tokens: its "
               f"eval_loss/{domain} will be noise.")
    # The fraction that would hold out the minimum, with a 20% margin for the hash split's luck.
    needed = max(MIN_HELDOUT_DOCUMENTS / max(total_documents, 1), min_tokens / max(total_tokens, 1)) * 1.2
    if total_documents < 2 * MIN_HELDOUT_DOCUMENTS:
        return message + (f" The source has only {total_documents:,} documents; give it more, smaller "
                          "documents (e.g. one JSONL record per document).")
    if needed > 0.5:
        return message + (f" The source holds only {total_tokens:,} tokens in {total_documents:,} documents; "
                          "give it more text, or accept a noisy eval loss for it.")
    if fraction is not None:
        suggested = float(f"{needed:.2g}")
        return message + (f" Rerun the prepare command with --heldout-fraction {suggested:g} (now "
                          f"{fraction:g}); the shards are redone with the new split.")
    return message + f" Prepare it with --heldout-fraction {float(f'{needed:.2g}'):g}."


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
    """What a dataset is, without its tokens: where, which domains, which tokenizer."""

    path: str  # "" for the built-in corpus
    description: str  # for messages, e.g. "prepared dataset datasets/mine"
    domains: tuple[str, ...]
    tokenizer: Tokenizer

    def check_domain(self, domain: str, what: str) -> None:
        """Raise a ``DataError`` naming ``what`` (e.g. a config key) unless ``domain`` exists."""
        if domain not in self.domains:
            raise DataError(
                f"{what} names domain {domain!r}, which {self.description} does not have; its "
                f"domains are: {', '.join(self.domains)}. Use those names, or prepare a source "
                f"for {domain!r} (python -m moejax.data.prepare --source {domain}=PATH ...)."
            )


@dataclasses.dataclass(frozen=True)
class TokenDataset:
    """A dataset's token streams: ``shards[(domain, split)]`` is a tuple of ``TokenStream``."""

    info: DatasetInfo
    manifest: dict[str, Any]
    content_hash: str
    shards: Mapping[tuple[str, str], tuple[TokenStream, ...]]

    @property
    def domains(self) -> tuple[str, ...]:
        return self.info.domains

    @property
    def tokenizer(self) -> Tokenizer:
        return self.info.tokenizer

    def streams(self, domain: str, split: str) -> tuple[TokenStream, ...]:
        """The shards of one domain split."""
        self.info.check_domain(domain, "a data request")
        if split not in layout.SPLITS:
            raise ValueError(f"unknown split {split!r}; allowed splits: {layout.SPLITS}")
        return self.shards[(domain, split)]


def describe_dataset(path: str | os.PathLike[str] = "") -> DatasetInfo:
    """Domains and tokenizer of the dataset at ``path`` ("" = built-in corpus); cheap."""
    if not str(path):
        return DatasetInfo("", "the built-in corpus", corpus_lib.DOMAINS, ByteTokenizer())
    directory = Path(path)
    if not directory.exists():
        raise DataError(
            f"data.path {str(path)!r} does not exist. Prepare it first: python -m "
            f"moejax.data.prepare --source DOMAIN=PATH --out {path}; or set data.path='' for the "
            "built-in corpus."
        )
    if not directory.is_dir() or (any(directory.iterdir()) and not (directory / layout.DATASET_FILE).is_file()
                                  and not (directory / PROGRESS_FILE).is_file()):
        raise DataError(_not_a_dataset_message(str(path), directory.is_dir()))
    _check_prepare_finished(directory, str(path))
    dataset = _read_json(directory / layout.DATASET_FILE, f"data.path {str(path)!r}")
    if dataset.get("format") != layout.FORMAT:
        raise DataError(f"{directory / layout.DATASET_FILE} has format {dataset.get('format')!r}, "
                        f"expected {layout.FORMAT!r}; prepare the sources again.")
    if not dataset.get("domains"):  # written by an older prepare, which wrote dataset.json first
        raise DataError(f"prepared dataset {path} has no finished domain: its prepare run failed or "
                        "was interrupted. Rerun the prepare command (after fixing its input if it "
                        "failed); it keeps the shards already done.")
    return DatasetInfo(str(path), f"prepared dataset {path}", tuple(sorted(dataset["domains"])),
                       load_tokenizer(directory))


def open_dataset(
    path: str | os.PathLike[str] = "", cache_dir: str | os.PathLike[str] | None = None
) -> TokenDataset:
    """The token streams of the dataset at ``path`` ("" = built-in corpus, cached in ``cache_dir``)."""
    info = describe_dataset(path)
    if not info.path:
        corpus = corpus_lib.load_tokenized_corpus(BUILTIN_CORPUS_SEED, cache_dir)
        shards = {key: (stream,) for key, stream in corpus.streams.items()}
        hashes = (corpus.manifest["domains"][d][s]["sha256"] for d in info.domains for s in layout.SPLITS)
        return TokenDataset(info, corpus.manifest, combined_hash(hashes), shards)
    directory = Path(path)
    dataset = _read_json(directory / layout.DATASET_FILE, f"data.path {str(path)!r}")
    shards = {}
    manifests = {}
    for domain in info.domains:
        manifest = _domain_manifest(directory, domain)
        manifests[domain] = manifest
        for split in layout.SPLITS:
            shards[(domain, split)] = tuple(
                _open_shard(directory / domain, shard["splits"][split], manifest["dtype"], info.tokenizer.vocab_size)
                for shard in manifest["shards"]
            )
    return TokenDataset(info, {**dataset, "domain_manifests": manifests}, dataset["sha256"], shards)


def verify_dataset(path: str | os.PathLike[str]) -> int:
    """Recompute the sha256 of every shard file of a prepared dataset; returns the file count.

    Raises a ``DataError`` naming the first file that differs from its manifest (what training
    does for each shard the first time it reads it, here for all of them at once).
    """
    info = describe_dataset(path)
    if not info.path:
        raise DataError("verify_dataset checks prepared datasets; the built-in corpus cache is checked "
                        "against its manifest every time it is loaded (and rebuilt if damaged).")
    checked = 0
    for domain in info.domains:
        manifest = _domain_manifest(Path(path), domain)
        for shard in manifest["shards"]:
            for split in layout.SPLITS:
                for file in shard["splits"][split]["files"].values():
                    check_checksum(Path(path) / domain / file["name"], file["sha256"])
                    checked += 1
    return checked


def combined_hash(hashes) -> str:
    """sha256 over a sequence of hex digests, in order."""
    h = hashlib.sha256()
    for item in hashes:
        h.update(item.encode())
    return h.hexdigest()


def _check_prepare_finished(directory: Path, path: str) -> None:
    """A directory with a prepare progress record but no dataset.json: say what happened."""
    progress_path = directory / PROGRESS_FILE
    if (directory / layout.DATASET_FILE).is_file() or not progress_path.is_file():
        return
    try:
        with open(progress_path, encoding="utf-8") as f:
            progress = json.load(f)
    except (OSError, ValueError):
        progress = {}
    domains = ", ".join(progress.get("domains", ())) or "its sources"
    if progress.get("state") == "failed":
        raise DataError(
            f"data.path {path!r} is not a prepared dataset: the prepare run into it failed, so it "
            f"has no {layout.DATASET_FILE}. Its error was: {progress.get('error', '(not recorded)')} "
            "Fix that input, then rerun the prepare command (it first removes what the failed run left)."
        )
    raise DataError(
        f"data.path {path!r} is not a prepared dataset yet: a prepare run into it (domains {domains}) "
        f"was interrupted or is still running, so it has no {layout.DATASET_FILE}. Rerun the same "
        "prepare command to finish it (shards already done are kept)."
    )


def _not_a_dataset_message(path: str, is_dir: bool) -> str:
    """data.path names the user's raw input (a file, or a directory of text) instead of a dataset."""
    what = "a directory without dataset.json" if is_dir else "a file"
    return (f"data.path {path!r} is {what}, not a prepared dataset. Training reads datasets made by "
            f"prepare from your files: python -m moejax.data.prepare --source DOMAIN={path} --out "
            "datasets/NAME, then set --config.data.path=datasets/NAME.")


def _read_json(path: Path, what: str) -> dict[str, Any]:
    if not path.is_file():
        raise DataError(
            f"{what} is not a prepared dataset: {path} is missing. Prepare it with: python -m "
            f"moejax.data.prepare --source DOMAIN=PATH --out {path.parent}"
        )
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _domain_manifest(directory: Path, domain: str) -> dict[str, Any]:
    path = directory / domain / layout.MANIFEST_FILE
    if not path.is_file():
        raise DataError(f"prepared dataset {directory} lists domain {domain!r} but {path} is "
                        "missing: a prepare run was interrupted. Rerun the same prepare command.")
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _open_shard(directory: Path, entry: Mapping[str, Any], dtype: str, vocab_size: int) -> TokenStream:
    """Memory-map one shard split, checking it against its manifest entry; its content (checksum,
    id range) is checked when the pipeline first reads it (``shard_check.ShardCheck``)."""
    arrays = {}
    for name, expected_dtype, length in (("tokens", dtype, entry["tokens"]),
                                         ("doc_starts", "int32", entry["documents"])):
        path = directory / entry["files"][name]["name"]
        try:
            array = np.load(path, mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError) as e:
            raise DataError(f"cannot read {path} ({e}); rerun the prepare command to rewrite it.") from None
        if array.dtype != np.dtype(expected_dtype) or array.shape != (length,):
            raise DataError(f"{path} holds {array.dtype}[{array.shape}], but its manifest says "
                            f"{expected_dtype}[{length}]; rerun the prepare command to rewrite it.")
        arrays[name] = array
    tokens_file = entry["files"]["tokens"]
    check = ShardCheck(str(directory / tokens_file["name"]), tokens_file.get("sha256"), vocab_size)
    return TokenStream(tokens=arrays["tokens"], doc_starts=arrays["doc_starts"], check=check)
