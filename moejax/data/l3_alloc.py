"""Rows per token for a Large Lookup Layer (L3): offsets from an LZW parse of a corpus sample.

An L3 layer gives token id ``t`` the rows ``[offsets[t], offsets[t + 1])`` of its key and value
tables. Everything about an allocation (the format ``offsets_v1``, its checks and file, the LZW
and uniform allocations, the offsets a model holds) is in :mod:`moejax.model.l3_allocation`; this
module samples a dataset's training split for it and is its command line.

Two allocations:

- ``lzw_allocation`` (the L3 paper's, Tseng and De Sa, "L^3: Large Lookup Layers",
  arXiv:2601.21461, Algorithm 1): parse a token sample with LZW; rank the codewords by how often
  the parse emits them; every token starts with one row, and going down the ranking each
  codeword gives one more row to its *last* token (skipping tokens at the cap) until the budget
  is spent. A token that ends many frequent codewords, i.e. that occurs often in many distinct
  contexts, gets many rows. The choices where the paper leaves room are listed in ``docs/l3.md``
  ("## Allocation") and in ``lzw_allocation``'s docstring.
- ``uniform_allocation``, the ablation: rows spread as evenly as possible.

``python -m moejax.data.l3_alloc`` computes one from a dataset's training split and saves it
(``save_allocation``) beside the tokenizer it was computed for::

    python -m moejax.data.l3_alloc --budget 4096 --max-rows 64 [--method lzw|uniform] \\
        [--data-path DIR] [--sample-tokens 1000000] [--vocab-size V] [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Final, NoReturn

import numpy as np
import numpy.typing as npt

from moejax import paths
from moejax.errors import DataError
from moejax.model.l3_allocation import (
    FORMAT, Allocation, check_allocation, check_budget, load_allocation, lzw_allocation, lzw_codewords,
    offsets_sha256, save_allocation, uniform_allocation,
)
from moejax.log import add_verbosity_flags
from moejax.runner import run

METHODS: Final = ("lzw", "uniform")
DEFAULT_SAMPLE_TOKENS: Final = 1_000_000
# Contiguous pieces a domain's share of the sample is cut into, spread evenly over its train split.
CHUNKS_PER_DOMAIN: Final = 16

__all__ = [
    "CHUNKS_PER_DOMAIN", "DEFAULT_SAMPLE_TOKENS", "FORMAT", "METHODS", "Allocation", "check_allocation",
    "check_budget", "default_out_path", "load_allocation", "lzw_allocation", "lzw_codewords", "main",
    "offsets_sha256", "rows_histogram", "sample_train_tokens", "save_allocation", "summary_lines",
    "uniform_allocation",
]


# --- where the command line saves --------------------------------------------------------------


def default_out_path(data_path: str, method: str, budget: int, max_rows: int,
                     cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Where the CLI saves an allocation: beside the tokenizer, i.e. in the prepared dataset
    directory, or in the built-in corpus's cache directory (``data_path == ""``)."""
    name = f"l3_allocation_{method}_v{budget}_k{max_rows}.json"
    if str(data_path):
        return Path(data_path) / name
    from moejax.data import corpus as corpus_lib
    from moejax.data.dataset import BUILTIN_CORPUS_SEED

    root = Path(cache_dir or corpus_lib.default_cache_dir())
    return root / f"{corpus_lib.CORPUS_VERSION}-seed{BUILTIN_CORPUS_SEED}" / name


# --- sampling ----------------------------------------------------------------------------------


