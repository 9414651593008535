"""Pre-registration the tools check: a decision written down, hashed and timed before its runs.

A *registration* (``data_mixture register``, :func:`register`) is a JSON file holding

``decision_rule``  what decides a comparison (text and the parameters :func:`verify` applies:
                   ``metric``, ``loss:mean``, ``loss:<domain>`` or any ``--target`` text such as
                   ``code=0.6,prose=0.4``; ``level``, the interval mass);
``candidates``     {name: {training domain: weight}}: the mixtures to be compared at the target;
``comparisons``    the registered pairs [a, b] of candidate names (default: every pair);
``predictions``    {law: {candidate: predicted value}}: each law's prediction, fixed before the runs;
``target``         the target point {size_column, size, tokens} (optional; restricts the check);
``code_version``   the git commit (and whether the checkout had uncommitted changes) it was written from;
``registered_at``  UTC time, ISO 8601;
``sha256``         a hash of every field above (canonical JSON: sorted keys, no spaces), so an
                   edit after the fact is found.

:func:`verify` checks a registration against a runs table that has each run's start time (the
``started_at`` column that ``sweep`` records and ``collect`` carries; UTC ISO 8601). A target run is
a row at the registration's target size (every row when it has none). It lists, by name,

- runs that started before the registration (``predate``),
- runs whose start time the table does not have (``start_unknown``),
- target runs whose mixture is none of the candidates (``not_covered``),
- candidates with no target runs (``missing``),

checks the hash, and scores every registered comparison with the rule (:func:`data_mixture.decisions.seed_difference`
on each run's final checkpoint: paired over seeds when both have the same >= 2 seeds). A report may
call the decision **pre-registered** only when ``verify(...)["pre_registered"]`` is true: hash intact,
no run predating it, none of unknown start, none uncovered, no candidate missing; ``why_not``
says what failed otherwise.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import itertools
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from data_mixture import decisions as dec
from data_mixture.table import RunsTable, TableError
from data_mixture.target import parse_target
from moejax.errors import UserError

STARTED_AT = "started_at"
"""The runs-table column with each run's first start time (UTC, ISO 8601), written by ``sweep``."""
TOL = 1e-6  # a run's mixture equals a candidate's when every weight is within this
HASHED = ("decision_rule", "candidates", "comparisons", "predictions", "target", "code_version", "registered_at")


class RegistrationError(UserError):
    """A registration that cannot be written or checked: names the field, the value and the fix."""


def content_hash(reg: Mapping[str, Any]) -> str:
    """sha256 of the canonical JSON of the hashed fields (:data:`HASHED`)."""
    body = {k: reg.get(k) for k in HASHED}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def parse_time(text: str) -> _dt.datetime:
    """An ISO 8601 time; one without a zone is taken as UTC; ``Z`` allowed."""
    t = _dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    return t if t.tzinfo else t.replace(tzinfo=_dt.timezone.utc)


def register(decision_rule: str | Mapping[str, Any], candidates: Mapping[str, Mapping[str, float]], *,
             predictions: Mapping[str, Mapping[str, float]] | None = None,
             comparisons: Sequence[Sequence[str]] | None = None, target: Mapping[str, Any] | None = None,
             code_version: Mapping[str, Any] | None = None, registered_at: str | None = None) -> dict[str, Any]:
    """The registration dict (module docstring) with its hash. ``decision_rule``: text, or a dict with
    ``rule`` (text) and optionally ``metric`` (default ``loss:mean``) and ``level`` (default 0.95).
    ``code_version`` defaults to the checkout's (git commit, dirty flag); ``registered_at`` to now."""
    rule = {"rule": decision_rule} if isinstance(decision_rule, str) else dict(decision_rule)
    if not str(rule.get("rule", "")).strip():
        raise RegistrationError("the decision rule is empty; write what decides a comparison, e.g. 'a beats b when the "
                                "95% paired t-interval over 3 seeds of loss(a) - loss(b) lies below 0'.")
    rule.setdefault("metric", "loss:mean")
    rule.setdefault("level", 0.95)
    if len(candidates) < 2:
        raise RegistrationError(f"{len(candidates)} candidate mixture(s); a decision compares at least 2.")
    cands = {}
    for name, w in candidates.items():
        total = sum(float(v) for v in w.values())
        if not w or abs(total - 1.0) > 1e-3 or any(float(v) < 0 for v in w.values()):
            raise RegistrationError(f"candidate {name!r} has weights {dict(w)} (sum {total:.4g}); allowed: weights >= 0 "
                                    "summing to 1 over the training domains.")
        cands[str(name)] = {str(d): float(v) / total for d, v in w.items()}
    pairs = [list(p) for p in (comparisons if comparisons is not None else itertools.combinations(cands, 2))]
    bad = [p for p in pairs if len(p) != 2 or p[0] not in cands or p[1] not in cands or p[0] == p[1]]
    if bad:
        raise RegistrationError(f"comparisons {bad} are not pairs of two different candidates; candidates: "
                                f"{', '.join(cands)}.")
    if code_version is None:
        from data_mixture.sweep.record import code_version as current

        code_version = current()
    reg: dict[str, Any] = {
        "version": 1, "decision_rule": rule, "candidates": cands, "comparisons": pairs,
        "predictions": {str(law): {str(k): float(v) for k, v in p.items()} for law, p in (predictions or {}).items()},
        "target": dict(target) if target else None, "code_version": dict(code_version),
        "registered_at": registered_at or utc_now(),
    }
    parse_time(reg["registered_at"])
    reg["sha256"] = content_hash(reg)
    return reg


