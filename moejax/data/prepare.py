"""Tokenize user sources into a prepared dataset: token shards plus manifests, resumably.

    python -m moejax.data.prepare --source code=./src --source web=./web.jsonl \\
        --out datasets/mine [--tokenizer byte|bpe|PATH] [--vocab-size 8192] [--workers 2]

Each ``--source DOMAIN=PATH`` becomes one domain (see ``sources`` for what ``PATH`` may be).
Its input is cut into shards of about ``--shard-mb`` input bytes, and the shards are tokenized
in parallel worker processes. A shard is written as ``.npy`` arrays (see ``layout``) and is
complete once its record ``shard-NNNNN.json`` exists; every file is written under a temporary
name and renamed into place. Rerunning the same command after an interruption skips every shard
whose record matches its inputs (paths, sizes and modification times, tokenizer and options) and
redoes the rest, so the result is the same as an uninterrupted run.

Why ``.npy`` and not ArrayRecord: training cuts fixed windows out of one long token stream per
shard, which needs random access at token granularity across document boundaries. A memory-
mapped ``.npy`` gives exactly that with no decoding (the pipeline delivers millions of tokens/s
on 2 cores), while ArrayRecord stores records (documents) and would need a read and a
concatenation per window. The files are plain numpy, readable without moejax.

Documents are split into train and held-out by a hash of their text (``heldout_fraction`` of
them held out), so identical documents always land in the same split, on any machine. A dataset
holds one tokenizer: adding a domain to an existing dataset reuses it, and asking for another
tokenizer is refused, naming both ids. ``--tokenizer PATH`` takes any Hugging Face tokenizer
(``hf_tokenizer``): its files are copied beside the data, and its id and special tokens recorded.
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import functools
import hashlib
import json
import logging
import math
import multiprocessing
import os
import random
import shutil
import signal
import sys
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import numpy as np
import tqdm

from moejax import paths
from moejax.config import default_config
from moejax.data import layout, sources as sources_lib
from moejax.data.dataset import (MIN_HELDOUT_DOCUMENTS, MIN_HELDOUT_TOKENS, PROGRESS_FILE, HeldoutWarning,
                                 combined_hash, small_heldout_message)
from moejax.data.pools import parse_unique_tokens
from moejax.data.sources import Piece, SkippedFilesWarning, Source
from moejax.data.streams import token_dtype, tokenize_documents
from moejax.data.tokenizer import ByteTokenizer, Tokenizer
from moejax.errors import DataError, UserError, user_stacklevel
from moejax.log import add_verbosity_flags
from moejax.runner import run

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from moejax.data.hf_tokenizer import HFTokenizer

DEFAULT_HELDOUT_FRACTION: Final = 0.01
DEFAULT_SEQ_LEN: Final = default_config().train.seq_len
DEFAULT_SHARD_MB: Final = 64
DEFAULT_VOCAB_SIZE: Final = 8192
DEFAULT_BPE_SAMPLE_MB: Final = 256
MB: Final = 2**20
AUTO_BYTES_PER_WORKER: Final = 32 * MB
# A held-out fraction prepare chooses itself never holds out more than this share of a domain's tokens.
MAX_AUTO_HELDOUT_SHARE: Final = 0.25
log = logging.getLogger("moejax.data.prepare")  # also when run as __main__


@dataclasses.dataclass(frozen=True)
class ShardTask:
    """Everything a worker process needs to tokenize one shard."""

    out_dir: str
    domain: str
    index: int
    pieces: tuple[Piece, ...]
    tokenizer_json: str | None  # None: the byte tokenizer
    special_tokens: tuple[str | None, ...] | None  # BOS, EOS, PAD of a Hugging Face tokenizer; else None
    heldout_fraction: float
    text_field: str
    fingerprint: str

    @property
    def input_bytes(self) -> int:
        return sum(piece.size for piece in self.pieces)


def _leaves_nothing_on_failure(prepare):
    """``prepare_dataset`` that, when it fails (bad input, a full disk), removes every file and
    directory it created in ``out_dir`` (all of it if ``out_dir`` was new), so nothing is left that
    was not there before; and first clears what an earlier failed run left, saying so. An
    interruption (Ctrl-C, a kill) keeps the finished shards: rerunning the command resumes."""
    @functools.wraps(prepare)
    def wrapper(sources, out_dir, **kwargs):
        out = Path(out_dir)
        _clear_failed_attempt(out)
        before = _snapshot(out)
        try:
            return prepare(sources, out_dir, **kwargs)
        except Exception as e:
            removed = _remove_new(out, before)
            note = (f" Nothing was left behind: {out} was removed." if before is None else
                    f" The files this run had written to {out} were removed; what was there before is untouched.")
            if isinstance(e, OSError) and e.errno in _DISK_FULL:  # in a worker or here: one paragraph
                raise DataError(_disk_full_message(e, out) + (note if removed else "")) from None
            if not removed:
                raise
            if isinstance(e, UserError):  # the one-paragraph errors the command prints
                e.args = (f"{e}{note}",)
            raise
    return wrapper


_DISK_FULL: Final = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


def _disk_full_message(error: OSError, out: Path) -> str:
    """A write that failed for want of space (a full disk, a quota, a file size limit), as one paragraph."""
    where = out.resolve()
    while not where.exists() and where.parent != where:
        where = where.parent
    try:
        free = f"{shutil.disk_usage(where).free / MB:,.1f} MB free there now"
    except OSError:
        free = "its free space unknown"
    file = f", writing {error.filename}" if error.filename else ""
    return (f"the disk holding {out} is full ({error.strerror or error}{file}; {free}). Free some space, or "
            "choose an --out on a disk with room (a prepared dataset takes about 2-4 bytes per token, and "
            "byte tokens are one per input byte), then rerun the same command.")


def _snapshot(out: Path) -> set[str] | None:
    """Every path under ``out`` (relative), or None if ``out`` does not exist."""
    if not out.is_dir():
        return None
    found = set()
    for root, dirs, files in os.walk(out):
        found.update(os.path.relpath(os.path.join(root, name), out) for name in dirs + files)
    return found


def _remove_new(out: Path, before: set[str] | None) -> bool:
    """Removes what is under ``out`` but not in ``before`` (``out`` itself if it was new); whether
    anything was removed."""
    if before is None:
        if not out.exists():
            return False
        shutil.rmtree(out, ignore_errors=True)
        return True
    removed = False
    for root, dirs, files in os.walk(out, topdown=False):
        for name in files + dirs:
            path = os.path.join(root, name)
            if os.path.relpath(path, out) not in before:
                shutil.rmtree(path, ignore_errors=True) if os.path.isdir(path) and not os.path.islink(path) else os.unlink(path)
                removed = True
    return removed


def _clear_failed_attempt(out: Path) -> None:
    """Removes what a failed earlier run left in ``out`` (its progress record says ``failed``): its
    domains that no finished run wrote, its progress record, and its tokenizer files if no run
    finished; one warning says what was removed."""
    try:
        with open(out / PROGRESS_FILE, encoding="utf-8") as f:
            progress = json.load(f)
    except (OSError, ValueError):
        return
    if progress.get("state") != "failed":
        return
    finished = set()
    if (out / layout.DATASET_FILE).is_file():
        with open(out / layout.DATASET_FILE, encoding="utf-8") as f:
            finished = set(json.load(f).get("domains", ()))
    names = [d for d in progress.get("domains", ()) if d not in finished and layout.DOMAIN_NAME.fullmatch(d)]
    if not finished:
        names += [layout.TOKENIZER_FILE, "tokenizer_config.json"]
    removed = [name for name in names if (out / name).exists()]
    for name in removed:
        shutil.rmtree(out / name) if (out / name).is_dir() else (out / name).unlink()
    (out / PROGRESS_FILE).unlink()
    log.warning(f"prepare: an earlier run into {out} failed ({progress.get('error', 'error not recorded')[:200]}); "
                f"removed what it left: {', '.join(removed + [PROGRESS_FILE])}.")


@_leaves_nothing_on_failure
def prepare_dataset(
    sources: Sequence[str | Source],
    out_dir: str | os.PathLike[str],
    *,
    tokenizer: str | os.PathLike[str] = "byte",
    special_tokens: Mapping[str, str | None] | None = None,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    bpe_sample_mb: float = DEFAULT_BPE_SAMPLE_MB,
    heldout_fraction: float = DEFAULT_HELDOUT_FRACTION,
    text_field: str = "text",
    shard_mb: float = DEFAULT_SHARD_MB,
    workers: int | None = None,
    progress: bool = True,
    seq_len: int = DEFAULT_SEQ_LEN,
    unique_tokens: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """Prepare ``sources`` (``"DOMAIN=PATH"`` strings or ``Source`` s) into ``out_dir``.

    ``unique_tokens``: {domain: tokens} of data-constrained domains, recorded in ``dataset.json``
    (``domains.<domain>.unique_tokens``): training reads only that many unique tokens of the
    domain and repeats them (``moejax.data.pools``).

    Every domain's train and held-out split must hold one training window of ``seq_len + 1``
    tokens (the sequence length training will use), so that training on the dataset cannot stop
    at its start for want of data; ``heldout_fraction`` 0 asks for no held-out split.

    ``tokenizer``: ``"byte"``, ``"bpe"`` (trained on the sources, ``vocab_size``), or a path: a
    Hugging Face ``tokenizer.json``, a model directory holding one, or a prepared dataset whose
    tokenizer to reuse. ``special_tokens`` (``bos``/``eos``/``pad`` -> token text) overrides the
    special tokens a Hugging Face tokenizer's files name. The tokenizer's files are copied beside
    the data and its id recorded in ``dataset.json``.

    Returns a summary: per-domain documents/tokens, shards tokenized and skipped, input bytes,
    seconds (and the BPE training time). Raises ``DataError`` on bad input: missing or empty
    sources and bad options before anything is written, unreadable records when they are read.
    """
    start_time = time.perf_counter()
    out = Path(out_dir)
    parsed = [s if isinstance(s, Source) else sources_lib.parse_source(s) for s in sources]
    _check_options(parsed, heldout_fraction, shard_mb, bpe_sample_mb, workers, seq_len)
    _check_pool_domains(parsed, unique_tokens or {})
    external = _external_tokenizer(tokenizer, special_tokens)  # read before anything is written
    shard_bytes = max(1, int(shard_mb * MB))
    plans = {s.domain: sources_lib.plan_source(s, shard_bytes, text_field) for s in parsed}
    existing, unfinished = _read_existing(out)
    paths.make_dir(str(out), "--out")
    options = _tokenizer_options(str(tokenizer), vocab_size, external)
    bpe_seconds = 0.0
    tok_json = _reuse_tokenizer(out, existing or unfinished, options)
    if tokenizer == "bpe" and tok_json is None:
        bpe_start = time.perf_counter()
        tok_json = _train_tokenizer(plans, vocab_size, bpe_sample_mb, text_field, out)
        bpe_seconds = time.perf_counter() - bpe_start
    tok: Tokenizer
    if external is not None:
        tok, tok_json = external, external.json_text
    else:
        tok = _load(tok_json, None)
    dataset = existing or {"format": layout.FORMAT, "domains": {}}
    dataset.update(tokenizer=tok.name, tokenizer_options=options)
    if external is not None:
        dataset["tokenizer_source"] = str(tokenizer)
    # dataset.json is what makes a directory a dataset, so it is written last, only on success.
    # Until then a progress record holds the tokenizer (for a resumed run) and, after a failure,
    # the error, so that training on the directory says what happened.
    record = {"format": layout.FORMAT, "tokenizer": tok.name, "tokenizer_options": options,
              "domains": sorted(plans), "state": "running"}
    _write_json(out / PROGRESS_FILE, record)
    if external is not None:
        _save_tokenizer_files(external, out)
    try:
        summary = _tokenize_and_summarise(out, parsed, plans, dataset, tok, tok_json, heldout_fraction,
                                          text_field, shard_bytes, workers, progress, seq_len)
    except DataError as e:
        _write_json(out / PROGRESS_FILE, {**record, "state": "failed", "error": str(e)})
        raise
    _record_pools(dataset, unique_tokens or {})
    _write_json(out / layout.DATASET_FILE, dataset)
    (out / PROGRESS_FILE).unlink()
    return {**summary, "bpe_train_s": bpe_seconds, "seconds": time.perf_counter() - start_time,
            "tokenizer_source": dataset.get("tokenizer_source"),
            "special_tokens": {role: _special_token(tok, role) for role in ("bos", "eos", "pad")}}


def _check_pool_domains(parsed: list[Source], unique_tokens: Mapping[str, int]) -> None:
    unknown = sorted(set(unique_tokens) - {s.domain for s in parsed})
    if unknown:
        raise DataError(f"--unique-tokens names domain(s) {', '.join(unknown)} without a --source; the sources' "
                        f"domains: {', '.join(s.domain for s in parsed)}.")


def _record_pools(dataset: dict[str, Any], unique_tokens: Mapping[str, int]) -> None:
    """Each pool into its domain's ``dataset.json`` entry (at most the domain's train tokens)."""
    for domain, tokens in unique_tokens.items():
        entry = dataset["domains"][domain]
        if tokens > entry["train_tokens"]:
            raise DataError(f"--unique-tokens {domain}={tokens}: the domain's train split holds only "
                            f"{entry['train_tokens']:,} tokens; allowed: at most that many.")
        entry["unique_tokens"] = int(tokens)


def _tokenize_and_summarise(out: Path, parsed: list[Source], plans: Mapping[str, list[Piece]],
                            dataset: dict[str, Any], tok: Tokenizer, tok_json: str | None,
                            heldout_fraction: float, text_field: str, shard_bytes: int,
                            workers: int | None, progress: bool, seq_len: int) -> dict[str, Any]:
    """Tokenize every shard not already done, write the domain manifests and fill ``dataset``."""
    # A domain whose held-out fraction an earlier run chose itself starts from that choice.
    fractions = {domain: _chosen_fraction(out, domain, heldout_fraction) for domain in plans}
    tasks = {domain: _shard_tasks(out, domain, pieces, tok, tok_json, fractions[domain], text_field,
                                  shard_bytes) for domain, pieces in plans.items()}
    records, pending = {}, []
    for domain, domain_tasks in tasks.items():
        (out / domain).mkdir(parents=True, exist_ok=True)
        _remove_temporaries(out / domain)
        for task in domain_tasks:
            record = _finished_record(task)
            if record is None:
                pending.append(task)
            else:
                records[(domain, task.index)] = record
    skipped = len(records)
    workers = _worker_count(pending, workers)
    for task, record in _run(pending, workers, progress, out):
        records[(task.domain, task.index)] = record

    # A domain left with too small a held-out split gets a fraction that holds out enough; only
    # its shards are tokenized again.
    for domain, pieces in plans.items():
        shards = [records[(domain, task.index)] for task in tasks[domain]]
        auto = _auto_heldout_fraction(domain, pieces, shards, fractions[domain], text_field, seq_len)
        if auto is None:
            continue
        chosen, minimum = auto
        what = (f"the minimum of {MIN_HELDOUT_DOCUMENTS} documents and {MIN_HELDOUT_TOKENS:,} tokens" if minimum else
                f"a few training windows (the minimum would take more than {MAX_AUTO_HELDOUT_SHARE:.0%} of its tokens)")
        log.info(f"prepare: domain {domain!r}: held-out fraction {chosen:g} instead of {fractions[domain]:g}, "
                 f"which held out {_split_sizes(shards, 'heldout')}; {chosen:g} holds out {what}. Its shards are "
                 "redone with it.")
        fractions[domain] = chosen
        tasks[domain] = _shard_tasks(out, domain, pieces, tok, tok_json, chosen, text_field, shard_bytes)
        again = [task for task in tasks[domain] if _finished_record(task) is None]
        for task in tasks[domain]:
            if task not in again:
                records[(domain, task.index)] = _finished_record(task)
        for task, record in _run(again, _worker_count(again, workers), progress, out):
            records[(task.domain, task.index)] = record
        pending += again

    summary_domains = {}
    for source in parsed:
        manifest = _write_domain_manifest(out, source, tasks[source.domain], records, tok,
                                          fractions[source.domain], text_field, seq_len,
                                          asked_fraction=heldout_fraction)
        dataset["domains"][source.domain] = {
            "source": str(source), "sha256": manifest["sha256"],
            **{f"{split}_{key}": manifest["splits"][split][key]
               for split in layout.SPLITS for key in ("documents", "tokens")},
        }
        summary_domains[source.domain] = manifest["splits"]
    dataset["sha256"] = combined_hash(dataset["domains"][d]["sha256"] for d in sorted(dataset["domains"]))
    return {
        "out": str(out),
        "tokenizer": tok.name,
        "domains": summary_domains,
        "shards_tokenized": len(pending),
        "shards_skipped": skipped,
        "input_bytes": sum(t.input_bytes for ts in tasks.values() for t in ts),
        "tokenized_bytes": sum(t.input_bytes for t in pending),
        "workers": workers,
        "heldout_fractions": fractions,  # per domain: the one asked for, or the one prepare chose
    }


def tokenize_shard(task: ShardTask) -> dict[str, Any]:
    """Read, split, tokenize and write one shard; its record file is written last.

    Runs in a worker process; returns the record (also saved as ``shard-NNNNN.json``).
    """
    tok = _load(task.tokenizer_json, task.special_tokens)
    docs: dict[str, list[str]] = {split: [] for split in layout.SPLITS}
    skipped = 0
    for piece in task.pieces:
        for text in sources_lib.read_documents(piece, task.text_field):
            if text is None or not text.strip():
                skipped += 1
                continue
            docs["heldout" if is_heldout(text, task.heldout_fraction) else "train"].append(text)
    directory = Path(task.out_dir) / task.domain
    splits = {}
    for split, documents in docs.items():
        stream = tokenize_documents(documents, tok, token_dtype(tok.vocab_size))
        files = {
            array: _write_npy(directory / layout.shard_array_name(task.index, split, array),
                              getattr(stream, array))
            for array in layout.ARRAYS
        }
        splits[split] = {"documents": stream.num_documents, "tokens": stream.num_tokens, "files": files}
    record = {
        "fingerprint": task.fingerprint,
        "index": task.index,
        "inputs": [piece.fingerprint() for piece in task.pieces],
        "input_bytes": task.input_bytes,
        "skipped_documents": skipped,
        "splits": splits,
    }
    _write_json(layout.shard_record_path(Path(task.out_dir), task.domain, task.index), record)
    return record


def is_heldout(text: str, fraction: float) -> bool:
    """Whether a document belongs to the held-out split: a hash of its text below ``fraction``."""
    return _document_hash(text) < fraction * 2**64


def _check_options(parsed: list[Source], heldout_fraction: float,
                   shard_mb: float, bpe_sample_mb: float, workers: int | None, seq_len: int) -> None:
    if not parsed:
        raise DataError("no --source given; name at least one, e.g. --source code=./src")
    seen: dict[str, Source] = {}
    for source in parsed:
        if source.domain in seen:
            raise DataError(f"domain {source.domain!r} is given twice ({seen[source.domain]} and "
                            f"{source}); one source per domain: put its files in one directory "
                            "or use a glob pattern.")
        seen[source.domain] = source
    if not (isinstance(heldout_fraction, (int, float)) and 0 <= heldout_fraction < 1):
        raise DataError(f"--heldout-fraction {heldout_fraction!r}: allowed: a number in [0, 1)")
    for flag, value in (("--shard-mb", shard_mb), ("--bpe-sample-mb", bpe_sample_mb)):
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            raise DataError(f"{flag} {value!r}: allowed: a positive number")
    for flag, value in (("--workers", workers), ("--seq-len", seq_len)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise DataError(f"{flag} {value!r}: allowed: a positive int")


def _external_tokenizer(tokenizer: str | os.PathLike[str],
                        special_tokens: Mapping[str, str | None] | None) -> HFTokenizer | None:
    """The tokenizer a ``--tokenizer PATH`` names (None for ``byte``, ``bpe`` and a path that holds
    the byte tokenizer); a ``DataError`` naming the file when it does not exist or does not parse,
    or when a special token is not in it."""
    given = {role: token for role, token in (special_tokens or {}).items() if token is not None}
    if str(tokenizer) in ("byte", "bpe"):
        if given:
            flags = ", ".join(f"--{role}-token" for role in given)
            raise DataError(f"{flags} apply to a Hugging Face tokenizer (--tokenizer PATH), not to --tokenizer "
                            f"{tokenizer}, whose special tokens are fixed. Drop {flags}.")
        return None
    if not Path(tokenizer).exists():
        raise DataError(f"--tokenizer {str(tokenizer)!r}: no such file or directory. Allowed: byte | bpe | a "
                        "tokenizer.json | a directory holding one (a Hugging Face model directory, or the "
                        "tokenizer/ of a workdir made by moejax hf import) | a prepared dataset.")
    from moejax.data.hf_tokenizer import HFTokenizer
    from moejax.data.tokenizer import load_tokenizer

    tok = load_tokenizer(tokenizer, given)
    return tok if isinstance(tok, HFTokenizer) else None  # None: the byte tokenizer (a dataset, an export)


def _tokenizer_options(tokenizer: str, vocab_size: int, external: Tokenizer | None) -> dict[str, Any]:
    if external is not None:
        options: dict[str, Any] = {"kind": "file", "tokenizer": external.name}
        if external.name.startswith("hf-"):
            options["special_tokens"] = {role: _special_token(external, role) for role in ("bos", "eos", "pad")}
        return options
    return {"kind": "bpe", "vocab_size": vocab_size} if tokenizer == "bpe" else {"kind": "byte"}


def _special_token(tok: Tokenizer, role: str) -> str | None:
    """The text of a tokenizer's BOS/EOS/PAD token (None where it has none)."""
    token_id = getattr(tok, f"{role}_id", None)
    if token_id is None:
        return None
    return getattr(tok, f"{role}_token", None) or f"<id {token_id}>"


