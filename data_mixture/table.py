"""The runs table: one row per (run, checkpoint), read from CSV and validated before any fitting.

Columns (``docs/mixture/tables.md``, "Runs table"):

==================  ===========================================================================
``run``             run name (non-empty); the unit the bootstrap resamples
``params_total``    total parameters N (> 0)
``params_active``   parameters active per token (> 0, <= params_total; = params_total if dense)
``tokens``          training tokens seen at this checkpoint D (> 0)
``mix:<domain>``    training weight of a training domain; each row on the simplex
``loss:<domain>``   held-out loss on a validation domain (finite, > 0)
``bench:<task>``    optional benchmark score; empty = not measured (NaN)
``flops``           optional training FLOPs; empty = unknown (NaN)
``seed``            optional training seed (an integer; absent: 0 for every row). Replicates of
                    one (size, mixture) differ only in ``seed`` (and ``run``)
``base``            optional: the run a mid-training run continued from (empty: trained from
                    scratch). Every base named must be a run of the table, of the same model size
``base_tokens``     tokens the base was trained on (> 0 where ``base`` is set; empty otherwise).
                    For a mid-training run ``tokens`` counts the mid-training tokens only
``unique:<domain>`` optional: the unique tokens of a training domain's pool in that run (empty or
                    absent: unlimited); read with :meth:`RunsTable.unique_rm`. Repetition-aware
                    laws (``data_mixture/laws/repeated.py``) and the baselines use it
``epochs:<domain>`` optional: epochs of the domain's pool seen at the checkpoint (collect writes it)
``logprob:<task>``  optional: the mean log-probability of a task's correct answer (a target)
anything else       carried through unchanged as strings (``extra``)
==================  ===========================================================================

A table with mid-training runs is a *mid-training table*: the laws fit its mid-training rows
(:meth:`RunsTable.law_rows`), with D = the mid-training tokens; its bases (pretrained on the base
mixture) are the reference the runs continue from, not points of the mixture law.

Training domains (``mix:*``) and validation domains (``loss:*``) are independent sets. Every
error is a :class:`TableError` naming the 1-based data rows (header not counted) with their run
names, the column, the value and what is allowed.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from moejax.errors import UserError

REQUIRED = ("run", "params_total", "params_active", "tokens")
PROTOCOL = ("seed", "base", "base_tokens")
SIZE_COLUMNS = ("params_total", "params_active")
MIX, LOSS, BENCH = "mix:", "loss:", "bench:"
UNIQUE, EPOCHS, LOGPROB = "unique:", "epochs:", "logprob:"  # optional numeric columns kept in ``extra``
SIMPLEX_TOL = 1e-3  # rows within this of sum 1 are renormalised; hand-written CSVs carry rounding
MAX_LISTED = 8


class TableError(UserError):
    """A runs table that cannot be used: names the rows (1-based data rows and run names), columns,
    values at fault and what is allowed."""


def _rows(idx: Iterable[Any], runs: Sequence[str] | np.ndarray, values: Sequence[Any] | None = None) -> str:
    """'rows 3 (run 'a', value 'x'), 7 (run 'b') and 2 more' for 0-based indices."""
    rows = [int(i) for i in idx]
    parts = []
    for n, i in enumerate(rows[:MAX_LISTED]):
        detail = f"run {str(runs[i])!r}"
        if values is not None:
            detail += f", value {values[n]!r}"
        parts.append(f"{i + 1} ({detail})")
    more = f" and {len(rows) - MAX_LISTED} more" if len(rows) > MAX_LISTED else ""
    return ("row " if len(rows) == 1 else "rows ") + ", ".join(parts) + more


@dataclasses.dataclass(frozen=True)
class RunsTable:
    """A validated runs table (build it with :func:`read_runs` or :func:`from_columns`).

    Arrays are aligned by row; ``mix_rm`` rows lie on the simplex (renormalised), ``loss_rv`` is
    finite and > 0 (None for a query table without loss columns), ``bench_rt`` is NaN where a run
    has no score.
    """

    run: np.ndarray
    params_total: np.ndarray
    params_active: np.ndarray
    tokens: np.ndarray
    mix_domains: tuple[str, ...]
    mix_rm: np.ndarray
    loss_domains: tuple[str, ...]
    loss_rv: np.ndarray | None
    bench_tasks: tuple[str, ...]
    bench_rt: np.ndarray | None
    flops: np.ndarray | None
    extra: dict[str, np.ndarray]
    seed: np.ndarray | None = None  # (R,) int64; None: the table has no seed column (all 0)
    base: np.ndarray | None = None  # (R,) str, "" for runs trained from scratch; None: no base column
    base_tokens: np.ndarray | None = None  # (R,) float, 0 where base is ""

    def __len__(self) -> int:
        return int(self.run.shape[0])

    def size(self, column: str) -> np.ndarray:
        """The model-size column used as N: ``params_total`` or ``params_active``."""
        if column not in SIZE_COLUMNS:
            raise TableError(f"size column {column!r} is not allowed; allowed: {', '.join(SIZE_COLUMNS)}.")
        return getattr(self, column)

    def take(self, idx: Any) -> "RunsTable":
        """Row subset (boolean mask or integer indices), for hold-outs and resamples."""
        idx = np.asarray(idx)
        if idx.dtype == bool:
            idx = np.flatnonzero(idx)

        def sub(a):
            return None if a is None else a[idx]

        return dataclasses.replace(
            self,
            run=self.run[idx],
            params_total=self.params_total[idx],
            params_active=self.params_active[idx],
            tokens=self.tokens[idx],
            mix_rm=self.mix_rm[idx],
            loss_rv=sub(self.loss_rv),
            bench_rt=sub(self.bench_rt),
            flops=sub(self.flops),
            extra={k: v[idx] for k, v in self.extra.items()},
            seed=sub(self.seed),
            base=sub(self.base),
            base_tokens=sub(self.base_tokens),
        )

    def seeds(self) -> np.ndarray:
        """(R,) training seed of every row (0 where the table has no ``seed`` column)."""
        return np.zeros(len(self), np.int64) if self.seed is None else self.seed

    def mid_training(self) -> np.ndarray:
        """(R,) bool: rows of mid-training runs (a non-empty ``base``)."""
        return np.zeros(len(self), bool) if self.base is None else self.base != ""

    def law_rows(self) -> "RunsTable":
        """The rows a mixture law is fitted to and scored on: the mid-training rows of a
        mid-training table (its bases are pretrained on one base mixture, in another regime),
        every row otherwise."""
        mid = self.mid_training()
        return self.take(mid) if mid.any() else self

    def mixture_keys(self, size_column: str = "params_total", decimals: int = 6) -> np.ndarray:
        """(R,) int id of each row's (model size, mixture, tokens) cell: rows of one cell differ
        only in seed (replicates) -- the unit a comparison averages over."""
        key = np.concatenate([self.size(size_column)[:, None], np.round(self.mix_rm, decimals), self.tokens[:, None]], axis=1)
        _, inverse = np.unique(key, axis=0, return_inverse=True)
        return inverse.reshape(-1)

    def run_groups(self) -> tuple[np.ndarray, np.ndarray]:
        """(unique run names, inverse index (R,)): row r belongs to run ``names[inverse[r]]``."""
        names, inverse = np.unique(self.run, return_inverse=True)
        return names, inverse.reshape(-1)

    def numeric_extra(self, column: str, *, positive: bool = False) -> np.ndarray:
        """(R,) floats of an extra column (NaN where empty); a TableError naming the column and
        rows when a cell is not a number (or, with ``positive``, not > 0)."""
        if column not in self.extra:
            raise TableError(f"column {column!r} is not in the table; its extra columns: {', '.join(self.extra) or 'none'}.")
        return _numeric(column, list(self.extra[column]), self.run, empty="nan", positive=positive)

    def unique_rm(self, domains: Sequence[str] | None = None) -> np.ndarray:
        """(R, M) unique tokens of each training domain's pool (``unique:<domain>``; ``inf`` where
        the column is absent or the cell empty: an unlimited domain), in ``domains`` order
        (default ``mix_domains``)."""
        domains = self.mix_domains if domains is None else tuple(domains)
        out = np.full((len(self), len(domains)), np.inf)
        for j, d in enumerate(domains):
            if UNIQUE + d in self.extra:
                col = self.numeric_extra(UNIQUE + d, positive=True)
                out[:, j] = np.where(np.isnan(col), np.inf, col)
        stray = [c for c in self.extra if c.startswith(UNIQUE) and c[len(UNIQUE):] not in self.mix_domains]
        if stray:
            raise TableError(f"column(s) {', '.join(stray)} name no training domain; the table's training domains: "
                             f"{', '.join(self.mix_domains)} (a unique:<domain> column gives a mix:<domain>'s pool).")
        return out

    def loss(self, domain: str) -> np.ndarray:
        """(R,) observed loss of one validation domain; a clear error for unknown domains."""
        if self.loss_rv is None or domain not in self.loss_domains:
            known = ", ".join(self.loss_domains) or "none"
            raise TableError(f"validation domain {domain!r} is not in the table (column 'loss:{domain}'); its loss domains: {known}.")
        return self.loss_rv[:, self.loss_domains.index(domain)]


def _cell_text(v: Any) -> str:
    return v.strip() if isinstance(v, str) else ("" if v is None else str(v))


def _numeric(name: str, values: Sequence[Any], runs: np.ndarray, *, empty: str, positive: bool) -> np.ndarray:
    """Parses a numeric column. empty: 'error' or 'nan'. positive: finite and > 0 required."""
    out = np.empty(len(values), np.float64)
    blank, bad, bad_vals = [], [], []
    for i, v in enumerate(values):
        if isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool):
            x = float(v)
            if math.isnan(x) and empty == "error":
                blank.append(i)
            out[i] = x
            continue
        s = _cell_text(v)
        if s == "":
            blank.append(i)
            out[i] = np.nan
            continue
        try:
            out[i] = float(s)
        except ValueError:
            bad.append(i)
            bad_vals.append(s)
    if bad:
        raise TableError(f"column {name!r}: non-numeric value in {_rows(bad, runs, bad_vals)}; allowed: a number.")
    if blank and empty == "error":
        raise TableError(f"column {name!r}: empty cell in {_rows(blank, runs)}; every row needs a value here.")
    check = ~np.isnan(out) if empty == "nan" else np.ones(len(out), bool)
    if positive:
        wrong = np.flatnonzero(check & ~(np.isfinite(out) & (out > 0)))
        what = "a finite number > 0"
    else:
        wrong = np.flatnonzero(check & ~np.isfinite(out))
        what = "a finite number"
    if wrong.size:
        raise TableError(f"column {name!r}: {_rows(wrong, runs, [float(out[i]) for i in wrong])}; allowed: {what}.")
    return out


def from_columns(columns: Mapping[str, Sequence[Any]], *, query: bool = False) -> RunsTable:
    """Validates columns (name -> cells, cells may be strings or numbers) into a :class:`RunsTable`.

    ``query=True``: a table to predict for; ``loss:*`` columns are optional and, when present,
    may have empty cells (NaN). All checks run here, before any fitting.
    """
    names = list(columns)
    mix_cols, loss_cols, bench_cols, n_rows = _check_header(columns, query)
    run = _run_names(columns["run"])
    params_total, params_active, tokens = _sizes(columns, run)
    mix_rm = _mixture(columns, mix_cols, run)

    loss_rv = None
    if loss_cols:
        loss_rv = np.stack(
            [_numeric(c, columns[c], run, empty="nan" if query else "error", positive=True) for c in loss_cols], axis=1
        )
    bench_rt = None
    if bench_cols:
        bench_rt = np.stack([_numeric(c, columns[c], run, empty="nan", positive=False) for c in bench_cols], axis=1)
    flops = _numeric("flops", columns["flops"], run, empty="nan", positive=True) if "flops" in columns else None

    _check_no_duplicate_checkpoints(run, tokens, n_rows)
    _check_one_model_and_mixture_per_run(run, params_total, params_active, mix_rm, mix_cols, n_rows)
    seed, base, base_tokens = _protocol_columns(columns, run, params_total, n_rows)

    known = set(REQUIRED) | set(mix_cols) | set(loss_cols) | set(bench_cols) | {"flops"} | set(PROTOCOL)
    extra = {n: np.array([_cell_text(v) for v in columns[n]], dtype=str) for n in names if n not in known}
    return RunsTable(
        run=run,
        params_total=params_total,
        params_active=params_active,
        tokens=tokens,
        mix_domains=tuple(c[len(MIX):] for c in mix_cols),
        mix_rm=mix_rm,
        loss_domains=tuple(c[len(LOSS):] for c in loss_cols),
        loss_rv=loss_rv,
        bench_tasks=tuple(c[len(BENCH):] for c in bench_cols),
        bench_rt=bench_rt,
        flops=flops,
        extra=extra,
        seed=seed,
        base=base,
        base_tokens=base_tokens,
    )


def _check_header(columns: Mapping[str, Sequence[Any]], query: bool) -> tuple[list[str], list[str], list[str], int]:
    """The mix:, loss: and bench: column names and the number of rows, after checking that the
    columns have one length, the required ones are there and every prefixed name has a domain."""
    names = list(columns)
    lengths = {n: len(columns[n]) for n in names}
    if len(set(lengths.values())) > 1:
        raise TableError(f"columns have different lengths: {lengths}; every column needs one cell per row.")
    missing = [c for c in REQUIRED if c not in columns]
    if missing:
        raise TableError(
            f"missing required column(s) {', '.join(repr(m) for m in missing)}; a runs table needs "
            f"{', '.join(REQUIRED)}, mix:<domain>... and loss:<domain>... (have: {', '.join(names) or 'none'})."
        )
    for prefix in (MIX, LOSS, BENCH):
        for n in names:
            if n.startswith(prefix) and not n[len(prefix):].strip():
                raise TableError(f"column {n!r} has no domain name after {prefix!r}; write e.g. '{prefix}code'.")
    mix_cols = [n for n in names if n.startswith(MIX)]
    loss_cols = [n for n in names if n.startswith(LOSS)]
    bench_cols = [n for n in names if n.startswith(BENCH)]
    if not mix_cols:
        raise TableError(f"no 'mix:<domain>' columns (training weights); have: {', '.join(names)}.")
    if not loss_cols and not query:
        raise TableError(
            f"no 'loss:<domain>' columns (validation losses); have: {', '.join(names)}. "
            "A table to predict for is read with query=True."
        )
    n_rows = lengths[names[0]]
    if n_rows == 0:
        raise TableError("the table has no data rows.")
    return mix_cols, loss_cols, bench_cols, n_rows


def _run_names(cells: Sequence[Any]) -> np.ndarray:
    """The ``run`` column as strings; every row needs one."""
    run = np.array([_cell_text(v) for v in cells], dtype=object)
    blank = np.flatnonzero(run == "")
    if blank.size:
        raise TableError(f"column 'run': empty run name in rows {', '.join(str(i + 1) for i in blank[:MAX_LISTED])}; every row needs a run name.")
    return run.astype(str)


def _sizes(columns: Mapping[str, Sequence[Any]], run: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``params_total``, ``params_active`` (at most the total) and ``tokens``: positive numbers."""
    params_total = _numeric("params_total", columns["params_total"], run, empty="error", positive=True)
    params_active = _numeric("params_active", columns["params_active"], run, empty="error", positive=True)
    tokens = _numeric("tokens", columns["tokens"], run, empty="error", positive=True)
    over = np.flatnonzero(params_active > params_total * (1 + 1e-9))
    if over.size:
        raise TableError(
            f"params_active > params_total in {_rows(over, run, [f'{params_active[i]:g} > {params_total[i]:g}' for i in over])}; "
            "allowed: params_active <= params_total (equal for a dense model)."
        )
    return params_total, params_active, tokens


