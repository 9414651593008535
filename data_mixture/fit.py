"""The Fit bundle: one law fitted to every validation domain, its bootstrap, the benchmark laws.

``fit_table`` validates everything first (law identifiable for every domain, chance levels name
real tasks), then fits the point estimate of every domain (one batched solve), then ``bootstrap``
resamples of runs (not rows: a run's checkpoints stay together), each warm-started from the
point fit (all domains x resamples in one batched solve). Benchmark laws
are fitted on the table's observed losses and bootstrapped with the same resamples, so member i
of the prediction chain (mixture -> losses -> accuracy) is one consistent resample.

Saved as JSON (``Fit.save`` / ``Fit.load``), never pickle.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from data_mixture.bench_law import MIN_SCORES, BenchFit, fit_bench, fit_bench_bootstrap
from data_mixture.laws import Law, LawFit, get_law
from data_mixture.laws.base import at_bounds_lines
from data_mixture.laws.parametric import BOOT_STARTS, ParametricLaw
from data_mixture.solver import resample_weights
from data_mixture.table import UNIQUE, RunsTable, TableError, to_columns
from data_mixture.target import Target
from data_mixture.target import resolve as resolve_target
from moejax.errors import UserError

FORMAT = "moejax.data_mixture.fit/1"


@dataclasses.dataclass
class Fit:
    """Fields:
    law: registry name; size_column: the table column used as N;
    mix_domains / loss_domains: training / validation domains (prediction column order);
    point: per validation domain, the fit on all rows;
    bootstrap: B resamples of runs, each per domain;
    bench / bench_bootstrap: per task benchmark laws (point, and per resample);
    info: seed, starts, n_rows, n_runs, sizes, created, table sha256, fit seconds, skipped tasks;
        ``fixed`` {domain: {key: value}} and ``fixed_reason`` {domain: text} of parameters held
        constant (domains without any are left out); ``at_bounds`` {domain: [{param, index,
        value, bound, limit}]} of the point fits' parameters at or within 1 % of a bound;
        ``target`` ({text, weights, domain}) when the fit was made for a target
        (:mod:`data_mixture.target`).
    """

    law: str
    size_column: str
    mix_domains: tuple[str, ...]
    loss_domains: tuple[str, ...]
    point: dict[str, LawFit]
    bootstrap: list[dict[str, LawFit]]
    bench: dict[str, BenchFit]
    bench_bootstrap: list[dict[str, BenchFit]]
    info: dict

    # -- prediction -----------------------------------------------------------------------------
    def _member(self, member: int | None) -> dict[str, LawFit]:
        if member is None:
            return self.point
        if not 0 <= member < len(self.bootstrap):
            raise IndexError(f"bootstrap member {member} out of range; this fit has {len(self.bootstrap)} members.")
        return self.bootstrap[member]

    def predict_losses(self, size_r, tokens_r, mix_rm, *, member: int | None = None, unique_rm=None) -> np.ndarray:
        """(R, V) predicted losses in ``loss_domains`` order (member None: point fit).
        ``unique_rm``: pools of unique tokens per training domain, for repetition-aware laws."""
        fits = self._member(member)
        return np.stack([fits[d].predict(size_r, tokens_r, mix_rm, unique_rm) for d in self.loss_domains], axis=1)

    @property
    def target(self) -> Target | None:
        """The target the fit was made for (``fit_table(target=...)``), or None."""
        t = self.info.get("target")
        return Target.from_json(t) if t else None

    def predict_bench(self, loss_rv, *, member: int | None = None) -> np.ndarray:
        """(R, T) predicted scores from losses (R, V), tasks in ``self.bench`` order."""
        loss_rv = np.asarray(loss_rv, np.float64)
        if member is None:
            fits = self.bench
        else:
            if not 0 <= member < len(self.bench_bootstrap):
                raise IndexError(f"benchmark bootstrap member {member} out of range; this fit has {len(self.bench_bootstrap)}.")
            fits = self.bench_bootstrap[member]
        if not fits:
            return np.zeros((loss_rv.shape[0], 0))
        return np.stack([fits[t].predict(loss_rv) for t in self.bench], axis=1)

    def query_mix(self, query: RunsTable) -> np.ndarray:
        """The query's (R, M) mixtures in the fit's domain order; TableError naming any mismatch."""
        unknown = [d for d in query.mix_domains if d not in self.mix_domains]
        absent = [d for d in self.mix_domains if d not in query.mix_domains]
        if unknown or absent:
            parts = []
            if unknown:
                parts.append(f"training domain(s) the fit has never seen: {', '.join('mix:' + d for d in unknown)}")
            if absent:
                parts.append(f"missing column(s) {', '.join('mix:' + d for d in absent)}")
            raise TableError(f"query table does not match the fit: {'; '.join(parts)}. The fit was made on {', '.join('mix:' + d for d in self.mix_domains)}.")
        return query.mix_rm[:, [query.mix_domains.index(d) for d in self.mix_domains]]

    def predict(self, query: RunsTable, *, interval: float = 0.9) -> dict[str, np.ndarray]:
        """Columns ``pred:<domain>``, ``pred:bench:<task>`` and, when bootstrapped, ``lo:``/``hi:``
        (central ``interval`` of the bootstrap members: parameter uncertainty of the mean
        prediction, not run-to-run noise)."""
        if not 0 < interval < 1:
            raise ValueError(f"interval {interval!r}; allowed: a fraction in (0, 1), e.g. 0.9.")
        mix = self.query_mix(query)
        size = query.size(self.size_column)
        out: dict[str, np.ndarray] = {}
        pools = query.unique_rm(self.mix_domains) if any(c.startswith(UNIQUE) for c in query.extra) else None
        loss = self.predict_losses(size, query.tokens, mix, unique_rm=pools)
        for j, d in enumerate(self.loss_domains):
            out[f"pred:{d}"] = loss[:, j]
        acc = self.predict_bench(loss)
        for j, t in enumerate(self.bench):
            out[f"pred:bench:{t}"] = acc[:, j]
        if self.bootstrap:
            q = [(1 - interval) / 2 * 100, (1 + interval) / 2 * 100]
            loss_b = np.stack([self.predict_losses(size, query.tokens, mix, member=i, unique_rm=pools) for i in range(len(self.bootstrap))])
            lo, hi = np.percentile(loss_b, q, axis=0)
            for j, d in enumerate(self.loss_domains):
                out[f"lo:{d}"], out[f"hi:{d}"] = lo[:, j], hi[:, j]
            if self.bench and self.bench_bootstrap:
                acc_b = np.stack([self.predict_bench(loss_b[i], member=i) for i in range(len(self.bench_bootstrap))])
                lo, hi = np.percentile(acc_b, q, axis=0)
                for j, t in enumerate(self.bench):
                    out[f"lo:bench:{t}"], out[f"hi:bench:{t}"] = lo[:, j], hi[:, j]
        return out

    def param_intervals(self, domain: str, *, interval: float = 0.9) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Bootstrap percentile interval of every numeric parameter of one domain's fit."""
        if not self.bootstrap:
            raise ValueError("this fit has no bootstrap (fit with bootstrap > 0).")
        q = [(1 - interval) / 2 * 100, (1 + interval) / 2 * 100]
        out = {}
        for name, value in self.point[domain].params.items():
            if isinstance(value, str):
                continue
            arr = np.array([b[domain].params[name] for b in self.bootstrap], np.float64)
            lo, hi = np.percentile(arr, q, axis=0)
            out[name] = (lo, hi)
        return out

    def at_bounds_lines(self) -> list[str]:
        """One line per point-fit parameter at (or within 1 % of) a bound, every domain, e.g.
        ``"camel loss:code: E = 0 at its lower bound 0"`` (:func:`laws.base.at_bounds_lines`)."""
        return [line for d in self.loss_domains for line in at_bounds_lines(self.point[d])]

    def fixed_lines(self) -> list[str]:
        """One line per validation domain with fixed parameters: values and the reason."""
        out = []
        for d in self.loss_domains:
            fixed = self.point[d].info.get("fixed") or {}
            if fixed:
                values = ", ".join(f"{k} = {v:.4g}" for k, v in fixed.items())
                out.append(f"{self.law} loss:{d}: fixed {values}. {self.point[d].info.get('fixed_reason', '')}".rstrip())
        return out

    # -- files ----------------------------------------------------------------------------------
    def to_json(self) -> dict:
        return {
            "format": FORMAT,
            "law": self.law,
            "size_column": self.size_column,
            "mix_domains": list(self.mix_domains),
            "loss_domains": list(self.loss_domains),
            "point": {d: f.to_json() for d, f in self.point.items()},
            "bootstrap": [{d: f.to_json() for d, f in m.items()} for m in self.bootstrap],
            "bench": {t: b.to_json() for t, b in self.bench.items()},
            "bench_bootstrap": [{t: b.to_json() for t, b in m.items()} for m in self.bench_bootstrap],
            "info": self.info,
        }

    @classmethod
    def from_json(cls, d: dict) -> "Fit":
        if not isinstance(d, dict):
            raise FitFileError(f"not a fit file: a JSON {type(d).__name__}, not an object (written by data_mixture fit).")
        if "format" not in d:
            raise FitFileError(f"not a fit file: no format field (its fields: {', '.join(list(d)[:6])}); expected "
                               f"format {FORMAT!r} (written by data_mixture fit).")
        if d["format"] != FORMAT:
            raise FitFileError(f"not a fit file: format {d['format']!r}; expected {FORMAT!r} (written by data_mixture fit).")
        missing = [k for k in FIELDS if k not in d]
        if missing:
            raise FitFileError(f"not a complete fit file: no {', '.join(missing)} field(s) (written by data_mixture fit).")
        try:
            return cls(
                law=d["law"],
                size_column=d["size_column"],
                mix_domains=tuple(d["mix_domains"]),
                loss_domains=tuple(d["loss_domains"]),
                point={k: LawFit.from_json(v) for k, v in d["point"].items()},
                bootstrap=[{k: LawFit.from_json(v) for k, v in m.items()} for m in d["bootstrap"]],
                bench={k: BenchFit.from_json(v) for k, v in d["bench"].items()},
                bench_bootstrap=[{k: BenchFit.from_json(v) for k, v in m.items()} for m in d["bench_bootstrap"]],
                info=d["info"],
            )
        except (KeyError, TypeError, AttributeError) as e:
            raise FitFileError(f"not a readable fit file: a law entry is malformed ({type(e).__name__}: {e}); "
                               "refit it with data_mixture fit.") from None

    def save(self, path) -> None:
        """Writes the fit JSON under a temporary name, then renames it into place (an existing
        file is replaced whole, never left half-written)."""
        from data_mixture.user_files import write_text

        write_text(path, json.dumps(self.to_json(), allow_nan=False))

    @classmethod
    def load(cls, path, flag: str = "--fit") -> "Fit":
        """Reads a fit JSON; ``FitFileError`` naming ``flag``, the file and the fix when it is
        missing, not text, not JSON, cut short or not a fit file."""
        d = _read_json(Path(path), flag)
        try:
            return cls.from_json(d)
        except FitFileError as e:
            raise FitFileError(f"{flag} {path} is {e}") from None