def _save_tokenizer_files(tok: HFTokenizer, out: Path) -> None:
    """Copy an external tokenizer beside the data (so the dataset alone names and holds it)."""
    from moejax.data.bpe import BPETokenizer

    if isinstance(tok, BPETokenizer):
        tok.save(out / layout.TOKENIZER_FILE)
    else:
        tok.save_files(out)


def _read_existing(out: Path) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(the ``dataset.json`` of an earlier run into ``out``, the progress record of an unfinished
    one); (None, None) for a new dataset."""
    def read(path: Path) -> dict[str, Any] | None:
        if not path.is_file():
            return None
        with open(path, encoding="utf-8") as f:
            return json.load(f)

    existing, progress = read(out / layout.DATASET_FILE), read(out / PROGRESS_FILE)
    if existing is not None or progress is not None:
        return existing, progress
    # A BPE trained by a run interrupted before its progress record is simply trained again.
    leftovers = {layout.TOKENIZER_FILE, layout.tmp_path(Path(layout.TOKENIZER_FILE)).name,
                 layout.tmp_path(Path(PROGRESS_FILE)).name}
    if out.exists() and (not out.is_dir() or any(p.name not in leftovers for p in out.iterdir())):
        raise DataError(f"--out {out} exists and is not a prepared dataset (no {layout.DATASET_FILE}); "
                        "choose a new or empty directory.")
    return None, None


def _reuse_tokenizer(out: Path, existing: dict | None, options: dict) -> str | None:
    """The tokenizer JSON of an existing BPE dataset; refuses a different tokenizer."""
    if existing is None:
        return None
    same = existing.get("tokenizer_options") == options or (
        options["kind"] == "file" and existing.get("tokenizer") == options["tokenizer"]
        and existing.get("tokenizer_options", {}).get("special_tokens") == options.get("special_tokens"))
    if not same:
        wanted = {"byte": "byte", "file": options.get("tokenizer"), "bpe": f"a new bpe-{options.get('vocab_size')}-<hash>"}[
            options["kind"]]
        if options.get("special_tokens"):
            wanted = f"{wanted} with special tokens {options['special_tokens']}"
        raise DataError(
            f"dataset {out} is tokenized with {existing['tokenizer']!r} "
            f"({existing.get('tokenizer_options')}), but this run asks for {wanted!r}. A dataset "
            f"holds one tokenizer: prepare into another --out directory, or rerun with the options "
            f"that made {existing['tokenizer']!r}."
        )
    if options["kind"] != "bpe":
        return None
    from moejax.data.bpe import BPETokenizer

    tok = BPETokenizer.from_file(out / layout.TOKENIZER_FILE)
    if tok.name != existing["tokenizer"]:
        raise DataError(f"{out / layout.TOKENIZER_FILE} is {tok.name!r}, but {out / layout.DATASET_FILE} "
                        f"records {existing['tokenizer']!r}: the file was replaced. Restore it, or "
                        "prepare into a new --out directory.")
    return tok.json_text


def _train_tokenizer(plans: Mapping[str, list[Piece]], vocab_size: int, sample_mb: float,
                     text_field: str, out: Path) -> str:
    """Train the BPE on a sample of every domain and save it beside the data."""
    from moejax.data.bpe import train_bpe

    budget = int(sample_mb * MB / len(plans))
    texts = (text for pieces in plans.values() for text in _sample(pieces, budget, text_field))
    tok = train_bpe(texts, vocab_size)
    out.mkdir(parents=True, exist_ok=True)
    final = out / layout.TOKENIZER_FILE
    tmp = layout.tmp_path(final)
    tok.save(tmp)
    os.replace(tmp, final)
    return tok.json_text


def _sample(pieces: list[Piece], budget: int, text_field: str) -> Iterator[str]:
    """Documents from pieces in a fixed shuffled order, until ``budget`` bytes."""
    order = list(pieces)
    random.Random(0).shuffle(order)
    taken = 0
    for piece in order:
        for text in sources_lib.read_documents(piece, text_field):
            if text and text.strip():
                yield text
                taken += len(text)
                if taken >= budget:
                    return


@functools.lru_cache(maxsize=2)
def _load(tokenizer_json: str | None, special_tokens: tuple[str | None, ...] | None) -> Tokenizer:
    """The tokenizer a worker rebuilds: byte (no JSON), a moejax BPE (no special tokens given), or
    a Hugging Face tokenizer with the given BOS, EOS and PAD."""
    if tokenizer_json is None:
        return ByteTokenizer()
    if special_tokens is None:
        from moejax.data.bpe import BPETokenizer

        return BPETokenizer(tokenizer_json)
    from moejax.data.hf_tokenizer import HFTokenizer

    bos, eos, pad = special_tokens
    assert eos is not None
    return HFTokenizer(tokenizer_json, bos=bos, eos=eos, pad=pad)


def _shard_tasks(out: Path, domain: str, pieces: list[Piece], tok: Tokenizer, tok_json: str | None,
                 heldout_fraction: float, text_field: str, shard_bytes: int) -> list[ShardTask]:
    """Consecutive pieces grouped into shards of at most ``shard_bytes`` (or one larger piece)."""
    specials = (tuple(_special_token(tok, role) for role in ("bos", "eos", "pad"))
                if tok.name.startswith("hf-") else None)
    groups: list[list[Piece]] = []
    size = 0
    for piece in pieces:
        if not groups or (size + piece.size > shard_bytes and groups[-1]):
            groups.append([])
            size = 0
        groups[-1].append(piece)
        size += piece.size
    tasks = []
    for index, group in enumerate(groups):
        inputs = {"format": layout.FORMAT, "tokenizer": tok.name, "heldout_fraction": heldout_fraction,
                  "text_field": text_field, "inputs": [piece.fingerprint() for piece in group]}
        if specials is not None:  # EOS ends every document: another EOS is another token stream
            inputs["special_tokens"] = specials
        fingerprint = hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()
        tasks.append(ShardTask(str(out), domain, index, tuple(group), tok_json, specials, heldout_fraction,
                               text_field, fingerprint))
    return tasks


def _finished_record(task: ShardTask) -> dict[str, Any] | None:
    """The record of a shard finished by an earlier run with the same inputs, else None."""
    path = layout.shard_record_path(Path(task.out_dir), task.domain, task.index)
    try:
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None
    if record.get("fingerprint") != task.fingerprint:
        return None
    for split in record["splits"].values():
        for file in split["files"].values():
            array = path.parent / file["name"]
            if not array.is_file() or array.stat().st_size != file["bytes"]:
                return None
    return record


def _worker_count(pending: list[ShardTask], workers: int | None) -> int:
    """Processes to use: ``workers``, or by default one per CPU but no more than one per
    ``AUTO_BYTES_PER_WORKER`` of input (starting one costs as much as tokenizing 10-30 MB);
    never more than there are shards."""
    if workers is None:
        pending_bytes = sum(task.input_bytes for task in pending)
        workers = min(os.cpu_count() or 1, max(1, pending_bytes // AUTO_BYTES_PER_WORKER))
    return max(1, min(workers, len(pending)))


def _run(pending: list[ShardTask], workers: int, progress: bool,
         out: Path) -> Iterator[tuple[ShardTask, dict[str, Any]]]:
    """Tokenize ``pending`` shards, in ``workers`` processes when that is more than one."""
    bar = tqdm.tqdm(total=sum(t.input_bytes for t in pending), unit="B", unit_scale=True,
                    unit_divisor=1024, desc=f"prepare {out.name}", file=sys.stderr,
                    disable=not progress or not pending or not sys.stderr.isatty())
    with bar:
        if workers <= 1:
            for task in pending:
                yield task, tokenize_shard(task)
                bar.update(task.input_bytes)
            return
        # "spawn": HF tokenizers' thread pool does not survive fork, and fresh workers are cheap.
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=workers, mp_context=context, initializer=_ignore_ctrl_c) as pool:
            futures = {pool.submit(tokenize_shard, task): task for task in pending}
            try:
                for future in as_completed(futures):
                    task = futures[future]
                    yield task, future.result()
                    bar.update(task.input_bytes)
            except BaseException:
                for future in futures:
                    future.cancel()
                raise


def _ignore_ctrl_c() -> None:
    """In a worker: Ctrl-C is the main process's to handle (it lets running shards finish)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _chosen_fraction(out: Path, domain: str, asked: float) -> float:
    """The held-out fraction an earlier run into ``out`` chose for ``domain`` when asked for
    ``asked`` (so that a rerun skips its shards), else ``asked``."""
    try:
        with open(out / domain / layout.MANIFEST_FILE, encoding="utf-8") as f:
            manifest = json.load(f)
    except (OSError, ValueError):
        return asked
    if manifest.get("heldout_fraction_asked") == asked and isinstance(manifest.get("heldout_fraction"), float):
        return manifest["heldout_fraction"]
    return asked