def _mixture(columns: Mapping[str, Sequence[Any]], mix_cols: list[str], run: np.ndarray) -> np.ndarray:
    """The mix:* weights (rows x domains), each row non-negative and summing to 1 within
    ``SIMPLEX_TOL``, renormalised to sum to 1 exactly."""
    mix_rm = np.stack([_numeric(c, columns[c], run, empty="error", positive=False) for c in mix_cols], axis=1)
    for j, c in enumerate(mix_cols):
        neg = np.flatnonzero(mix_rm[:, j] < 0)
        if neg.size:
            raise TableError(f"column {c!r}: negative weight in {_rows(neg, run, [float(mix_rm[i, j]) for i in neg])}; allowed: weights >= 0.")
    sums = mix_rm.sum(axis=1)
    off = np.flatnonzero(np.abs(sums - 1.0) > SIMPLEX_TOL)
    if off.size:
        raise TableError(
            f"mix:* weights do not sum to 1 in {_rows(off, run, [round(float(sums[i]), 6) for i in off])} "
            f"(columns {', '.join(mix_cols)}); allowed: sum within {SIMPLEX_TOL:g} of 1 (rows are then renormalised)."
        )
    return mix_rm / sums[:, None]


def _check_no_duplicate_checkpoints(run: np.ndarray, tokens: np.ndarray, n_rows: int) -> None:
    """Duplicate (run, tokens) rows: two checkpoints of one run at the same token count."""
    seen: dict[tuple[str, float], int] = {}
    dups: list[tuple[int, int]] = []
    for i in range(n_rows):
        key = (run[i], float(tokens[i]))
        if key in seen:
            dups.append((seen[key], i))
        else:
            seen[key] = i
    if dups:
        listed = "; ".join(f"rows {a + 1} and {b + 1} (run {str(run[a])!r}, tokens {tokens[a]:g})" for a, b in dups[:MAX_LISTED])
        more = f" and {len(dups) - MAX_LISTED} more" if len(dups) > MAX_LISTED else ""
        raise TableError(f"duplicate (run, tokens) rows: {listed}{more}; allowed: one row per checkpoint of a run.")