def sample_train_tokens(dataset, num_tokens: int, chunks_per_domain: int = CHUNKS_PER_DOMAIN) -> np.ndarray:
    """About ``num_tokens`` tokens of a ``TokenDataset``'s train split, as one int64 stream.

    Each domain gets an equal share (a domain with fewer train tokens gives all it has and the
    rest is shared by the others), cut into ``chunks_per_domain`` contiguous pieces taken at
    evenly spaced positions of the domain's train shards; pieces are concatenated in domain
    order. Deterministic. Fewer tokens come back only when the whole train split is smaller.
    """
    sizes = {d: sum(s.num_tokens for s in dataset.streams(d, "train")) for d in dataset.domains}
    shares: dict[str, int] = {}
    left, pending = int(num_tokens), sorted(sizes, key=lambda d: (sizes[d], d))
    while pending:
        domain = pending.pop(0)
        shares[domain] = min(sizes[domain], left // (len(pending) + 1))
        left -= shares[domain]
    pieces = []
    for domain in dataset.domains:
        shards, share = dataset.streams(domain, "train"), shares[domain]
        if not share:
            continue
        chunks, gap = max(1, min(chunks_per_domain, share)), sizes[domain] - share
        for i in range(chunks):
            # Chunk i starts after i chunks' tokens and i gaps: about at i / chunks of the split.
            taken = i * share // chunks
            length = (i + 1) * share // chunks - taken
            pieces.append(_read_range(shards, taken + i * gap // chunks, length))
    return np.concatenate(pieces).astype(np.int64) if pieces else np.zeros(0, np.int64)


def _read_range(shards: Sequence, start: int, length: int) -> np.ndarray:
    """Tokens ``[start, start + length)`` of shards read as one stream."""
    out, offset = [], 0
    for shard in shards:
        lo, hi = max(start - offset, 0), min(start + length - offset, shard.num_tokens)
        if lo < hi:
            out.append(np.asarray(shard.tokens[lo:hi]))
        offset += shard.num_tokens
    return np.concatenate(out) if out else np.zeros(0, np.int64)


# --- command line ------------------------------------------------------------------------------


def rows_histogram(offsets: npt.ArrayLike, max_rows: int) -> np.ndarray:
    """``hist[r]`` = how many tokens own ``r`` rows, for ``r`` in ``0..max_rows``."""
    return np.bincount(np.diff(np.asarray(offsets)), minlength=max_rows + 1)


def _token_label(tokenizer, token: int) -> str:
    if token >= tokenizer.vocab_size:
        return f"<unused {token}>"
    for name in ("bos_id", "eos_id", "pad_id"):
        if getattr(tokenizer, name, None) == token:
            return f"<{name[:-3]}>"
    text = tokenizer.decode(np.asarray([token]))
    if not text or "\ufffd" in text:
        return f"<0x{token:02X}>" if token < 256 and tokenizer.name == "byte" else f"<id {token}>"
    return repr(text)


def summary_lines(offsets: np.ndarray, max_rows: int, tokenizer, top: int = 10,
                  token_counts: np.ndarray | None = None) -> list[str]:
    """The CLI's summary: the rows histogram and the ``top`` tokens by rows, decoded (ties go to
    the token more frequent in ``token_counts`` when given, then to the lower id)."""
    hist = rows_histogram(offsets, max_rows)
    bins = [f"{r}:{int(n)}" for r, n in enumerate(hist) if n and r]
    lines = [f"rows per token (rows:tokens): min {int(np.diff(offsets).min())}, max "
             f"{int(np.diff(offsets).max())}, {int(hist[max_rows])} tokens at the cap {max_rows}"]
    lines += ["  " + " ".join(bins[i:i + 12]) for i in range(0, len(bins), 12)]
    rows = np.diff(offsets)
    counts = np.zeros_like(rows) if token_counts is None else np.asarray(token_counts)
    order = np.lexsort((np.arange(rows.size), -counts, -rows))[:top]
    lines.append(f"top {len(order)} tokens by rows: " + ", ".join(
        f"{_token_label(tokenizer, int(t))} ({int(t)}): {int(rows[t])}" for t in order))
    return lines


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        sys.stderr.write(f"moejax: error: {message}\n")
        sys.exit(2)


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(
        prog="python -m moejax.data.l3_alloc",
        description="Compute the rows per token of a Large Lookup Layer (L3) from a sample of a "
                    "dataset's training split, and save them beside the tokenizer.",
    )
    parser.add_argument("--budget", type=int, required=True, metavar="V_ROWS",
                        help="total rows of the key/value tables (>= vocabulary size)")
    parser.add_argument("--max-rows", type=int, required=True, metavar="K",
                        help="the most rows one token may own (k >= 1)")
    parser.add_argument("--method", choices=METHODS, default="lzw",
                        help="lzw (the L3 paper's allocation) or uniform (the ablation)")
    parser.add_argument("--data-path", default="", type=paths.path_type,
                        help="a prepared dataset directory; '' (default): the built-in corpus")
    parser.add_argument("--sample-tokens", type=int, default=DEFAULT_SAMPLE_TOKENS, metavar="N",
                        help="tokens sampled from the training split (default 1,000,000)")
    parser.add_argument("--vocab-size", type=int, default=None, metavar="V",
                        help="the model's vocabulary (default: the tokenizer's; must be >= it)")
    parser.add_argument("--out", default=None, metavar="FILE", type=paths.path_type,
                        help="output JSON (default: l3_allocation_<method>_v<budget>_k<k>.json in "
                             "the dataset directory, or the built-in corpus cache directory)")
    parser.add_argument("--force", action="store_true", help="replace an existing output file")
    add_verbosity_flags(parser)
    args = parser.parse_args(argv)
    return run(lambda: _run(args), prog="moejax", verbosity=args.verbosity,
               interrupted="interrupted; no allocation file was written. Rerun the command.")


def _run(args: argparse.Namespace) -> int:
    from moejax.data.dataset import describe_dataset, open_dataset

    if args.max_rows < 1:
        raise DataError(f"--max-rows {args.max_rows}: the most rows one token may own must be >= 1.")
    if args.sample_tokens < 1 and args.method == "lzw":
        raise DataError(f"--sample-tokens {args.sample_tokens}: sample at least 1 token, e.g. "
                        f"--sample-tokens {DEFAULT_SAMPLE_TOKENS}.")
    info = describe_dataset(args.data_path)
    tokenizer = info.tokenizer
    vocab_size = tokenizer.vocab_size if args.vocab_size is None else args.vocab_size
    if vocab_size < tokenizer.vocab_size:
        raise DataError(
            f"--vocab-size {vocab_size} is smaller than the vocabulary of {info.description}'s "
            f"tokenizer {tokenizer.name!r} ({tokenizer.vocab_size} tokens). Use --vocab-size >= "
            f"{tokenizer.vocab_size} (the model's vocabulary), or leave it out."
        )
    check_budget(vocab_size, args.budget, args.max_rows)
    out = Path(args.out) if args.out else default_out_path(args.data_path, args.method, args.budget,
                                                           args.max_rows)
    paths.check_new_file(str(out), "--out", force=args.force)
    start = time.perf_counter()
    sample_tokens = 0
    if args.method == "lzw":
        tokens = sample_train_tokens(open_dataset(args.data_path), args.sample_tokens)
        if not tokens.size:
            raise DataError(f"{info.description} has no training tokens to sample; prepare it "
                            "with more documents, or use --method uniform.")
        sample_tokens = int(tokens.size)
        sampled = time.perf_counter()
        offsets = lzw_allocation(tokens, vocab_size, args.budget, args.max_rows)
        timing = (f"sampled {sample_tokens:,} train tokens in {sampled - start:.1f} s, "
                  f"LZW allocation in {time.perf_counter() - sampled:.1f} s")
    else:
        offsets = uniform_allocation(vocab_size, args.budget, args.max_rows)
        timing = "uniform allocation (no sample)"
    sha256 = save_allocation(out, offsets, method=args.method, max_rows=args.max_rows,
                             tokenizer=tokenizer.name, sample_tokens=sample_tokens)
    print(f"{args.method} allocation of {args.budget:,} rows over {vocab_size:,} tokens (k="
          f"{args.max_rows}) for {info.description}, tokenizer {tokenizer.name}: {timing}")
    counts = np.bincount(tokens, minlength=vocab_size) if args.method == "lzw" else None
    for line in summary_lines(offsets, args.max_rows, tokenizer, token_counts=counts):
        print(line)
    print(f"wrote {out} (sha256 {sha256[:16]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