class FitFileError(UserError):
    """A file given as a fit that is not one: names the flag, the file and the fix."""


FIELDS = ("law", "size_column", "mix_domains", "loss_domains", "point", "bootstrap", "bench", "bench_bootstrap", "info")
WRITTEN_BY = "the JSON file written by `python -m data_mixture fit ... --out FILE`"


def _read_json(path: Path, flag: str) -> Any:
    """The JSON of a fit file, or a ``FitFileError`` saying what the file is instead."""
    if path.is_dir():
        raise FitFileError(f"{flag} {path} is a directory; {flag} takes {WRITTEN_BY}.")
    if not path.is_file():
        raise FitFileError(f"{flag} {path} does not exist; {flag} takes {WRITTEN_BY}.")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise FitFileError(f"{flag} {path} is a binary file, not a fit; {flag} takes {WRITTEN_BY}.") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise FitFileError(f"{flag} {path} {_not_json(text, e)}; {flag} takes {WRITTEN_BY}.") from None


def _not_json(text: str, e: json.JSONDecodeError) -> str:
    """What a file that is not valid JSON looks like instead."""
    body = text.strip()
    if not body:
        return "is empty"
    if body[0] in "{[" and (e.pos >= len(text.rstrip()) or e.msg.startswith("Unterminated string")):
        return (f"is cut short: its JSON ends at character {len(body)} in the middle of a value (a copy or a "
                "write that did not finish?); refit, or copy the whole file again")
    first = body.splitlines()[0]
    if body[0] not in "{[" and "," in first:
        return f"is a CSV table, not JSON (it starts {first[:60]!r}; a runs table goes to --runs)"
    return f"is not valid JSON ({e.msg} at line {e.lineno} column {e.colno})"