def _check_one_model_and_mixture_per_run(run: np.ndarray, params_total: np.ndarray, params_active: np.ndarray,
                                         mix_rm: np.ndarray, mix_cols: list[str], n_rows: int) -> None:
    """One run = one model and one mixture: its checkpoints must agree on sizes and weights."""
    first: dict[str, int] = {}
    for i in range(n_rows):
        j = first.setdefault(run[i], i)
        if j == i:
            continue
        for col, arr in (("params_total", params_total), ("params_active", params_active)):
            if arr[i] != arr[j]:
                raise TableError(
                    f"run {str(run[i])!r} has {col} {arr[j]:g} in row {j + 1} but {arr[i]:g} in row {i + 1}; "
                    "allowed: one model size per run (give a different model its own run name)."
                )
        if np.max(np.abs(mix_rm[i] - mix_rm[j])) > SIMPLEX_TOL:
            raise TableError(
                f"run {str(run[i])!r} has mixture {np.round(mix_rm[j], 4).tolist()} in row {j + 1} but "
                f"{np.round(mix_rm[i], 4).tolist()} in row {i + 1} (columns {', '.join(mix_cols)}); allowed: one "
                "mixture per run (for a staged schedule write its token-weighted average)."
            )


def _protocol_columns(columns: Mapping[str, Sequence[Any]], run: np.ndarray, params_total: np.ndarray, n_rows: int):
    """Parses and cross-checks the optional ``seed``, ``base`` and ``base_tokens`` columns."""
    seed = None
    if "seed" in columns:
        cells = [_cell_text(v) for v in columns["seed"]]
        bad = [i for i, c in enumerate(cells) if not re.fullmatch(r"[+-]?\d+(\.0*)?", c)]
        if bad:
            raise TableError(f"column 'seed': {_rows(bad, run, [cells[i] for i in bad])} is not an integer; allowed: an integer "
                             "seed in every row (the same seed column type throughout; leave the column out for one seed).")
        seed = np.array([int(float(c)) for c in cells], np.int64)
    base = base_tokens = None
    if "base_tokens" in columns and "base" not in columns:
        raise TableError("column 'base_tokens' without a 'base' column; a mid-training table names each run's base in 'base'.")
    if "base" in columns:
        base = np.array([_cell_text(v) for v in columns["base"]], dtype=object).astype(str)
        mid = base != ""
        if "base_tokens" not in columns:
            raise TableError("column 'base' without a 'base_tokens' column; allowed: both (base_tokens = tokens the base was "
                             "trained on, empty for runs trained from scratch).")
        base_tokens = _numeric("base_tokens", columns["base_tokens"], run, empty="nan", positive=False)
        missing = np.flatnonzero(mid & ~(np.isfinite(base_tokens) & (base_tokens > 0)))
        if missing.size:
            raise TableError(f"column 'base_tokens': {_rows(missing, run, [float(base_tokens[i]) for i in missing])} has a base "
                             "but no base token count; allowed: a number > 0 where 'base' is set.")
        stray = np.flatnonzero(~mid & np.isfinite(base_tokens) & (base_tokens != 0))
        if stray.size:
            raise TableError(f"column 'base_tokens': {_rows(stray, run, [float(base_tokens[i]) for i in stray])} has base tokens "
                             "but an empty 'base'; allowed: empty (or 0) for runs trained from scratch.")
        base_tokens = np.where(mid, base_tokens, 0.0)
        names = set(run.tolist())
        orphan = [i for i in np.flatnonzero(mid) if base[i] not in names]
        if orphan:
            raise TableError(f"column 'base': {_rows(orphan, run, [str(base[i]) for i in orphan])} names a base that is not a run of "
                             "this table; allowed: the name of a run in the table (add the base's own rows, trained from scratch).")
        size_of = {str(r): float(n) for r, n in zip(run, params_total)}
        wrong = [i for i in np.flatnonzero(mid) if size_of[base[i]] != params_total[i]]
        if wrong:
            raise TableError(f"column 'base': {_rows(wrong, run, [f'{base[i]} has params_total {size_of[base[i]]:g}, the run {params_total[i]:g}' for i in wrong])}; "
                             "allowed: a base of the same model (a mid-training run continues its base's weights).")
    first: dict[str, int] = {}
    for i in range(n_rows):
        j = first.setdefault(str(run[i]), i)
        for col, arr in (("seed", seed), ("base", base), ("base_tokens", base_tokens)):
            if arr is not None and arr[i] != arr[j]:
                raise TableError(f"run {str(run[i])!r} has {col} {arr[j].item()!r} in row {j + 1} but {arr[i].item()!r} in row {i + 1}; "
                                 f"allowed: one {col} per run (give a replicate its own run name).")
    return seed, base, base_tokens


