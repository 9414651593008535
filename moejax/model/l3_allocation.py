"""The L3 row allocation format: rows per token of a Large Lookup Layer, and its file.

An L3 layer (:mod:`moejax.model.l3`) gives token id ``t`` the rows ``[offsets[t], offsets[t + 1])``
of its key and value tables. ``offsets`` (format ``offsets_v1``) is an int64 array of shape
``[V + 1]`` with ``offsets[0] == 0``, ``offsets[-1] == v`` (the row budget) and every token's row
count ``offsets[t + 1] - offsets[t]`` in ``[1, k]`` (``k``, the cap, is ``max_rows``).

This module is everything about an allocation: the checks (``check_budget``,
``check_allocation``), the uniform allocation (rows spread as evenly as possible; the model's
default) and the LZW allocation (the L3 paper's, from a token sample), the offsets' identity
(``offsets_sha256``), the allocation file (``save_allocation`` / ``load_allocation``: JSON beside
the tokenizer it was computed for, ``format: moejax-l3-allocation-v1``, with a sha256 of the
offsets), and the offsets a model holds (:class:`RowOffsets`, from the config by
:func:`allocation_from_config`, which reads the file once per run). Sampling a dataset for the
LZW parse, and the command line ``python -m moejax.data.l3_alloc`` (``moejax l3-alloc``), are in
:mod:`moejax.data.l3_alloc`. Every error is a :class:`~moejax.errors.DataError` saying how to
fix it.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from moejax.errors import DataError

FORMAT: Final = "moejax-l3-allocation-v1"
_FIELDS: Final = ("format", "vocab_size", "budget", "max_rows", "method", "tokenizer",
                  "sample_tokens", "offsets", "sha256")


@dataclasses.dataclass(frozen=True, eq=False)
class Allocation:
    """A loaded allocation file: read-only ``offsets`` plus what it was computed with."""

    offsets: npt.NDArray[np.int64]  # [V + 1], read-only
    budget: int
    max_rows: int
    method: str
    tokenizer: str
    sha256: str
    sample_tokens: int = 0

    @property
    def vocab_size(self) -> int:
        return int(self.offsets.shape[0]) - 1

    @property
    def rows(self) -> npt.NDArray[np.int64]:
        """Rows per token, shape ``[V]``."""
        return np.diff(self.offsets)


# --- validation ----------------------------------------------------------------------------------


def check_budget(vocab_size: int, budget: int, max_rows: int) -> None:
    """Raise a ``DataError`` unless ``budget`` rows can go to ``vocab_size`` tokens, 1..``max_rows`` each."""
    check_int("vocab_size", vocab_size, 1, "the number of token ids (the model's vocabulary)")
    check_int("max_rows", max_rows, 1, "the most rows one token may own (k), e.g. --max-rows 64")
    check_int("budget", budget, 1, "the total number of rows (v), e.g. --budget 4096")
    if budget < vocab_size:
        raise DataError(
            f"budget {budget} is smaller than the vocabulary ({vocab_size} tokens): every token "
            f"needs at least one row. Use --budget >= {vocab_size}."
        )
    if budget > vocab_size * max_rows:
        raise DataError(
            f"budget {budget} cannot be spent: {vocab_size} tokens with at most max_rows="
            f"{max_rows} rows each hold only {vocab_size * max_rows} rows. Use --budget <= "
            f"{vocab_size * max_rows}, or --max-rows >= {math.ceil(budget / vocab_size)}."
        )


def check_allocation(
    offsets: npt.ArrayLike,
    vocab_size: int,
    budget: int | None = None,
    max_rows: int | None = None,
) -> None:
    """Raise a ``DataError`` unless ``offsets`` is a valid ``offsets_v1`` allocation.

    ``offsets`` must be integers of shape ``[vocab_size + 1]``, start at 0, end at ``budget``
    (when given) and give every token between 1 and ``max_rows`` (when given) rows.
    """
    array = np.asarray(offsets)
    if array.ndim != 1 or (array.size and not np.issubdtype(array.dtype, np.integer)):
        raise DataError(
            f"allocation offsets must be a 1-D integer array of shape [V + 1], got "
            f"{array.dtype}{list(array.shape)}. Compute them with lzw_allocation or "
            "uniform_allocation (python -m moejax.data.l3_alloc)."
        )
    check_int("vocab_size", vocab_size, 1, "the number of token ids (the model's vocabulary)")
    if max_rows is not None:
        check_int("max_rows", max_rows, 1, "the most rows one token may own (k), e.g. --max-rows 64")
    if budget is not None:
        check_budget(vocab_size, budget, max_rows if max_rows is not None else budget)
    if array.shape[0] != vocab_size + 1:
        raise DataError(
            f"allocation has {max(array.shape[0] - 1, 0)} tokens but the vocabulary has "
            f"{vocab_size}: it was computed for another vocabulary. Recompute it with "
            f"python -m moejax.data.l3_alloc --vocab-size {vocab_size} ..."
        )
    if array[0] != 0:
        raise DataError(f"allocation offsets must start at 0, got offsets[0] = {int(array[0])}. "
                        "Recompute the allocation with python -m moejax.data.l3_alloc.")
    rows = np.diff(array.astype(np.int64))
    if (rows < 0).any():
        t = int(np.argmax(rows < 0))
        raise DataError(
            f"allocation offsets are not monotone: offsets[{t + 1}] = {int(array[t + 1])} < "
            f"offsets[{t}] = {int(array[t])}. Offsets are cumulative row counts; recompute the "
            "allocation with python -m moejax.data.l3_alloc."
        )
    if (rows < 1).any():
        t = int(np.argmax(rows < 1))
        raise DataError(
            f"token {t} gets 0 rows (offsets[{t}] == offsets[{t + 1}] == {int(array[t])}), but "
            "every token needs between 1 and max_rows rows. Recompute the allocation with "
            "python -m moejax.data.l3_alloc."
        )
    if max_rows is not None and (rows > max_rows).any():
        t = int(np.argmax(rows > max_rows))
        raise DataError(
            f"token {t} gets {int(rows[t])} rows, more than max_rows={max_rows}: every token "
            f"needs between 1 and {max_rows} rows. Recompute the allocation with --max-rows "
            f"{max_rows}, or raise max_rows to {int(rows.max())}."
        )
    if budget is not None and array[-1] != budget:
        raise DataError(
            f"allocation holds {int(array[-1])} rows but the budget is {budget}. Recompute it "
            f"with python -m moejax.data.l3_alloc --budget {budget} ..."
        )


def check_int(name: str, value: Any, minimum: int, meaning: str) -> None:
    """Raise a ``DataError`` unless ``value`` is an int >= ``minimum``; ``meaning`` says what it is."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise DataError(f"{name} must be an int >= {minimum} ({meaning}), got {value!r}.")