def _split_sizes(shards: list[dict], split: str) -> str:
    documents = sum(s["splits"][split]["documents"] for s in shards)
    tokens = sum(s["splits"][split]["tokens"] for s in shards)
    return f"{documents:,} documents / {tokens:,} tokens"


def _document_hash(text: str) -> int:
    """Where a document falls in [0, 2**64): it is held out when this is below fraction * 2**64."""
    digest = hashlib.sha256(text.encode("utf-8", errors="replace")).digest()
    return int.from_bytes(digest[:8], "little")


def _auto_heldout_fraction(domain: str, pieces: list[Piece], shards: list[dict], fraction: float,
                           text_field: str, seq_len: int) -> tuple[float, bool] | None:
    """A held-out fraction for ``domain`` that holds out the documented minimum
    (``MIN_HELDOUT_DOCUMENTS`` and ``MIN_HELDOUT_TOKENS``, and training windows), when
    ``fraction`` (> 0) left less, and whether it reaches that minimum (else only training windows);
    None when ``fraction`` is enough or no larger one helps.

    Reads the domain's documents once more (no tokenizing): each document's hash decides its split,
    and its tokens are estimated from its bytes at the domain's tokens per byte. The fraction
    is the shortest decimal that holds out the fewest documents reaching the minimum, without
    holding out more than ``MAX_AUTO_HELDOUT_SHARE`` of the domain's tokens; if the minimum needs
    more than that, the fraction that holds out a few training windows."""
    heldout = [s["splits"]["heldout"] for s in shards]
    documents, tokens = sum(h["documents"] for h in heldout), sum(h["tokens"] for h in heldout)
    window = seq_len + 1
    has_window = max(h["tokens"] for h in heldout) >= window
    if fraction <= 0 or (documents >= MIN_HELDOUT_DOCUMENTS and tokens >= MIN_HELDOUT_TOKENS and has_window):
        return None
    docs = sorted((_document_hash(text), len(text.encode("utf-8", errors="replace")))
                  for piece in pieces for text in sources_lib.read_documents(piece, text_field)
                  if text is not None and text.strip())
    total_tokens = sum(s["splits"][split]["tokens"] for s in shards for split in layout.SPLITS)
    total_bytes = sum(size for _, size in docs)
    if len(docs) < 2 or not total_bytes:
        return None
    per_byte = max(total_tokens - len(docs), 0) / total_bytes
    cap = MAX_AUTO_HELDOUT_SHARE * total_tokens
    cumulative, reach_minimum, reach_windows = 0.0, None, None
    for index, (_, size) in enumerate(docs[:-1]):
        cumulative += size * per_byte + 1  # its tokens and its EOS
        if cumulative > cap:
            break
        if reach_windows is None and cumulative >= 3 * window:
            reach_windows = index
        if index + 1 >= MIN_HELDOUT_DOCUMENTS and cumulative >= 1.1 * MIN_HELDOUT_TOKENS and cumulative >= 3 * window:
            reach_minimum = index
            break
    last = reach_minimum if reach_minimum is not None else reach_windows
    while last is not None and last + 1 < len(docs) and docs[last + 1][0] == docs[last][0]:
        last += 1  # identical documents share a hash, and a split
    if last is None or last + 1 >= len(docs):
        return None
    low, high = docs[last][0], docs[last + 1][0]  # hold out every document up to ``last``, not the next
    chosen = high / 2**64
    for digits in range(2, 17):
        candidate = math.ceil(low / 2**64 * 10**digits) / 10**digits
        if low < candidate * 2**64 <= high:
            chosen = candidate
            break
    return (chosen, reach_minimum is not None) if chosen > fraction else None


