"""One call from a runs table to a mixture a user can train: ``data_mixture recommend``.

:func:`recommend` (and the command, which calls it):

1. reads the runs table(s) and the target (``--target``; none: the mean over the validation
   domains), and finds every law the table supports (:data:`CANDIDATE_LAWS`, with the
   repetition-aware ``+repfit`` variants when the table has ``unique:<domain>`` columns; a law the
   table cannot identify is listed with the reason);
2. scores each law by held-out decision accuracy beside every baseline, practitioner rules
   included (:mod:`data_mixture.evaluate`): the largest size held out when the table has 3 or more
   sizes, else ``kfold=5`` across the mixtures at the largest size (:mod:`data_mixture.kfold`);
3. picks the best law (highest decision accuracy, then lowest MAE) and the best practitioner rule
   (highest decision accuracy among ``target_capped_*`` / ``proxy_capped_*``); the law *beats*
   the rule when the 95% paired bootstrap interval of their decision-accuracy difference lies above
   0 (evaluate's rule);
4. fits the best law on the whole table with ``bootstrap`` members and makes its robust pick at the
   target (:mod:`data_mixture.robust`) with its odds against every baseline mixture at the target
   (uniform, proportional and UniMax when every pool is known, best-at-proxy, the practitioner
   rules); the pick obeys the same cap as the rules, at most ``max_epochs`` (default
   :data:`MAX_EPOCHS` = 16) epochs of each pool at the target's tokens, so that a law blind to
   repetition cannot pick a pool repeated past the point where repeats are worth little (None: no cap);
5. recommends the law's robust pick when the law beats the rule, else the rule's mixture at the
   target, saying so; and writes ``mixture.json`` (``{"weights": ...}`` that training reads as
   ``data.mixture_file``, plus the evidence), ``recommendation.md`` (one page) with
   ``recommendation.png`` (each candidate's predicted target loss with the members' interval) and
   the training command (:func:`data_mixture.sweep.targets.launch_command`: runnable as printed
   from the user's directory), and ``evaluation.json``.

Pools at the target (``unique_tokens`` {domain: tokens}): the scarce domains' unique tokens at the
target's budget; not given, each domain's largest pool in the table (``unique:<domain>``), none
for a domain without one (unlimited).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from moejax.errors import UserError

CANDIDATE_LAWS = ("camel", "additive", "mixing_law", "regmix_linear", "regmix", "log_linear")
REPETITION_LAWS = ("camel+repfit", "additive+repfit")
BOOTSTRAP = 50
MAX_EPOCHS = 16.0  # the law's pick: at most this many epochs of each pool (the practitioner rules' larger cap)
KFOLD_BELOW_SIZES = 3  # tables with fewer sizes are scored out of fold


class RecommendError(UserError):
    """Input that recommend cannot use; names the option, the value and what is allowed."""


def _say(progress: bool) -> Callable[[str], None]:
    def say(msg: str) -> None:
        if progress:
            print(f"[recommend] {msg}", file=sys.stderr, flush=True)
    return say


def supported_laws(table, target_domain: str, size_column: str, laws: Sequence[str] | None = None) -> tuple[list, dict]:
    """(laws the table can identify, {law: why not})."""
    from data_mixture.laws import get_law
    from data_mixture.table import TableError

    if laws is None:
        has_pools = any(c.startswith("unique:") for c in table.extra)
        laws = list(CANDIDATE_LAWS) + (list(REPETITION_LAWS) if has_pools else [])
    ok, skipped = [], {}
    for name in laws:
        try:
            get_law(name).check(table, target_domain, size_column)
            ok.append(name)
        except TableError as e:
            skipped[name] = str(e)
    return ok, skipped


def _best_law(report: Mapping[str, Any]) -> str | None:
    scored = {n: e for n, e in report["laws"].items() if (e.get("decision") or {}).get("accuracy") is not None}
    if not scored:
        return None
    return max(scored, key=lambda n: (scored[n]["decision"]["accuracy"], -(scored[n]["mean"].get("mae") or 0.0)))


def _best_rule(report: Mapping[str, Any]) -> str | None:
    from data_mixture.baselines import practitioner_names

    scored = {n: e for n, e in report["baselines"].items()
              if n in practitioner_names() and (e.get("decision") or {}).get("accuracy") is not None}
    return max(scored, key=lambda n: scored[n]["decision"]["accuracy"]) if scored else None


def decide(report: Mapping[str, Any], baselines: Mapping[str, dict]) -> dict[str, Any]:
    """The recommendation's decision (law or rule) from an evaluation report; see the module docstring."""
    law, rule = _best_law(report), _best_rule(report)
    acc = (lambda kind, n: report[kind][n]["decision"]["accuracy"])
    out: dict[str, Any] = {"best_law": law, "best_rule": rule, "rule": report["verdict"].get("rule", "")}
    if law is not None:
        out["law_accuracy"] = acc("laws", law)
    if rule is not None:
        out["rule_accuracy"] = acc("baselines", rule)
    if law is None:
        out["choice"] = "rule" if rule is not None else "none"
        out["why"] = "no law could be scored on this table"
        return out
    if rule is None or "weights" not in baselines.get(rule, {}):
        out["choice"], out["why"] = "law", "no practitioner rule could be scored here, so the best law's pick is recommended"
        return out
    cmp = report["verdict"]["laws"].get(law, {}).get(rule)
    out["comparison"] = cmp
    beats = bool(cmp and cmp.get("beats"))
    out["choice"] = "law" if beats else "rule"
    diff = "" if not cmp else f" (difference {cmp['diff']:+.2f}, 95% paired interval [{cmp['lo']:+.2f}, {cmp['hi']:+.2f}])"
    out["why"] = (f"{law} beats the best practitioner rule {rule} in held-out decision accuracy outside the interval{diff}"
                  if beats else f"no law beats the best practitioner rule {rule} in held-out decision accuracy outside "
                                f"the interval (best law {law}{diff}), so the rule is recommended")
    return out