# --- allocations ---------------------------------------------------------------------------------


def uniform_allocation(vocab_size: int, budget: int, max_rows: int) -> npt.NDArray[np.int64]:
    """Offsets spreading ``budget`` rows evenly: ``budget // V`` rows each, one more for the first
    ``budget % V`` token ids. The cap never binds, since ``budget <= V * max_rows``."""
    check_budget(vocab_size, budget, max_rows)
    rows = np.full(vocab_size, budget // vocab_size, dtype=np.int64)
    rows[: budget % vocab_size] += 1
    return rows_to_offsets(rows)


def rows_to_offsets(rows: np.ndarray) -> npt.NDArray[np.int64]:
    """Offsets (``offsets_v1``) of rows per token ``rows`` [V]: 0, then their running sum."""
    return np.concatenate([[0], np.cumsum(rows)]).astype(np.int64)


# --- files ---------------------------------------------------------------------------------------


def offsets_sha256(offsets: npt.ArrayLike) -> str:
    """sha256 of the offsets as little-endian int64 bytes."""
    return hashlib.sha256(np.asarray(offsets, dtype="<i8").tobytes()).hexdigest()


def save_allocation(
    path: str | os.PathLike[str],
    offsets: npt.ArrayLike,
    *,
    method: str,
    max_rows: int,
    tokenizer: str,
    sample_tokens: int,
) -> str:
    """Validate ``offsets`` and write them as an allocation JSON file (atomically); returns the
    sha256 of the offsets. The budget and vocabulary size are read off the offsets."""
    array = np.asarray(offsets)
    vocab_size = max(int(array.shape[0]) - 1, 1) if array.ndim == 1 else 1
    check_allocation(array, vocab_size)  # shape, dtype and rows >= 1 first: then the budget is sane
    budget = int(array[-1])
    check_allocation(array, vocab_size, budget, max_rows)
    for name, value in (("method", method), ("tokenizer", tokenizer)):
        if not isinstance(value, str) or not value:
            raise DataError(f"{name} must be a non-empty string, got {value!r}.")
    check_int("sample_tokens", sample_tokens, 0, "how many tokens the allocation was computed from")
    sha256 = offsets_sha256(array)
    record = {
        "format": FORMAT, "vocab_size": vocab_size, "budget": budget, "max_rows": int(max_rows),
        "method": method, "tokenizer": tokenizer, "sample_tokens": int(sample_tokens),
        "sha256": sha256,
    }
    # One line for the offsets, one per other field: small, diffable, readable.
    text = "{\n" + "".join(f" {json.dumps(k)}: {json.dumps(v)},\n" for k, v in record.items())
    text += f' "offsets": {json.dumps(array.astype(np.int64).tolist())}\n}}\n'
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".{final.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)
    return sha256


def load_allocation(path: str | os.PathLike[str], vocab_size: int | None = None) -> Allocation:
    """Read and validate an allocation file; with ``vocab_size``, it must be for that vocabulary.

    Every error is a ``DataError`` naming the file: missing or unreadable, another format,
    offsets that do not match their sha256 (the file was edited) or fail ``check_allocation``,
    recorded fields that disagree with the offsets, or another vocabulary size.
    """
    where = str(path)
    try:
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
    except FileNotFoundError:
        raise DataError(f"L3 allocation file {where} does not exist. Create it with: python -m "
                        "moejax.data.l3_alloc --budget V_ROWS --max-rows K --out " + where) from None
    except (OSError, ValueError) as e:
        raise DataError(f"cannot read L3 allocation file {where} ({e}); recreate it with "
                        "python -m moejax.data.l3_alloc.") from None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        found = record.get("format") if isinstance(record, dict) else type(record).__name__
        raise DataError(f"{where} is not an L3 allocation file: its format is {found!r}, expected "
                        f"{FORMAT!r}. Recreate it with python -m moejax.data.l3_alloc.")
    missing = [key for key in _FIELDS if key not in record]
    if missing:
        raise DataError(f"L3 allocation file {where} lacks {', '.join(missing)}; recreate it with "
                        "python -m moejax.data.l3_alloc.")
    recorded = {key: record[key] for key in ("vocab_size", "budget", "max_rows", "sample_tokens")}
    values = record["offsets"] if isinstance(record["offsets"], list) else [None]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in [*recorded.values(), *values]):
        raise DataError(f"L3 allocation file {where} holds a non-integer offset or count; recreate "
                        "it with python -m moejax.data.l3_alloc.")
    try:
        offsets = np.asarray(values, dtype=np.int64)
    except OverflowError:
        raise DataError(f"L3 allocation file {where} holds an offset beyond int64; recreate it with "
                        "python -m moejax.data.l3_alloc.") from None
    if offsets.ndim != 1 or offsets_sha256(offsets) != record["sha256"]:
        raise DataError(
            f"L3 allocation file {where} is corrupt or was edited: its offsets do not match the "
            f"sha256 it records ({record['sha256']}). Recreate it with python -m moejax.data.l3_alloc."
        )
    try:
        check_allocation(offsets, recorded["vocab_size"], recorded["budget"], recorded["max_rows"])
    except DataError as e:
        raise DataError(f"L3 allocation file {where}: {e}") from None
    if vocab_size is not None and vocab_size != recorded["vocab_size"]:
        raise DataError(
            f"L3 allocation file {where}: allocation has {recorded['vocab_size']} tokens but the "
            f"vocabulary has {vocab_size}. Recompute it for this vocabulary: python -m "
            f"moejax.data.l3_alloc --vocab-size {vocab_size} --budget {recorded['budget']} "
            f"--max-rows {recorded['max_rows']} ..."
        )
    offsets.setflags(write=False)
    return Allocation(offsets=offsets, budget=recorded["budget"], max_rows=recorded["max_rows"],
                      method=str(record["method"]), tokenizer=str(record["tokenizer"]),
                      sha256=str(record["sha256"]), sample_tokens=recorded["sample_tokens"])


