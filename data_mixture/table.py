"""The runs table: one row per (run, checkpoint), read from CSV and validated before any fitting.

Columns (``docs/data_mixture.md``, "Runs table"):

==================  ===========================================================================
``run``             run name (non-empty); the unit the bootstrap resamples
``params_total``    total parameters N (> 0)
``params_active``   parameters active per token (> 0, <= params_total; = params_total if dense)
``tokens``          training tokens seen at this checkpoint D (> 0)
``mix:<domain>``    training weight of a training domain; each row on the simplex
``loss:<domain>``   held-out loss on a validation domain (finite, > 0)
``bench:<task>``    optional benchmark score; empty = not measured (NaN)
``flops``           optional training FLOPs; empty = unknown (NaN)
anything else       carried through unchanged as strings (``extra``)
==================  ===========================================================================

Training domains (``mix:*``) and validation domains (``loss:*``) are independent sets. Every
error is a :class:`TableError` naming the 1-based data rows (header not counted) with their run
names, the column, the value and what is allowed.
"""

from __future__ import annotations

import csv
import dataclasses
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

REQUIRED = ("run", "params_total", "params_active", "tokens")
SIZE_COLUMNS = ("params_total", "params_active")
MIX, LOSS, BENCH = "mix:", "loss:", "bench:"
SIMPLEX_TOL = 1e-3  # rows within this of sum 1 are renormalised; hand-written CSVs carry rounding
MAX_LISTED = 8


class TableError(ValueError):
    """A runs table that cannot be used: names the rows (1-based data rows and run names), columns,
    values at fault and what is allowed."""


def _rows(idx: Sequence[int] | np.ndarray, runs: Sequence[str] | np.ndarray, values: Sequence[Any] | None = None) -> str:
    """'rows 3 (run 'a', value 'x'), 7 (run 'b') and 2 more' for 0-based indices."""
    idx = [int(i) for i in idx]
    parts = []
    for n, i in enumerate(idx[:MAX_LISTED]):
        detail = f"run {str(runs[i])!r}"
        if values is not None:
            detail += f", value {values[n]!r}"
        parts.append(f"{i + 1} ({detail})")
    more = f" and {len(idx) - MAX_LISTED} more" if len(idx) > MAX_LISTED else ""
    return ("row " if len(idx) == 1 else "rows ") + ", ".join(parts) + more


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
        )

    def run_groups(self) -> tuple[np.ndarray, np.ndarray]:
        """(unique run names, inverse index (R,)): row r belongs to run ``names[inverse[r]]``."""
        names, inverse = np.unique(self.run, return_inverse=True)
        return names, inverse.reshape(-1)

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

    run = np.array([_cell_text(v) for v in columns["run"]], dtype=object)
    blank = np.flatnonzero(run == "")
    if blank.size:
        raise TableError(f"column 'run': empty run name in rows {', '.join(str(i + 1) for i in blank[:MAX_LISTED])}; every row needs a run name.")
    run = run.astype(str)

    params_total = _numeric("params_total", columns["params_total"], run, empty="error", positive=True)
    params_active = _numeric("params_active", columns["params_active"], run, empty="error", positive=True)
    tokens = _numeric("tokens", columns["tokens"], run, empty="error", positive=True)
    over = np.flatnonzero(params_active > params_total * (1 + 1e-9))
    if over.size:
        raise TableError(
            f"params_active > params_total in {_rows(over, run, [f'{params_active[i]:g} > {params_total[i]:g}' for i in over])}; "
            "allowed: params_active <= params_total (equal for a dense model)."
        )

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
    mix_rm = mix_rm / sums[:, None]

    loss_rv = None
    if loss_cols:
        loss_rv = np.stack(
            [_numeric(c, columns[c], run, empty="nan" if query else "error", positive=True) for c in loss_cols], axis=1
        )
    bench_rt = None
    if bench_cols:
        bench_rt = np.stack([_numeric(c, columns[c], run, empty="nan", positive=False) for c in bench_cols], axis=1)
    flops = _numeric("flops", columns["flops"], run, empty="nan", positive=True) if "flops" in columns else None

    # Duplicate (run, tokens) rows: two checkpoints of one run at the same token count.
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

    # One run = one model and one mixture: its checkpoints must agree on sizes and weights.
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

    known = set(REQUIRED) | set(mix_cols) | set(loss_cols) | set(bench_cols) | {"flops"}
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
    )


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
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(list(cols))
        for i in range(len(table)):
            w.writerow([c[i] for c in cols.values()])