def _write_domain_manifest(out: Path, source: Source, tasks: list[ShardTask],
                           records: Mapping[tuple[str, int], dict], tok: Tokenizer,
                           heldout_fraction: float, text_field: str, seq_len: int,
                           asked_fraction: float | None = None) -> dict[str, Any]:
    """Sum the shard records of a domain into its ``manifest.json``; drop stale shard files."""
    domain = source.domain
    shards = [records[(domain, task.index)] for task in tasks]
    splits = {split: {key: sum(s["splits"][split][key] for s in shards) for key in ("documents", "tokens")}
              for split in layout.SPLITS}
    if not splits["train"]["documents"] + splits["heldout"]["documents"]:
        raise DataError(f"source {source} holds no non-empty documents (every file or record is "
                        "empty or whitespace); point it at text.")
    _check_training_windows(source, shards, splits, heldout_fraction, seq_len)
    problem = small_heldout_message(
        domain, splits["heldout"]["documents"], splits["heldout"]["tokens"],
        total_documents=splits["train"]["documents"] + splits["heldout"]["documents"],
        total_tokens=splits["train"]["tokens"] + splits["heldout"]["tokens"], fraction=heldout_fraction)
    if problem and heldout_fraction > 0:
        if asked_fraction is not None and asked_fraction != heldout_fraction:  # prepare chose it
            problem = (problem.split(": its eval_loss", 1)[0] + f": its eval_loss/{domain} will be noise. prepare "
                       f"chose --heldout-fraction {heldout_fraction:g}; the minimum would hold out more than "
                       f"{MAX_AUTO_HELDOUT_SHARE:.0%} of the domain's tokens: give it more text (in more "
                       "documents), or pass a larger --heldout-fraction to hold out more anyway.")
        warnings.warn(problem, HeldoutWarning, stacklevel=user_stacklevel())
    manifest = {
        "format": layout.FORMAT,
        "domain": domain,
        "source": str(source),
        "tokenizer": tok.name,
        "dtype": token_dtype(tok.vocab_size).name,
        "heldout_fraction": heldout_fraction,
        "heldout_fraction_asked": heldout_fraction if asked_fraction is None else asked_fraction,
        "text_field": text_field,
        "input_bytes": sum(s["input_bytes"] for s in shards),
        "skipped_documents": sum(s["skipped_documents"] for s in shards),
        "splits": splits,
        "sha256": combined_hash(
            s["splits"][split]["files"][array]["sha256"]
            for s in shards for split in layout.SPLITS for array in layout.ARRAYS
        ),
        "shards": [{key: s[key] for key in ("index", "input_bytes", "skipped_documents", "splits")}
                   for s in shards],
    }
    _remove_stale_shards(out / domain, len(tasks))
    _write_json(out / domain / layout.MANIFEST_FILE, manifest)
    return manifest