def with_baselines(candidates: Mapping[str, Mapping[str, float]], table: RunsTable, *, metric: str, tokens: float,
                   size_column: str, unique_tokens: Mapping[str, float] | None = None) -> dict[str, dict[str, float]]:
    """``candidates`` plus every baseline mixture at the target that they do not name already
    (:func:`data_mixture.baselines.baseline_mixtures`: uniform, proportional/UniMax, best-at-proxy and
    the practitioner rules), from the proxy runs ``table`` for the rule's ``metric`` (``loss:mean``,
    ``loss:<domain>`` or a target text)."""
    from data_mixture.baselines import baseline_mixtures, target_pools

    aim = None if metric == "loss:mean" else parse_target(metric)
    rows = table.law_rows()
    table_t = aim.apply(rows) if aim is not None else rows
    got = baseline_mixtures(table_t, size_column, aim, tokens, target_pools(table, unique_tokens))
    out = {n: dict(w) for n, w in candidates.items()}
    for name, b in got.items():
        if "weights" in b and name not in out:
            out[name] = b["weights"]
    return out


def write(reg: Mapping[str, Any], path: str | Path) -> None:
    from data_mixture.user_files import write_text

    write_text(str(path), json.dumps(reg, indent=1) + "\n")


def load(path: str | Path) -> dict[str, Any]:
    try:
        reg = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise RegistrationError(f"--registration {path}: not a readable JSON registration ({e}); write one with "
                                "`python -m data_mixture register`.") from None
    missing = [k for k in (*HASHED, "sha256") if k not in reg]
    if missing:
        raise RegistrationError(f"--registration {path} lacks {', '.join(missing)}; it was not written by "
                                "`python -m data_mixture register`.")
    return reg


def _runs_of(table: RunsTable, reg: Mapping[str, Any]) -> tuple[np.ndarray, dict[str, list[int]], list[str]]:
    """Target rows (mask), {candidate: target row indices}, and target runs of no candidate."""
    target = reg.get("target") or {}
    if target.get("size") is not None:
        size = table.size(target.get("size_column", "params_total"))
        at = np.isclose(size, float(target["size"]), rtol=1e-6)
    else:
        at = np.ones(len(table), bool)
    of: dict[str, list[int]] = {c: [] for c in reg["candidates"]}
    uncovered = []
    for i in np.flatnonzero(at):
        mix = dict(zip(table.mix_domains, table.mix_rm[i]))
        hit = [c for c, w in reg["candidates"].items()
               if set(w) <= set(mix) and all(abs(mix.get(d, 0.0) - w.get(d, 0.0)) <= TOL for d in mix)]
        if hit:
            for c in hit:
                of[c].append(int(i))
        else:
            uncovered.append(str(table.run[i]))
    return at, of, sorted(set(uncovered))


def _metric(table: RunsTable, metric: str) -> np.ndarray:
    if metric == "loss:mean":
        return table.loss_rv.mean(axis=1)
    if metric.startswith("loss:"):
        return table.loss(metric[5:])
    try:  # any other target the tools take: a weighted set (code=0.6,prose=0.4), logprob:<task>, ...
        return parse_target(metric).values(table)
    except TableError as e:
        raise RegistrationError(f"decision rule metric {metric!r}: {e} Allowed: loss:mean, loss:<domain>, or a "
                                "--target text such as heldout_qa or code=0.6,prose=0.4.") from None