class _PerResample:
    """Progress adapter: the solver reports finished (problem, start) lanes; the bar counts resamples."""

    def __init__(self, bar, starts: int):
        self.bar, self.per, self.acc = bar, max(1, int(starts)), 0

    def update(self, n: int) -> None:
        self.acc += n
        whole, self.acc = divmod(self.acc, self.per)
        if whole:
            self.bar.update(whole)


def table_sha256(table: RunsTable) -> str:
    return hashlib.sha256(json.dumps(to_columns(table), sort_keys=True).encode()).hexdigest()


def fit_table(
    table: RunsTable,
    law: str,
    *,
    size_column: str = "params_total",
    bootstrap: int = 100,
    seed: int = 0,
    starts: int = 64,
    chance: Mapping[str, float] | None = None,
    progress: bool = True,
    boot_starts: int = BOOT_STARTS,
    fixed: Mapping[str, float] | None = None,
    target: "Target | str | None" = None,
) -> Fit:
    """Fits ``law`` to every validation domain of ``table`` (+ bootstrap + benchmark laws).

    ``target`` (:mod:`data_mixture.target`; text such as ``"heldout_qa"``, ``"code=0.6,prose=0.4"``
    or ``"logprob:know_type"``): fit the law to that target alone, as the fit's one validation
    domain (``Target.domain``); ``info["target"]`` records it, and ``optimize`` then chooses the
    mixture for it.

    ``fixed``: parameters held constant in every domain's fit and bootstrap member,
    {NAME: value} (a scalar, or every entry of a vector) or {NAME[i]: value} (entry i, 0-based),
    natural units, within the parameter's bounds; checked before any fitting. On a one-budget
    table the law adds its own (``ParametricLaw.resolve_fixed``).

    ``bootstrap``: resamples of runs (0: none); each is warm-started from the point fit plus
    ``boot_starts - 1`` perturbed copies of it (``ParametricLaw.bootstrap_starts``). Point fits
    of all validation domains run in one solve, then all (domain, resample) problems in another.
    ``chance``: task -> chance level (fixes the sigmoid floor).

    A mid-training table is fitted on its mid-training rows (``RunsTable.law_rows``); ``info``
    records how many base rows were left out.
    """
    t0 = time.perf_counter()
    the_law = get_law(law)
    target = resolve_target(target)
    table, n_base_rows, fixed_d, chance_d, tasks, skipped = _checked_inputs(table, the_law, target, size_column,
                                                                            bootstrap, starts, fixed, chance)
    names, inverse = table.run_groups()
    weights_br = resample_weights(inverse, len(names), bootstrap, seed)
    bar = tqdm(total=len(table.loss_domains) * (1 + bootstrap) + len(tasks), desc=f"fit {law}", disable=not progress)
    t_point = time.perf_counter()
    bar.set_postfix_str("point fits")
    point = the_law.fit_domains(table, list(table.loss_domains), size_column=size_column, seed=seed, starts=starts, fixed=fixed_d)
    bar.update(len(table.loss_domains))
    t_boot = time.perf_counter()
    boots = _fit_bootstrap(the_law, table, point, weights_br, bootstrap, size_column, seed, boot_starts, bar)
    t_bench = time.perf_counter()
    bench, bench_boot = _fit_bench_laws(table, tasks, chance_d, weights_br, bootstrap, seed, starts, bar)
    bar.close()
    size = table.size(size_column)
    info: dict[str, Any] = {
        "seed": seed,
        "starts": starts,
        "bootstrap": bootstrap,
        "boot_starts": boot_starts,
        "n_rows": len(table),
        "base_rows_left_out": n_base_rows,
        "n_runs": len(names),
        "sizes": sorted({float(s) for s in size}),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "table_sha256": table_sha256(table),
        "fit_seconds": time.perf_counter() - t0,
        "phase_seconds": {"point": t_boot - t_point, "bootstrap": t_bench - t_boot, "bench": time.perf_counter() - t_bench},
        "bench_skipped": skipped,
        "chance": chance_d,
        "mixture_moves_with_scale": the_law.mixture_moves_with_scale,
        "fixed": {d: f.info["fixed"] for d, f in point.items() if f.info.get("fixed")},
        "fixed_reason": {d: f.info["fixed_reason"] for d, f in point.items() if f.info.get("fixed")},
        "at_bounds": {d: list(f.info.get("at_bounds") or []) for d, f in point.items()},
    }
    if target is not None:
        info["target"] = target.to_json()
    return Fit(law, size_column, tuple(table.mix_domains), tuple(table.loss_domains), point, boots, bench, bench_boot, info)