def _score(table_t, laws, size_column, target, seed, starts, resamples, say) -> dict[str, Any]:
    from data_mixture.evaluate import evaluate_laws

    n_sizes = len(np.unique(table_t.size(size_column)))
    holdout = "largest" if n_sizes >= KFOLD_BELOW_SIZES else "kfold=5"
    say(f"scoring {len(laws)} law(s) ({', '.join(laws)}) and the baselines, hold-out {holdout} "
        f"({n_sizes} size(s) in the table)")
    return evaluate_laws(table_t, laws, holdout=holdout, size_column=size_column, seed=seed, starts=starts,
                         resamples=resamples, optimum=False, target=target)


def recommend(runs, *, size: float, tokens: float, target: str | None = None,
              unique_tokens: Mapping[str, float] | None = None, size_column: str = "params_active",
              laws: Sequence[str] | None = None, bootstrap: int = BOOTSTRAP, robust: str = "mean", seed: int = 0,
              starts: int = 16, resamples: int = 1000, out: str | os.PathLike | None = None,
              config: str | None = None, dataset: str | None = None, progress: bool = True,
              max_epochs: float | None = MAX_EPOCHS) -> dict[str, Any]:
    """The recommendation as a dict (the ``mixture.json`` written under ``out`` when given).
    ``runs``: a runs-table path, a list of paths (concatenated) or a RunsTable."""
    from data_mixture.baselines import baseline_mixtures, target_pools
    from data_mixture.fit import fit_table
    from data_mixture.optimize import Constraints, optimize_mixture
    from data_mixture.robust import parse_robust
    from data_mixture.table import RunsTable, read_runs
    from data_mixture.target import parse_target

    t0 = time.perf_counter()
    say = _say(progress)
    for name, v in (("--size", size), ("--tokens", tokens)):
        if not (math.isfinite(float(v)) and float(v) > 0):
            raise RecommendError(f"{name} {v!r}; allowed: a number > 0.")
    if max_epochs is not None and not (math.isfinite(float(max_epochs)) and float(max_epochs) > 0):
        raise RecommendError(f"--max-epochs {max_epochs!r}; allowed: a number of epochs > 0 (0 on the command line: no cap).")
    if bootstrap < 2:
        raise RecommendError(f"--bootstrap {bootstrap}; allowed: >= 2 (the robust pick needs members; {BOOTSTRAP} advised).")
    parse_robust(robust)
    table = runs if isinstance(runs, RunsTable) else read_runs(*([str(runs)] if isinstance(runs, (str, Path)) else
                                                                  [str(p) for p in runs]))
    target_obj = parse_target(target) if target else None
    table_t = target_obj.apply(table.law_rows()) if target_obj else table.law_rows()
    if target_obj is None and len(table_t.loss_domains) > 1:
        loss_text = ",".join(f"{d}={1 / len(table_t.loss_domains):.6g}" for d in table_t.loss_domains)
        target_obj = parse_target(loss_text)
        table_t = target_obj.apply(table.law_rows())
    domain = table_t.loss_domains[0]
    pools = target_pools(table, unique_tokens)
    ok, skipped = supported_laws(table_t, domain, size_column, laws)
    say(f"table: {len(table_t)} rows, {len(np.unique(table_t.run))} runs, domains {', '.join(table_t.mix_domains)}; "
        f"target {target_obj.text if target_obj else domain}; laws the table supports: {', '.join(ok) or 'none'}")
    report = _score(table_t, ok, size_column, target_obj, seed, starts, resamples, say)
    bases = baseline_mixtures(table_t, size_column, target_obj, tokens, pools)
    decision = decide(report, bases)
    say(f"best law {decision['best_law']}, best practitioner rule {decision['best_rule']}: {decision['choice']}")
    pick = None
    if decision["best_law"] is not None:
        law = decision["best_law"]
        say(f"fitting {law} on the whole table with {bootstrap} bootstrap members")
        fit = fit_table(table, law, size_column=size_column, bootstrap=bootstrap, seed=seed, starts=starts,
                        progress=progress and sys.stderr.isatty(), target=target_obj)
        say("robust pick over the members")
        with_weights = {n: b["weights"] for n, b in bases.items() if "weights" in b}
        caps = Constraints(domain_epochs={d: max_epochs for d in pools} if max_epochs else {})
        pick = optimize_mixture(fit, size=size, tokens=tokens, unique_tokens=pools or None, robust=robust,
                                baselines=with_weights, seed=seed, interval=0.9, constraints=caps)
    result = _result(decision, pick, bases, report, skipped, size=size, tokens=tokens, size_column=size_column,
                     target=target_obj, pools=pools)
    result["seconds"] = time.perf_counter() - t0
    if out is not None:
        write_recommendation(result, report, out, config=config, dataset=dataset)
        say(f"wrote {Path(out) / 'mixture.json'}, recommendation.md, recommendation.png, evaluation.json")
    return result