# --- the LZW allocation (the L3 paper's) --------------------------------------------------------


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


# --- the offsets a model holds --------------------------------------------------------------------


class RowOffsets:
    """An allocation ``offsets_v1`` as a static value: the module holds it in its graph, not among
    its parameters, so the optimizer and checkpointed parameters never see it.

    Equal and hashed by ``sha256``, the SHA-256 of the offsets as little-endian int64 bytes (the
    allocation's identity, recorded with the run; the same digest an allocation file records).
    ``method`` says how it was made ("uniform", "lzw").
    """

    def __init__(self, offsets_v1, method: str):
        offsets_v1 = np.array(offsets_v1, dtype=np.int64)
        offsets_v1.setflags(write=False)
        self.offsets_v1 = offsets_v1
        self.method = method
        self.sha256 = offsets_sha256(offsets_v1)

    @property
    def budget(self) -> int:
        return int(self.offsets_v1[-1])

    @property
    def vocab_size(self) -> int:
        return len(self.offsets_v1) - 1

    def meta(self) -> dict[str, str]:
        """What a checkpoint records about the allocation."""
        return {"sha256": self.sha256, "method": self.method}

    def __eq__(self, other) -> bool:
        return isinstance(other, RowOffsets) and other.sha256 == self.sha256

    def __hash__(self) -> int:
        return hash(self.sha256)

    def __repr__(self) -> str:
        return f"RowOffsets(vocab={self.vocab_size}, rows={self.budget}, {self.method}, sha256={self.sha256[:12]})"