def read_runs(path: str | Path, *, query: bool = False) -> RunsTable:
    """Reads and validates a runs-table CSV (see the module docstring for the columns)."""
    path = Path(path)
    if not path.is_file():
        raise TableError(f"runs table {str(path)!r} does not exist (or is not a file).")
    with path.open(newline="", encoding="utf-8-sig") as f:
        rows = list(csv.reader(f))
    rows = [r for r in rows if any(c.strip() for c in r)]
    if not rows:
        raise TableError(f"{path}: empty file; the first line must be the header ({', '.join(REQUIRED)}, mix:..., loss:...).")
    header = [h.strip() for h in rows[0]]
    dup = sorted({h for h in header if header.count(h) > 1})
    if dup:
        raise TableError(f"{path}: column(s) {', '.join(repr(d) for d in dup)} appear more than once in the header.")
    body = rows[1:]
    wrong = [i for i, r in enumerate(body) if len(r) != len(header)]
    if wrong:
        listed = ", ".join(f"{i + 1} ({len(body[i])} cells)" for i in wrong[:MAX_LISTED])
        raise TableError(f"{path}: data rows {listed} do not have the header's {len(header)} cells.")
    columns = {h: [r[k] for r in body] for k, h in enumerate(header)}
    try:
        return from_columns(columns, query=query)
    except TableError as e:
        raise TableError(f"{path}: {e}") from None


