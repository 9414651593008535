"""What a mixture is chosen for: a *target* that need not be the training mix.

One type, one parser, used by ``fit``, ``predict``, ``optimize``, ``evaluate``, ``plan`` and the
notebooks (``--target TEXT``). A target is a weighted sum of runs-table columns, every one in
nats (lower is better)::

    heldout_qa                      one validation domain, e.g. one no run trains on (loss:heldout_qa)
    code=0.6,prose=0.4              a weighted set of validation domains (weights normalised)
    logprob:know_type               a benchmark metric: minus the mean log-probability of the
                                    task's correct answer (collect writes logprob:<task>)
    bench:know_type                 the same, for a bench:<task> column collected with
                                    --bench-metric gold_logprob (values must be < 0)
    heldout_qa=0.5,logprob:math=0.5 any mix of those

A column without a prefix is ``loss:<name>``. The target's value per row is
``sum_c w_c v_c`` with ``v_c`` the loss, or minus the log-probability: a positive loss-like
number that every law can fit like a validation domain. :meth:`Target.apply` returns the
table with the target as its only validation domain (named :attr:`Target.domain`: the domain
itself for a single loss column, else ``"target"``), rows without a value left out.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from data_mixture.table import BENCH, LOGPROB, LOSS, RunsTable, TableError

KINDS = (LOSS, LOGPROB, BENCH)
TARGET_DOMAIN = "target"
EXAMPLE = "--target heldout_qa, --target code=0.6,prose=0.4 or --target logprob:know_type"


@dataclasses.dataclass(frozen=True)
class Target:
    """A parsed target: ``weights`` {column: weight} (columns with their prefix, weights summing
    to 1) and the text it was parsed from."""

    text: str
    weights: Mapping[str, float]

    @property
    def domain(self) -> str:
        """The validation-domain name the target takes in a fit: the domain of a single loss
        column, else ``"target"``."""
        if len(self.weights) == 1:
            (col,) = self.weights
            if col.startswith(LOSS):
                return col[len(LOSS):]
        return TARGET_DOMAIN

    def loss_domains(self) -> dict[str, float]:
        """{loss domain: weight} when every column is a ``loss:`` column, else {}."""
        if all(c.startswith(LOSS) for c in self.weights):
            return {c[len(LOSS):]: w for c, w in self.weights.items()}
        return {}

    def to_json(self) -> dict[str, Any]:
        return {"text": self.text, "weights": dict(self.weights), "domain": self.domain}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Target":
        return cls(str(d["text"]), dict(d["weights"]))

    # -- tables ---------------------------------------------------------------------------------
    def check(self, table: RunsTable, what: str = "the runs table") -> None:
        """TableError naming every column the table lacks and the columns it has."""
        missing = [c for c in self.weights if not _has(table, c)]
        if missing:
            have = [LOSS + d for d in table.loss_domains] + [BENCH + t for t in table.bench_tasks] + \
                   [c for c in table.extra if c.startswith(LOGPROB)]
            raise TableError(f"--target {self.text!r}: {what} has no column {', '.join(missing)}; its target columns: "
                             f"{', '.join(have) or 'none'} (e.g. {EXAMPLE}).")

    def values(self, table: RunsTable) -> np.ndarray:
        """(R,) the target per row (NaN where a column has no value)."""
        self.check(table)
        out = np.zeros(len(table))
        for col, w in self.weights.items():
            out = out + w * _column(table, col, self.text)
        return out

    def apply(self, table: RunsTable) -> RunsTable:
        """The table with the target as its one validation domain (:attr:`domain`), rows with no
        target value left out (a TableError when none is left)."""
        v = self.values(table)
        keep = np.isfinite(v)
        if not keep.any():
            raise TableError(f"--target {self.text!r}: no row of the table has a value for it.")
        sub = table.take(keep)
        return dataclasses.replace(sub, loss_domains=(self.domain,), loss_rv=v[keep][:, None])

    def combine(self, loss_domains: Sequence[str], loss_rv: np.ndarray) -> np.ndarray:
        """(R,) the target from per-domain (predicted) losses (R, V); a TableError when the target
        needs a column that is not among ``loss_domains``."""
        if self.domain in loss_domains:
            return np.asarray(loss_rv)[:, list(loss_domains).index(self.domain)]
        parts = self.loss_domains()
        missing = [d for d in parts if d not in loss_domains] if parts else list(self.weights)
        if missing:
            raise TableError(f"--target {self.text!r} needs {', '.join(missing)}, which the fit does not predict; it "
                             f"predicts loss:{', loss:'.join(loss_domains)}. Fit the law with --target {self.text!r}.")
        return sum(w * np.asarray(loss_rv)[:, list(loss_domains).index(d)] for d, w in parts.items())


def parse_target(text: str) -> Target:
    """``--target`` text -> :class:`Target` (see the module docstring); TableError naming the
    part at fault and the forms allowed."""
    parts = [p.strip() for p in str(text or "").split(",") if p.strip()]
    if not parts:
        raise TableError(f"--target {text!r} is empty; allowed: {EXAMPLE}.")
    weights: dict[str, float] = {}
    for part in parts:
        name, sep, value = part.partition("=")
        name = name.strip()
        try:
            w = float(value) if sep else 1.0
            if not math.isfinite(w) or w < 0:
                raise ValueError
        except ValueError:
            raise TableError(f"--target {text!r}: weight {value.strip()!r} of {name!r} is not a number >= 0; "
                             f"allowed: {EXAMPLE}.") from None
        if not sep and len(parts) > 1:
            raise TableError(f"--target {text!r}: {name!r} has no weight; in a set every column needs one, "
                             f"e.g. code=0.6,prose=0.4.")
        col = name if any(name.startswith(k) for k in KINDS) else LOSS + name
        if not col.split(":", 1)[1]:
            raise TableError(f"--target {text!r}: {name!r} names no column; allowed: {EXAMPLE}.")
        if col in weights:
            raise TableError(f"--target {text!r} names {col} twice.")
        weights[col] = w
    total = sum(weights.values())
    if total <= 0:
        raise TableError(f"--target {text!r}: the weights are all 0; give at least one a positive weight.")
    return Target(str(text), {c: w / total for c, w in weights.items() if w > 0})


def resolve(target: "Target | str | None") -> Target | None:
    """None, a Target, or text to parse."""
    if target is None or isinstance(target, Target):
        return target
    return parse_target(target)


def _has(table: RunsTable, col: str) -> bool:
    if col.startswith(LOSS):
        return col[len(LOSS):] in table.loss_domains
    if col.startswith(BENCH):
        return col[len(BENCH):] in table.bench_tasks
    return col in table.extra


def _column(table: RunsTable, col: str, text: str) -> np.ndarray:
    """(R,) the column in nats, lower better: a loss, or minus a log-probability."""
    if col.startswith(LOSS):
        return table.loss(col[len(LOSS):])
    if col.startswith(BENCH):
        assert table.bench_rt is not None
        v = table.bench_rt[:, table.bench_tasks.index(col[len(BENCH):])]
    else:
        v = table.numeric_extra(col)
    bad = np.flatnonzero(np.isfinite(v) & (v >= 0))
    if bad.size:
        raise TableError(f"--target {text!r}: column {col} has values >= 0 (e.g. {v[bad[0]]:g} in row {bad[0] + 1}, run "
                         f"{table.run[bad[0]]!r}); a metric target is a log-probability (< 0): collect the logprob:<task> "
                         f"columns, or bench:<task> with --bench-metric gold_logprob (accuracy is not continuous).")
    return -v