def allocation_from_config(model_cfg) -> RowOffsets:
    """The configured allocation: uniform from ``budget`` and ``max_rows``, or the file at
    ``model.l3.allocation``, checked against the vocabulary, budget and max_rows (``DataError``).

    The file is read once per run: validation (:func:`moejax.model.l3.check_config`) and set-up
    both ask for it, and the second gets the first's reading while the file is unchanged (same
    path, size and modification time).
    """
    l3, vocab = model_cfg.l3, model_cfg.vocab_size
    if not l3.allocation:
        return RowOffsets(uniform_allocation(vocab, l3.budget, l3.max_rows), "uniform")
    try:
        stat = os.stat(l3.allocation)
        identity = (os.path.realpath(l3.allocation), stat.st_size, stat.st_mtime_ns)
    except OSError:  # missing or unreadable: load_allocation says so
        identity = (str(l3.allocation), -1, -1)
    allocation = _read_allocation(l3.allocation, identity, vocab)
    check_allocation(allocation.offsets, vocab, l3.budget, l3.max_rows)
    return RowOffsets(allocation.offsets, allocation.method)


@functools.lru_cache(maxsize=8)
def _read_allocation(path: str, identity: tuple, vocab_size: int) -> Allocation:
    """:func:`load_allocation`, remembered by the file's identity (errors are not remembered)."""
    return load_allocation(path, vocab_size)