def _fmt(x: float) -> str:
    return "" if not np.isfinite(x) else repr(float(x))


def to_columns(table: RunsTable) -> dict[str, list[str]]:
    """The table as CSV cells (name -> strings), in the canonical column order."""
    cols: dict[str, list[str]] = {"run": [str(r) for r in table.run]}
    for name in ("params_total", "params_active", "tokens"):
        cols[name] = [_fmt(x) for x in getattr(table, name)]
    if table.flops is not None:
        cols["flops"] = [_fmt(x) for x in table.flops]
    for j, d in enumerate(table.mix_domains):
        cols[MIX + d] = [_fmt(x) for x in table.mix_rm[:, j]]
    if table.loss_rv is not None:
        for j, d in enumerate(table.loss_domains):
            cols[LOSS + d] = [_fmt(x) for x in table.loss_rv[:, j]]
    if table.bench_rt is not None:
        for j, t in enumerate(table.bench_tasks):
            cols[BENCH + t] = [_fmt(x) for x in table.bench_rt[:, j]]
    if table.seed is not None:
        cols["seed"] = [str(int(x)) for x in table.seed]
    if table.base is not None and table.base_tokens is not None:  # both or neither (from_columns)
        cols["base"] = [str(x) for x in table.base]
        cols["base_tokens"] = [_fmt(x) if b else "" for x, b in zip(table.base_tokens, table.base)]
    for k, v in table.extra.items():
        cols[k] = [str(x) for x in v]
    return cols


def write_runs(table: RunsTable, path: str | Path, *, extra: Mapping[str, np.ndarray] | None = None) -> None:
    """Writes the table as CSV with the same column names (floats round-trip exactly); ``extra``
    columns (e.g. ``pred:<domain>``) are appended after the table's own."""
    cols = to_columns(table)
    for k, v in (extra or {}).items():
        v = np.asarray(v)
        if v.shape[0] != len(table):
            raise TableError(f"extra column {k!r} has {v.shape[0]} values for a table of {len(table)} rows.")
        cols[k] = [_fmt(x) if np.issubdtype(v.dtype, np.floating) else str(x) for x in v]
    from data_mixture.user_files import write_text

    text = io.StringIO(newline="")
    w = csv.writer(text)
    w.writerow(list(cols))
    for i in range(len(table)):
        w.writerow([c[i] for c in cols.values()])
    write_text(path, text.getvalue())  # under a temporary name, renamed into place