def _checked_inputs(table: RunsTable, the_law: Law, target: Target | None, size_column: str, bootstrap: int,
                    starts: int, fixed: Mapping[str, float] | None, chance: Mapping[str, float] | None
                    ) -> tuple[RunsTable, int, dict[str, float], dict[str, float], list[str], dict[str, str]]:
    """Everything :func:`fit_table` checks before fitting: the table (its target applied, its
    mid-training rows), the options, the fixed parameters and chance levels; the tasks with enough
    scores for a benchmark law and why the others are skipped."""
    if target is not None:
        table = target.apply(table)
    if table.loss_rv is None or not table.loss_domains:
        raise TableError("the table has no loss:* columns to fit (was it read with query=True?).")
    n_base_rows = len(table) - len(table.law_rows())
    table = table.law_rows()
    table.size(size_column)
    if bootstrap < 0 or starts < 1:
        raise ValueError(f"bootstrap={bootstrap}, starts={starts}; allowed: bootstrap >= 0, starts >= 1.")
    fixed_ = dict(fixed or {})
    for d in table.loss_domains:
        the_law.check(table, d, size_column, fixed=fixed_)
    chance_ = dict(chance or {})
    unknown = [t for t in chance_ if t not in table.bench_tasks]
    if unknown:
        raise TableError(f"chance level given for task(s) {', '.join(unknown)} not in the table; its tasks: {', '.join(table.bench_tasks) or 'none'}.")
    tasks: list[str] = []
    skipped: dict[str, str] = {}
    for j, t in enumerate(table.bench_tasks):  # a table with tasks has their scores
        n = int(np.isfinite(table.bench_rt[:, j]).sum()) if table.bench_rt is not None else 0
        if n >= MIN_SCORES:
            tasks.append(t)
        else:
            skipped[t] = f"{n} scores (needs {MIN_SCORES})"
    return table, n_base_rows, fixed_, chance_, tasks, skipped