def verify(reg: Mapping[str, Any], table: RunsTable) -> dict[str, Any]:
    """Checks ``reg`` against ``table`` (module docstring): {pre_registered, why_not, hash_ok,
    registered_at, predate, start_unknown, not_covered, missing, comparisons}."""
    hash_ok = content_hash(reg) == reg.get("sha256")
    when = parse_time(reg["registered_at"])
    at, of, uncovered = _runs_of(table, reg)
    runs = sorted(set(table.run[at].tolist()))
    started = table.extra.get(STARTED_AT)
    start_of: dict[str, str] = {}
    if started is not None:
        for r, s in zip(table.run, started):
            if str(s).strip():
                start_of.setdefault(str(r), str(s).strip())
    predate = sorted(r for r in runs if r in start_of and parse_time(start_of[r]) < when)
    unknown = sorted(r for r in runs if r not in start_of)
    missing = sorted(c for c, rows in of.items() if not rows)
    value = _metric(table, reg["decision_rule"].get("metric", "loss:mean"))
    level = float(reg["decision_rule"].get("level", 0.95))
    seeds = table.seeds()
    comparisons = []
    for a, b in reg["comparisons"]:
        entry: dict[str, Any] = {"a": a, "b": b}
        if of[a] and of[b]:
            fa, fb = _finals(table, of[a], seeds, value), _finals(table, of[b], seeds, value)
            d = dec.seed_difference(fa, fb, level)
            d["verdict"] = ("tie" if d["lo"] is None or d["lo"] <= 0 <= d["hi"] else "a wins" if d["diff"] < 0 else "b wins")
            runs_ab = sorted({str(table.run[i]) for i in of[a] + of[b]})
            early = [r for r in runs_ab if r in predate or r in unknown]
            entry.update(d, runs=runs_ab, pre_registered=hash_ok and not early,
                         not_pre_registered_runs=early)
        else:
            entry.update(verdict="not run", pre_registered=False, not_pre_registered_runs=[])
        comparisons.append(entry)
    why = []
    if not hash_ok:
        why.append("the registration's content does not match its sha256 (it was edited after it was written)")
    if predate:
        why.append(f"{len(predate)} target run(s) started before the registration ({reg['registered_at']}): {', '.join(predate)}")
    if unknown:
        why.append(f"{len(unknown)} target run(s) have no start time (column {STARTED_AT}): {', '.join(unknown)}")
    if uncovered:
        why.append(f"{len(uncovered)} target run(s) are of no registered candidate: {', '.join(uncovered)}")
    if missing:
        why.append(f"candidate(s) with no target run: {', '.join(missing)}")
    return {"pre_registered": not why, "why_not": why, "hash_ok": hash_ok, "registered_at": reg["registered_at"],
            "code_version": reg.get("code_version"), "predate": predate, "start_unknown": unknown,
            "not_covered": uncovered, "missing": missing, "target_runs": runs, "comparisons": comparisons}


def _finals(table: RunsTable, rows: list[int], seeds: np.ndarray, value: np.ndarray) -> list[tuple[int, float]]:
    """(seed, value) at each run's final checkpoint among ``rows``, one per run."""
    best: dict[str, int] = {}
    for i in rows:
        r = str(table.run[i])
        if r not in best or table.tokens[i] > table.tokens[best[r]]:
            best[r] = i
    return sorted((int(seeds[i]), float(value[i])) for i in best.values())


def format_check(check: Mapping[str, Any]) -> list[str]:
    """Markdown lines: the status first ("Pre-registered" only when the check passed), the runs by
    name, then every registered comparison."""
    if check["pre_registered"]:
        head = (f"**Pre-registered**: registration of {check['registered_at']} (sha256 intact) predates every target "
                f"run it covers ({len(check['target_runs'])} runs), and covers them all.")
    else:
        head = "**Not pre-registered**: " + "; ".join(check["why_not"]) + "."
    lines = [head, "", "| registered comparison | difference a - b [95%] | verdict | pre-registered |", "|---|---|---|---|"]
    for c in check["comparisons"]:
        iv = (f"{c['diff']:+.4f} [{c['lo']:+.4f}, {c['hi']:+.4f}]" if c.get("lo") is not None
              else f"{c['diff']:+.4f}" if "diff" in c else "")
        pre = "yes" if c["pre_registered"] else ("no: " + ", ".join(c["not_pre_registered_runs"])
                                                  if c["not_pre_registered_runs"] else "no")
        lines.append(f"| {c['a']} vs {c['b']} | {iv} | {c['verdict']} | {pre} |")
    return lines
