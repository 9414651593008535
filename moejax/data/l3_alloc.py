"""Rows per token for a Large Lookup Layer (L3): offsets from an LZW parse of a corpus sample.

An L3 layer gives token id ``t`` the rows ``[offsets[t], offsets[t + 1])`` of its key and value
tables. The format (``offsets_v1``), its checks, the allocation file and the uniform allocation
are the model's (:mod:`moejax.model.l3_allocation`, re-exported here); this module computes an
allocation from data and is its command line.

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
from moejax.model.l3_allocation import (  # the format; re-exported for this module's users
    FORMAT, Allocation, check_allocation, check_budget, check_int, load_allocation, offsets_sha256,
    rows_to_offsets, save_allocation, uniform_allocation,
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


# --- allocations -------------------------------------------------------------------------------


def lzw_codewords(tokens: npt.ArrayLike, vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """LZW-parse ``tokens``; returns ``(emit_counts, last_tokens)``, both indexed by code.

    The dictionary starts with the ``vocab_size`` single tokens (codes ``0..V-1``). At each
    step the parse takes the longest codeword ``w`` matching at the current position, emits it
    (``emit_counts[w] += 1``), adds ``w`` followed by the next token as a new codeword (code
    ``V, V+1, ...`` in order of creation), and continues at that next token. The dictionary is
    not bounded (at most one new codeword per token). ``last_tokens[c]`` is the last token of
    codeword ``c``. O(len(tokens)): one dict lookup keyed by ``(prefix code, token)`` per token.
    """
    array = np.asarray(tokens)
    if array.ndim != 1 or (array.size and not np.issubdtype(array.dtype, np.integer)):
        raise DataError(f"tokens must be a 1-D integer array, got {array.dtype}{list(array.shape)}.")
    check_int("vocab_size", vocab_size, 1, "the number of token ids (the model's vocabulary)")
    if array.size and (array.min() < 0 or array.max() >= vocab_size):
        bad = int(array.min()) if array.min() < 0 else int(array.max())
        raise DataError(
            f"the token sample holds id {bad}, outside the vocabulary [0, {vocab_size}). Pass the "
            f"vocabulary the tokens come from: --vocab-size >= {int(array.max()) + 1}."
        )
    counts = [0] * vocab_size
    last = list(range(vocab_size))
    if array.size:
        stream = array.tolist()
        codes: dict[tuple[int, int], int] = {}
        get = codes.get
        w = stream[0]
        for c in stream[1:]:
            code = get((w, c))
            if code is None:
                counts[w] += 1
                codes[(w, c)] = len(counts)
                counts.append(0)
                last.append(c)
                w = c
            else:
                w = code
        counts[w] += 1
    return np.asarray(counts, dtype=np.int64), np.asarray(last, dtype=np.int64)


def lzw_allocation(
    tokens: npt.ArrayLike, vocab_size: int, budget: int, max_rows: int
) -> npt.NDArray[np.int64]:
    """Offsets (``offsets_v1``) from an LZW parse of ``tokens`` (the L3 paper's Algorithm 1).

    1. Parse ``tokens`` with LZW (``lzw_codewords``) and count how often each codeword is
       emitted.
    2. Rank the emitted codewords by that count, most frequent first; ties go to the codeword
       created first (lower code; single tokens, in id order, come before longer codewords).
       Codewords added to the dictionary but never emitted are not ranked.
    3. Every token starts with 1 row. Going down the ranking, each codeword gives one row to
       its last token, skipping tokens already at ``max_rows``, until ``budget`` rows are given.
    4. If the ranking ends with rows left, go down it again (each pass gives at most one row
       per codeword); once no ranked codeword's last token has room, the rest goes round-robin,
       one row per pass, to the tokens below the cap in id order (tokens never seen last).

    Deterministic: the same tokens give the same offsets. Raises ``DataError`` for a budget
    that cannot be spent (see ``check_budget``) or ids outside ``[0, vocab_size)``.
    """
    check_budget(vocab_size, budget, max_rows)
    counts, last = lzw_codewords(tokens, vocab_size)
    emitted = np.flatnonzero(counts)
    ranked = emitted[np.argsort(-counts[emitted], kind="stable")]
    rows = np.ones(vocab_size, dtype=np.int64)
    remaining = budget - vocab_size
    remaining = _grant_passes(rows, last[ranked], remaining, max_rows)
    remaining = _grant_passes(rows, np.arange(vocab_size), remaining, max_rows)
    assert remaining == 0, remaining  # check_budget guarantees room for every row.
    return rows_to_offsets(rows)


def _grant_passes(rows: np.ndarray, order: np.ndarray, remaining: int, max_rows: int) -> int:
    """Walk ``order`` (token ids) in passes, one row per entry to tokens below ``max_rows``,
    until ``remaining`` rows are given or no entry has room; updates ``rows``, returns the rest.

    A pass is vectorised but equals the sequential walk: the j-th entry of token t within the
    pass gets a row iff ``j < max_rows - rows[t]``, and the budget takes the first grants.
    """
    if not order.size:
        return remaining
    by_token = np.argsort(order, kind="stable")
    sorted_tokens = order[by_token]
    group_start = np.searchsorted(sorted_tokens, sorted_tokens, side="left")
    occurrence = np.empty_like(order)
    occurrence[by_token] = np.arange(order.size) - group_start
    while remaining > 0:
        grant = occurrence < (max_rows - rows)[order]
        given = np.cumsum(grant)
        if not given.size or given[-1] == 0:
            break
        grant &= given <= remaining
        rows += np.bincount(order[grant], minlength=rows.shape[0])
        remaining -= int(min(given[-1], remaining))
    return remaining


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
    parser.add_argument("--data-path", default="",
                        help="a prepared dataset directory; '' (default): the built-in corpus")
    parser.add_argument("--sample-tokens", type=int, default=DEFAULT_SAMPLE_TOKENS, metavar="N",
                        help="tokens sampled from the training split (default 1,000,000)")
    parser.add_argument("--vocab-size", type=int, default=None, metavar="V",
                        help="the model's vocabulary (default: the tokenizer's; must be >= it)")
    parser.add_argument("--out", default=None, metavar="FILE",
                        help="output JSON (default: l3_allocation_<method>_v<budget>_k<k>.json in "
                             "the dataset directory, or the built-in corpus cache directory)")
    parser.add_argument("--force", action="store_true", help="replace an existing output file")
    add_verbosity_flags(parser)
    args = parser.parse_args(argv)
    args.data_path = paths.user_path(args.data_path)
    args.out = paths.user_path(args.out) if args.out else None
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