def _result(decision, pick, bases, report, skipped, *, size, tokens, size_column, target, pools) -> dict[str, Any]:
    if decision["choice"] == "law" and pick is not None:
        weights, source = pick["weights"], f"{decision['best_law']} (robust pick)"
    elif decision["choice"] == "rule":
        weights, source = bases[decision["best_rule"]]["weights"], f"{decision['best_rule']} (practitioner rule)"
    else:
        raise RecommendError(f"nothing to recommend: {decision['why']}; the laws skipped: "
                             + "; ".join(f"{n}: {r}" for n, r in skipped.items()))
    scores = {kind: {n: (e.get("decision") or {}).get("accuracy") if "skipped" not in e else None
                     for n, e in report[kind].items()} for kind in ("laws", "baselines")}
    return {
        "weights": weights, "source": source, "decision": decision,
        "target": {"size": float(size), "size_column": size_column, "tokens": float(tokens),
                   "target": target.to_json() if target else None, "unique_tokens": dict(pools)},
        "robust": pick.get("robust") if pick else None, "law_point": pick.get("point") if pick else None,
        "baselines": bases, "decision_accuracy": scores, "holdout": report.get("holdout"),
        "laws_skipped": skipped, "laws_scored_skipped": {n: e["skipped"] for n, e in report["laws"].items() if "skipped" in e},
    }


def training_command(mixture_path: Path, tokens: float, *, config: str | None, dataset: str | None) -> str:
    """The command that trains the recommended mixture for ``tokens`` tokens (runnable as printed:
    :func:`data_mixture.sweep.targets.mixture_command`, which ``optimize`` prints too)."""
    from data_mixture.sweep.targets import mixture_command

    return mixture_command(Path(mixture_path).resolve(), tokens, "runs/recommended", config=config, dataset=dataset)


def write_recommendation(result: dict, report: Mapping[str, Any], out: str | os.PathLike, *, config: str | None = None,
                         dataset: str | None = None) -> None:
    """``mixture.json``, ``recommendation.md``, ``recommendation.png`` and ``evaluation.json`` under ``out``."""
    from data_mixture.recommendation_report import plot_recommendation, recommendation_md
    from data_mixture.user_files import write_text

    outdir = Path(out)
    outdir.mkdir(parents=True, exist_ok=True)
    result["command"] = training_command(outdir / "mixture.json", result["target"]["tokens"], config=config,
                                         dataset=dataset)
    write_text(outdir / "mixture.json", json.dumps(result, indent=1))
    write_text(outdir / "evaluation.json", json.dumps(report, indent=1))
    plot_recommendation(result, outdir / "recommendation.png")
    write_text(outdir / "recommendation.md", recommendation_md(result))