def _check_training_windows(source: Source, shards: list[dict], splits: dict, heldout_fraction: float,
                            seq_len: int) -> None:
    """Both splits of a domain hold a training window of ``seq_len + 1`` tokens in one shard
    (windows never cross shards), or a ``DataError`` that says how to get one: training would
    refuse the domain later. With ``heldout_fraction`` 0 the user asked for no held-out split:
    a warning only."""
    window = seq_len + 1
    total_documents = sum(split["documents"] for split in splits.values())
    total_tokens = sum(split["tokens"] for split in splits.values())
    for split in layout.SPLITS:
        largest = max(shard["splits"][split]["tokens"] for shard in shards)
        if largest >= window:
            continue
        name = "held-out" if split == "heldout" else split
        message = (f"domain {source.domain!r}: its {name} split has {splits[split]['documents']:,} "
                   f"documents / {splits[split]['tokens']:,} tokens, less than one training window of "
                   f"{window} tokens (train.seq_len {seq_len} + 1; --seq-len) in any shard, so training or "
                   f"evaluating on it would stop.")
        if split == "heldout" and heldout_fraction == 0:
            warnings.warn(f"{message} (--heldout-fraction 0 asks for no held-out split.)", HeldoutWarning,
                          stacklevel=user_stacklevel())
            continue
        raise DataError(f"{message} {_window_fix(split, heldout_fraction, total_documents, total_tokens, window)}")