def _fit_bootstrap(the_law: Law, table: RunsTable, point: dict[str, LawFit], weights_br: np.ndarray, bootstrap: int,
                   size_column: str, seed: int, boot_starts: int, bar) -> list[dict[str, LawFit]]:
    """The law refitted on every bootstrap resample of runs, per validation domain."""
    boots: list[dict[str, LawFit]] = [dict() for _ in range(bootstrap)]
    if bootstrap:
        bar.set_postfix_str("bootstrap")
        members = the_law.fit_bootstrap_domains(table, point, weights_br, size_column=size_column, seed=seed, starts=boot_starts, progress=_PerResample(bar, boot_starts) if isinstance(the_law, ParametricLaw) else bar)
        for d in table.loss_domains:
            for i, f in enumerate(members[d]):
                boots[i][d] = f
    return boots


def _fit_bench_laws(table: RunsTable, tasks: list[str], chance: dict[str, float], weights_br: np.ndarray,
                    bootstrap: int, seed: int, starts: int, bar) -> tuple[dict[str, BenchFit], list[dict[str, BenchFit]]]:
    """A loss-to-benchmark law per task (and per bootstrap resample)."""
    bench: dict[str, BenchFit] = {}
    bench_boot: list[dict[str, BenchFit]] = [dict() for _ in range(bootstrap)] if tasks else []
    for t in tasks:
        bar.set_postfix_str(f"bench:{t}")
        bench[t] = fit_bench(table, t, chance=chance.get(t), seed=seed, starts=starts)
        if bootstrap:
            for i, b in enumerate(fit_bench_bootstrap(table, bench[t], weights_br, seed=seed)):
                bench_boot[i][t] = b
        bar.update(1)
    return bench, bench_boot
