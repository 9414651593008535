"""The objective of the MergeMix alpha search (:class:`Objective`): one score per evaluation.

A weighted mean of *terms*: benchmark scores ``bench:<task>`` count positively (the evaluator's
``bench_metric``, :data:`BENCH_METRICS`: accuracies or mean gold log-probabilities, higher is better
for both), held-out losses ``loss:<domain>`` negatively. Default (no weights given): the macro-average over every
``bench:*`` key the evaluator returns, as in the paper. Each term is normalised before
averaging (``normalise=``):

- ``"seed_z"`` (default): standardised over the *seed design's* evaluations,
  ``(x - mean_seed) / std_seed``, then frozen. The paper leaves the normalisation
  unspecified; chance-corrected accuracy ``(acc - chance) / (1 - chance)`` is not generic
  (exact-match tasks, user tasks, losses have no chance level), and raw scores let the task
  with the largest spread across mixtures dominate (at moejax's small scale multiple-choice
  accuracies move by ~0.05 while exact match hardly moves). Standardising gives every term
  equal influence *in units of how much mixing moves it*. Over ~40 seeds the standard
  deviation is a steadier scale than min-max, which is set by the two most extreme seeds
  (typically single-expert vertices, which can collapse a task).
- ``"seed_minmax"``: ``(x - min_seed) / (max_seed - min_seed)``, frozen likewise.
- ``"none"``: raw values (losses still negated).

The statistics are computed once, when the seeds are in (:meth:`Objective.calibrate`), and
then fixed for every later score, the regressors' targets and the verification scores alike,
so all scores of one search are in the same units. A term that is flat over the seeds (spread
below 1e-12 of its magnitude, e.g. exact match 0 everywhere) gets scale 1 and is listed in
``flat_terms``: it cannot steer the search and its weight is in effect wasted. An already
calibrated objective passed to a search is used as is (so two searches can share units).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from moejax.errors import UserError

from data_mixture.collect import BENCH_METRICS

NORMALISATIONS = ("seed_z", "seed_minmax", "none")
# BENCH_METRICS (the runs table's bench: columns take the same choice): what a merge's bench:<task> is
# (the evaluator's choice, merge.MergeEvaluator; higher is better for both): "accuracy", the task's
# headline score (accuracy for multiple choice, exact match for generation,
# moejax.eval.evaluate.benchmark_score), or "gold_logprob", the mean over items of the gold answer's
# log-probability (nats, moejax.eval's continuous score; for generation tasks the answer's by
# teacher forcing), computed from the same log-likelihoods as the accuracy, so no extra forward.


class SearchError(UserError):
    """A bad search input (budget, domains, objective weights, metrics); names the value and what is allowed."""


def check_bench_metric(bench_metric: str) -> str:
    """``bench_metric`` if it is one of :data:`BENCH_METRICS`, else a SearchError naming the choices."""
    if bench_metric not in BENCH_METRICS:
        raise SearchError(f"bench_metric={bench_metric!r} is unknown; allowed: {', '.join(BENCH_METRICS)} "
                          "(accuracy: each task's accuracy or exact match; gold_logprob: the mean log-probability "
                          "of the gold answer, a continuous score).")
    return bench_metric


def _term_key(name: str, kind: str, arg: str) -> str:
    """``'code'`` or ``'bench:code'`` -> ``'bench:code'`` for kind 'bench' (likewise 'loss')."""
    if not isinstance(name, str) or not name:
        raise SearchError(f"{arg} key {name!r}: allowed: a non-empty {kind} name, e.g. 'code' or '{kind}:code'.")
    if ":" in name:
        prefix, rest = name.split(":", 1)
        if prefix != kind or not rest or ":" in rest:
            other = {"bench": "losses", "loss": "tasks"}[kind]
            hint = f" (a '{prefix}:' key belongs in {other}=)" if prefix in ("bench", "loss") else ""
            raise SearchError(f"{arg} key {name!r} has an unknown key style{hint}; allowed: '<name>' or '{kind}:<name>'.")
        return name
    return f"{kind}:{name}"


@dataclasses.dataclass(frozen=True)
class Objective:
    """Weighted mean of normalised terms (see the module docstring). Higher is better.

    ``tasks``: {task: weight} over ``bench:<task>`` (keys with or without the ``bench:`` prefix);
    ``losses``: {domain: weight} over ``loss:<domain>`` (these count negatively). Both None: the
    macro-average of every ``bench:*`` metric. Weights must be finite, >= 0, not all zero; they are
    normalised to sum to 1 over all terms. ``stats``: {term: (centre, scale)} once calibrated.
    """

    tasks: Mapping[str, float] | None = None
    losses: Mapping[str, float] | None = None
    normalise: str = "seed_z"
    stats: Mapping[str, tuple[float, float]] | None = None
    flat_terms: tuple[str, ...] = ()

    def __post_init__(self):
        if self.normalise not in NORMALISATIONS:
            raise SearchError(f"normalise={self.normalise!r}; allowed: {', '.join(NORMALISATIONS)}.")
        weights: dict[str, float] = {}
        for arg, kind, given in (("tasks", "bench", self.tasks), ("losses", "loss", self.losses)):
            if given is None:
                continue
            if not isinstance(given, Mapping):
                raise SearchError(f"{arg}= must be a dict {{name: weight}}; got {type(given).__name__}.")
            for name, w in given.items():
                key = _term_key(name, kind, arg)
                try:
                    w = float(w)
                except (TypeError, ValueError):
                    raise SearchError(f"{arg}[{name!r}] = {w!r}; allowed: a finite weight >= 0.") from None
                if not math.isfinite(w) or w < 0:
                    raise SearchError(f"{arg}[{name!r}] = {w!r}; allowed: a finite weight >= 0.")
                if key in weights:
                    raise SearchError(f"{arg} names {key!r} twice (with and without its prefix).")
                weights[key] = w
        if (self.tasks is not None or self.losses is not None) and sum(weights.values()) <= 0:
            raise SearchError(f"objective weights are all zero (tasks={self.tasks}, losses={self.losses}); "
                              "give at least one positive weight, or neither for the macro-average of all benchmarks.")
        object.__setattr__(self, "_weights", weights)

    # -- terms ---------------------------------------------------------------------------------------
    @property
    def is_default(self) -> bool:
        return self.tasks is None and self.losses is None

    def terms(self, metrics: Mapping[str, float] | None = None) -> dict[str, float]:
        """{term key: normalised weight}; the default objective needs ``metrics`` (or stats) to list them."""
        if not self.is_default:
            w = {k: v for k, v in self._weights.items() if v > 0}
        elif self.stats is not None:
            w = {k: 1.0 for k in self.stats}
        else:
            if metrics is None:
                raise SearchError("the default objective (macro-average of all benchmarks) needs metrics to list its tasks.")
            w = {k: 1.0 for k in sorted(metrics) if k.startswith("bench:")}
            if not w:
                raise SearchError(f"the default objective averages the bench:<task> metrics, but the evaluator returned none "
                                  f"(keys: {', '.join(sorted(metrics))}); give tasks= or losses= weights.")
        total = sum(w.values())
        return {k: v / total for k, v in w.items()}

    def check(self, metrics: Mapping[str, float], alpha=None) -> None:
        """Every term present and finite in ``metrics``, else an error naming the key and the alpha."""
        for key in self.terms(metrics):
            at = "" if alpha is None else f" at alpha={np.round(np.asarray(alpha), 6).tolist()}"
            if key not in metrics:
                avail = ", ".join(k for k in sorted(metrics) if k.startswith(("bench:", "loss:")))
                raise SearchError(f"objective term {key!r} is not among the evaluator's metrics{at}; it has: {avail}.")
            v = metrics[key]
            if not isinstance(v, (int, float, np.floating, np.integer)) or not math.isfinite(float(v)):
                raise SearchError(f"metric {key!r} = {v!r}{at}; the objective needs a finite number.")

    def raw_terms(self, metrics: Mapping[str, float]) -> dict[str, float]:
        """Un-normalised, sign-corrected terms (losses negated)."""
        return {k: (-float(metrics[k]) if k.startswith("loss:") else float(metrics[k])) for k in self.terms(metrics)}

    # -- normalisation ------------------------------------------------------------------------------
    @property
    def calibrated(self) -> bool:
        return self.stats is not None

    def calibrate(self, metrics_list: Sequence[Mapping[str, float]]) -> Objective:
        """A copy with (centre, scale) per term from these evaluations (the seed design), frozen."""
        if not metrics_list:
            raise SearchError("calibrate needs at least one evaluation.")
        terms = self.terms(metrics_list[0])
        for m in metrics_list:
            self.check(m)
        stats, flat = {}, []
        for key in terms:
            x = np.array([self.raw_terms(m)[key] for m in metrics_list])
            if self.normalise == "seed_z":
                centre, spread = float(x.mean()), float(x.std())
            elif self.normalise == "seed_minmax":
                centre, spread = float(x.min()), float(x.max() - x.min())
            else:
                centre, spread = 0.0, 1.0
            if spread <= 1e-12 * max(1.0, abs(centre)):
                spread = 1.0
                if self.normalise != "none":
                    flat.append(key)
            stats[key] = (centre, spread)
        return dataclasses.replace(self, stats=stats, flat_terms=tuple(flat))

    def normalised_terms(self, metrics: Mapping[str, float]) -> dict[str, float]:
        """{term: normalised, sign-corrected value}; ``normalise='none'`` needs no calibration."""
        if self.stats is None and self.normalise != "none":
            raise SearchError(f"this objective (normalise={self.normalise!r}) is not calibrated yet: "
                              "call objective.calibrate(seed_metrics) first.")
        self.check(metrics)
        raw = self.raw_terms(metrics)
        if self.stats is None:
            return raw
        return {k: (raw[k] - self.stats[k][0]) / self.stats[k][1] for k in self.terms(metrics)}

    def combine(self, term_values: Mapping[str, float | np.ndarray]):
        """Weighted mean of normalised term values (scalars or arrays), over the terms of ``term_values``
        where the objective is the uncalibrated default (its terms are whatever the metrics hold)."""
        weights = self.terms(None if (self.stats is not None or not self.is_default) else
                             {k: 0.0 for k in term_values})
        return sum(w * np.asarray(term_values[k], np.float64) for k, w in weights.items())

    def score(self, metrics: Mapping[str, float]) -> float:
        """The objective of one evaluation (higher is better); calibrate first unless ``normalise='none'``."""
        return float(self.combine(self.normalised_terms(metrics)))

    # -- JSON ---------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {"tasks": None if self.tasks is None else dict(self.tasks),
                "losses": None if self.losses is None else dict(self.losses),
                "normalise": self.normalise,
                "stats": None if self.stats is None else {k: list(v) for k, v in self.stats.items()},
                "flat_terms": list(self.flat_terms),
                "weights": self.terms() if (self.stats is not None or not self.is_default) else None}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Objective:
        stats = d.get("stats")
        return cls(tasks=d.get("tasks"), losses=d.get("losses"), normalise=d.get("normalise", "seed_z"),
                   stats=None if stats is None else {k: (float(v[0]), float(v[1])) for k, v in stats.items()},
                   flat_terms=tuple(d.get("flat_terms", ())))