def _window_fix(split: str, fraction: float, documents: int, tokens: int, window: int) -> str:
    """How to give a split a training window: another --heldout-fraction, or more text."""
    if tokens < 2 * window or documents < 2:
        return (f"The source holds {documents:,} document(s) / {tokens:,} tokens in all; give it more "
                "text, in more documents (e.g. one JSONL record per document).")
    if split == "heldout":  # expect about 5 documents and 3 windows held out (the hash split varies)
        suggested = float(f"{min(0.5, max(5 / documents, 3 * window / tokens)):.2g}")
    else:
        suggested = float(f"{fraction / 2:.2g}")
    return (f"Rerun the prepare command with --heldout-fraction {suggested:g} (now {fraction:g}); the "
            "shards are redone with the new split.")


def _remove_stale_shards(directory: Path, num_shards: int) -> None:
    """Delete shard files left by an earlier run that planned more shards."""
    keep = {layout.shard_name(i) for i in range(num_shards)}
    for path in directory.glob("shard-*"):
        if path.name.split(".", 1)[0] not in keep:
            path.unlink()


def _remove_temporaries(directory: Path) -> None:
    for path in directory.glob(f".*{layout.TMP_SUFFIX}"):
        path.unlink()


class _HashingWriter:
    """A file wrapper that hashes what is written through it (``np.save`` needs only ``write``)."""

    def __init__(self, file):
        self.file, self.sha256, self.bytes = file, hashlib.sha256(), 0

    def write(self, data) -> int:
        self.sha256.update(data)
        self.bytes += len(data)
        return self.file.write(data)


def _write_npy(path: Path, array: np.ndarray) -> dict[str, Any]:
    """Save ``array`` atomically (temp file, fsync, rename); returns name, sha256 and size."""
    tmp = layout.tmp_path(path)
    with open(tmp, "wb") as f:
        writer = _HashingWriter(f)
        np.save(writer, np.ascontiguousarray(array), allow_pickle=False)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return {"name": path.name, "sha256": writer.sha256.hexdigest(), "bytes": writer.bytes}


def _write_json(path: Path, value: Any) -> None:
    """Write JSON atomically (temp file, fsync, rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = layout.tmp_path(path)
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(value, f, indent=1, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m moejax.data.prepare",
        description="Tokenize text sources (one per domain) into a prepared dataset for training "
                    "(config: data.path=OUT).",
    )
    parser.add_argument("--source", action="append", default=[], metavar="DOMAIN=PATH", type=_user_source,
                        help="a directory (its .txt/.jsonl/.parquet files, and .txt/.jsonl compressed: "
                             ".gz, .zst), a file, a quoted glob, or hf:PATH[:column] (a Hugging Face dataset "
                             "saved with save_to_disk); repeat for each domain")
    parser.add_argument("--out", required=True, type=paths.path_type,
                        help="dataset directory (created; an existing dataset is resumed or gains domains)")
    parser.add_argument("--tokenizer", default="byte", type=paths.keyword_or_path_type("byte", "bpe"),
                        help="byte | bpe (trained on the sources) | PATH: a Hugging Face tokenizer.json, a "
                             "directory holding one (a model directory, a workdir's tokenizer/) or a prepared "
                             "dataset whose tokenizer to reuse")
    for role in ("bos", "eos", "pad"):
        parser.add_argument(f"--{role}-token", default=None, metavar="TOKEN",
                            help=f"PATH only: the {role.upper()} token (default: the one tokenizer_config.json "
                                 "or special_tokens_map.json names" + ("; else EOS)" if role == "pad" else ")"))
    parser.add_argument("--vocab-size", type=int, default=DEFAULT_VOCAB_SIZE, help="BPE only")
    parser.add_argument("--bpe-sample-mb", type=float, default=DEFAULT_BPE_SAMPLE_MB,
                        help="MB of text (over all domains) the BPE is trained on")
    parser.add_argument("--heldout-fraction", type=float, default=DEFAULT_HELDOUT_FRACTION)
    parser.add_argument("--text-field", default="text", help="JSONL field / Parquet column")
    parser.add_argument("--shard-mb", type=float, default=DEFAULT_SHARD_MB,
                        help="input MB per shard (the unit of parallel work and of resumption)")
    parser.add_argument("--workers", type=int, default=None,
                        help="processes (default: one per CPU, at most one per 32 MB of input)")
    parser.add_argument("--seq-len", type=int, default=DEFAULT_SEQ_LEN,
                        help="the train.seq_len training will use: every split of every domain must hold "
                             "one window of it")
    parser.add_argument("--unique-tokens", action="append", default=[], metavar="DOMAIN=N",
                        help="a data-constrained domain: training reads only N unique tokens of it and repeats "
                             "them (recorded in dataset.json; a run's data.unique_tokens overrides it)")
    parser.add_argument("--verify", action="store_true",
                        help="only check every file of --out against its manifest checksums")
    add_verbosity_flags(parser)
    args = parser.parse_args(argv)
    out = args.out
    return run(lambda: _prepare(args, out), prog="prepare", verbosity=args.verbosity,
               interrupted=f"interrupted; the shards finished so far are kept in {out}. Rerun the same "
                           "command to resume (finished shards are skipped).")


def _prepare(args: argparse.Namespace, out: str) -> None:
    """``prepare``'s work: verify, or tokenize the sources, and print the summary."""
    if args.verify:
        from moejax.data.dataset import verify_dataset

        checked = verify_dataset(out)
        print(f"{out}: {checked} files match their checksums")
        return
    tokenizer = args.tokenizer
    special_tokens = {"bos": args.bos_token, "eos": args.eos_token, "pad": args.pad_token}
    summary = prepare_dataset(
        args.source, out, tokenizer=tokenizer, special_tokens=special_tokens,
        vocab_size=args.vocab_size, bpe_sample_mb=args.bpe_sample_mb,
        heldout_fraction=args.heldout_fraction, text_field=args.text_field, shard_mb=args.shard_mb,
        workers=args.workers, seq_len=args.seq_len,
        unique_tokens=parse_unique_tokens(",".join(args.unique_tokens), "--unique-tokens"),
    )
    for domain, splits in summary["domains"].items():
        print(f"{domain:>12}: " + ", ".join(
            f"{split} {s['documents']:,} docs / {s['tokens']:,} tokens" for split, s in splits.items()))
    trained = f" (BPE trained in {summary['bpe_train_s']:.1f} s)" if summary["bpe_train_s"] else ""
    if summary["tokenizer_source"]:
        specials = ", ".join(f"{role} {token!r}" for role, token in summary["special_tokens"].items() if token)
        trained = f" (from {summary['tokenizer_source']}; {specials})"
    print(f"{summary['out']}: tokenizer {summary['tokenizer']}{trained}, {summary['shards_tokenized']} "
          f"shards tokenized, {summary['shards_skipped']} already done, "
          f"{summary['tokenized_bytes'] / MB:.1f} MB in {summary['seconds']:.1f} s "
          f"({summary['workers']} worker{'s' if summary['workers'] > 1 else ''})")
    return 0


@paths.path_flag_type
def _user_source(arg: str) -> str:
    """``DOMAIN=PATH`` (or ``DOMAIN=hf:PATH[:column]``) with PATH resolved as the user meant it (a
    malformed one is left to ``parse_source`` to report)."""
    return sources_lib.user_source(arg, paths.user_path)


def _show_warning(message, category, filename, lineno, file=None, line=None, _default=warnings.showwarning):
    """On the command line, warnings about the user's data are one line, without a source line."""
    if issubclass(category, (HeldoutWarning, SkippedFilesWarning)):
        (file or sys.stderr).write(f"prepare: warning: {message}\n")
    else:
        _default(message, category, filename, lineno, file, line)


if __name__ == "__main__":
    warnings.showwarning = _show_warning
    sys.exit(main())
