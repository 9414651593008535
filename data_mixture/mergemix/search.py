"""Alpha search for MergeMix: the paper's regressor-guided search and a direct CMA-ES baseline.

An *evaluator* is any ``Callable[[np.ndarray], dict[str, float]]`` that merges the experts with the
weights ``alpha_k`` (on the simplex, in the order of ``domains``) and returns flat metrics with keys
``bench:<task>`` (higher is better) and ``loss:<domain>`` (lower is better); other keys (e.g.
``seconds``) are carried into the trace (numbers only) and otherwise ignored. ``MergeEvaluator.evaluate`` of
:mod:`.merge` is one (it also caches: the same alpha is never recomputed); synthetic surfaces in
the tests are others. An evaluator that also has ``evaluate_many(alpha_nk) -> [metrics]`` is asked
for every merge the algorithm has decided on at once (the seed design, each verification round,
each CMA-ES generation), so it can score them together (:mod:`.batched`); the searches' results do
not depend on how the evaluator groups them. Nothing here imports JAX.

Objective (:class:`Objective`)
    A weighted mean of *terms*: benchmark scores ``bench:<task>`` count positively, held-out losses
    ``loss:<domain>`` negatively. Default (no weights given): the macro-average over every
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

Seed design (:func:`seed_design`)
    Priors first, then space filling; see its docstring.

MergeMix search (:func:`mergemix_search`), following the paper with the unspecified parts chosen:
    1. evaluate the ``n_seeds`` seed mixtures (phase ``"seed"``) and calibrate the objective;
    2. fit one LightGBM regressor per objective term on all evaluations so far (features: alpha;
       target: the normalised term; settings in ``LGBM_PARAMS``, sized for ~40 points);
    3. predict the objective on a fine candidate set over the simplex: ``N_DIRICHLET``
       Dirichlet(1) draws, the lattice of step ``1 / FINE_LATTICE`` (where it has at most
       ``MAX_LATTICE`` points), and ``N_LOCAL`` concentrated Dirichlet draws around each of the 3
       best evaluated and 3 best predicted points (local refinement);
    4. verify by merging the ``verify_per_round`` best predicted points that are *distinct*
       (pairwise L1 distance >= ``MIN_SEPARATION`` and not within it of an evaluated point;
       the separation is halved when too few qualify) (phase ``"verify"``, with the prediction
       recorded), then refit (2) on everything evaluated and repeat until ``n_verify`` merges
       are spent. Refitting after each round lets a wrong prediction correct the model where the
       search looks, which a single verification (the paper's) cannot.
    The result's ``best`` is the best *evaluated* score, never a prediction. To compare the best of
    two searches, put both in one objective's units first (:meth:`SearchResult.rescore`).

CMA-ES (:func:`cmaes_search`), the direct derivative-free search
    pycma on ``alpha = softmax(z)`` with K free logits ``z`` (start 0 = uniform mixture, step size
    ``sigma0`` = 1 logit, default population ``4 + floor(3 ln K)``). K logits rather than K-1
    with a reference domain keep the search symmetric in the domains (no domain is the fixed
    one); the redundant direction (adding a constant to every logit) does not change alpha and
    is harmless to CMA-ES. The budget counts evaluations; a last generation that does not fit is
    evaluated only as far as the budget goes (not told). The normaliser is calibrated on the
    first generation (the analogue of the seed design) unless the objective is calibrated already.
    pycma draws from numpy's global RNG; the search keeps its own state and swaps it in around
    pycma's calls, so it neither disturbs nor depends on the caller's global RNG.
    alpha_k > 0 always: an optimum on a face of the simplex is only approached (logits -> -inf),
    while MergeMix's candidates include the faces (lattice, vertices).

Both searches are deterministic by ``seed``. :func:`compare_searches` runs both on one evaluator and
reports best-so-far score per evaluation spent, rescored with one common normaliser.

Not reused from :mod:`data_mixture.optimize`: its box projection and SLSQP refinement with finite
differences serve smooth laws under per-domain bounds; here there are no bounds (candidates are on
the simplex by construction) and tree regressors have no useful gradient, so the fine search is
candidate-only (the same Dirichlet(1) + vertices idea, plus a lattice and local clouds).

Measured (2-core CPU, the tests' synthetic surface: K=4, three concave tasks on different scales,
interior optimum off the seed lattice; macro-average, seed_z units, score range over the simplex 4.2;
``compare_searches``, budget 60, seeds 0-3; gap = true optimum - best score):

- noiseless: MergeMix gap after 40 / 50 / 60 evaluations 0.11 / 0.006-0.043 / 0.006-0.043 (mean at
  60: 0.020); CMA-ES 0.002-0.10 / 0.002-0.022 / 0.002-0.020 (mean 0.007). On a smooth noiseless
  surface CMA-ES finds better mixtures per evaluation; the seed design spends 40 evaluations on
  coverage before any is aimed.
- with evaluation noise (Gaussian, sd 0.01 / 0.03 / 0.003 on the three tasks, a few % of their
  spread; 8 noise streams), judged by the *true* score at the chosen alpha: MergeMix gap mean 0.049
  (0.013-0.084), CMA-ES mean 0.037, median 0.026 (0.010-0.113); uniform mixture 0.25, best seed
  0.11. Both pick their best by a noisy evaluated score (winner's curse); neither wins clearly.
- plain (constant-leaf) trees instead of linear trees: gap 0.03-0.05 at 60 evaluations.
- K = 6 or 8 with budget 50: neither search gets close (L1 distance to the optimum ~0.2-0.28;
  MergeMix's best was a seed): 40 points are thin in 5-7 dimensions.
- one MergeMix run (60 evaluations, 4 refits) takes 1-4 s besides the evaluations, mostly
  LightGBM prediction over ~23k candidates per term and round; CMA-ES's overhead is negligible.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

Evaluator = Callable[[np.ndarray], Mapping[str, float]]

NORMALISATIONS = ("seed_z", "seed_minmax", "none")
PHASES = ("seed", "verify", "cmaes")

# LightGBM for ~40-100 points in K dims: shallow trees (4 leaves, depth 3), leaves of >= 3 points
# so one noisy merge cannot own a leaf, and *linear trees* (a ridge-regularised linear model of
# alpha in each leaf, ``linear_lambda``): plain trees are piecewise constant, so their argmax is a
# whole cell and where the verification merge lands inside it is arbitrary; piecewise-linear leaves
# give an argmax that moves with the data (on the synthetic test surface: gap to the true optimum
# 0.006-0.045 vs 0.03-0.05 normalised units with plain trees, same budget). No bagging or feature
# subsampling (with K features each matters); deterministic (fixed seed, one thread, row-wise
# histograms). 150 rounds at rate 0.1: predicting ~22k candidates costs ~0.4 s per term and round.
LGBM_PARAMS = {
    "objective": "regression",
    "learning_rate": 0.1,
    "linear_tree": True,
    "linear_lambda": 1e-2,
    "num_leaves": 4,
    "max_depth": 3,
    "min_data_in_leaf": 3,
    "min_data_in_bin": 1,
    "min_sum_hessian_in_leaf": 1e-6,
    "lambda_l2": 1e-3,
    "max_bin": 63,
    "feature_fraction": 1.0,
    "bagging_fraction": 1.0,
    "verbose": -1,
    "num_threads": 1,
    "deterministic": True,
    "force_row_wise": True,
}
NUM_ROUNDS = 150

N_DIRICHLET = 20_000
FINE_LATTICE = 20
MAX_LATTICE = 20_000
N_LOCAL = 500
LOCAL_CONCENTRATION = 200.0
MIN_SEPARATION = 0.05
SEED_LATTICE = 4
SEED_POOL = 4_000


class SearchError(ValueError):
    """A bad search input (budget, domains, objective weights, metrics); names the value and what is allowed."""


# --------------------------------------------------------------------------------------------------
# Objective
# --------------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------------
# Simplex helpers
# --------------------------------------------------------------------------------------------------


def _check_domains(domains: Sequence[str]) -> tuple[str, ...]:
    if isinstance(domains, str):
        raise SearchError(f"domains={domains!r}: give a list of domain names, not one string.")
    domains = tuple(domains)
    if len(domains) < 2:
        raise SearchError(f"the search needs at least 2 domains to mix; got {list(domains)}.")
    if len(set(domains)) != len(domains):
        dup = sorted({d for d in domains if domains.count(d) > 1})
        raise SearchError(f"domains are listed twice: {', '.join(dup)}.")
    return domains


def _check_int(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise SearchError(f"{name}={value!r}; allowed: an integer >= {minimum}.")
    return int(value)


def simplex_lattice(k: int, h: int) -> np.ndarray:
    """All points of the simplex in K dims whose coordinates are multiples of 1/h, [C(h+K-1, K-1), K]."""
    pts = []
    for bars in itertools.combinations(range(h + k - 1), k - 1):
        edges = (-1,) + bars + (h + k - 1,)
        pts.append([edges[i + 1] - edges[i] - 1 for i in range(k)])
    return np.asarray(pts, np.float64) / h


def _lattice_size(k: int, h: int) -> int:
    return math.comb(h + k - 1, k - 1)


def _clean(alpha_k: np.ndarray) -> np.ndarray:
    a = np.clip(np.asarray(alpha_k, np.float64), 0.0, None)
    return a / a.sum()


def _dedupe(points: np.ndarray, existing: np.ndarray | None = None, tol: float = 1e-9) -> np.ndarray:
    seen = set() if existing is None else {tuple(np.round(p / tol).astype(np.int64)) for p in existing}
    keep = []
    for i, p in enumerate(points):
        key = tuple(np.round(p / tol).astype(np.int64))
        if key not in seen:
            seen.add(key)
            keep.append(i)
    return points[keep]


def _maximin_pick(pool: np.ndarray, chosen: np.ndarray, count: int) -> np.ndarray:
    """Greedily pick ``count`` rows of ``pool`` each farthest (L1) from everything chosen so far."""
    if count <= 0 or len(pool) == 0:
        return pool[:0]
    if len(chosen):
        dmin = np.abs(pool[:, None, :] - chosen[None, :, :]).sum(-1).min(1)
    else:
        dmin = np.full(len(pool), np.inf)
    picked = []
    for _ in range(min(count, len(pool))):
        j = int(np.argmax(dmin))  # first index among ties: deterministic
        picked.append(j)
        dmin = np.minimum(dmin, np.abs(pool - pool[j]).sum(-1))
        dmin[j] = -np.inf
    return pool[picked]


def seed_design(domains: Sequence[str], n: int = 40, seed: int = 0) -> np.ndarray:
    """The ``n`` seed mixtures [n, K], rows on the simplex in the order of ``domains``.

    The paper says "a coarse grid plus priors" and no more; here, in priority order (duplicates
    dropped, each group taken whole while it fits, otherwise its most spread-out members by greedy
    maximin L1 distance to what is already chosen):

    1. the uniform mixture (the usual default, and the centre of the simplex);
    2. the vertices ``e_k`` (each expert alone: anchors each domain's effect);
    3. leave-one-out uniforms (``1/(K-1)`` on all domains but one: what dropping a domain costs);
    4. pairwise midpoints ``(e_i + e_j) / 2``;
    5. the coarse lattice of step ``1/4`` (where it has at most ``SEED_POOL`` points);
    6. Dirichlet(1) draws (uniform on the simplex), picked greedily maximin from a pool of
       ``SEED_POOL`` draws, to fill up to ``n`` (space filling rather than clumped random points).

    For K = 4 and n = 40: 1 + 4 + 4 + 6 = 15 priors, 20 of the remaining 20 lattice points, 5
    Dirichlet fills. Deterministic by ``seed`` (only group 6 is random).
    """
    domains = _check_domains(domains)
    n = _check_int("n", n, 1)
    k = len(domains)
    eye = np.eye(k)
    groups = [np.full((1, k), 1.0 / k), eye,
              (1.0 - eye) / (k - 1),
              np.asarray([(eye[i] + eye[j]) / 2 for i, j in itertools.combinations(range(k), 2)])]
    if _lattice_size(k, SEED_LATTICE) <= SEED_POOL:
        groups.append(simplex_lattice(k, SEED_LATTICE))
    chosen = np.zeros((0, k))
    for g in groups:
        if len(chosen) >= n:
            break
        g = _dedupe(g, chosen)
        room = n - len(chosen)
        take = g if len(g) <= room else _maximin_pick(g, chosen, room)
        chosen = np.concatenate([chosen, take])
    if len(chosen) < n:
        rng = np.random.default_rng(seed)
        pool = rng.dirichlet(np.ones(k), size=SEED_POOL)
        chosen = np.concatenate([chosen, _maximin_pick(pool, chosen, n - len(chosen))])
    return chosen[:n]


def fine_candidates(k: int, rng: np.random.Generator) -> np.ndarray:
    """The fine search set: ``N_DIRICHLET`` Dirichlet(1) draws + the lattice of step 1/FINE_LATTICE (coarser
    while it would exceed ``MAX_LATTICE`` points; left out when even step 1/2 is too many)."""
    parts = [rng.dirichlet(np.ones(k), size=N_DIRICHLET)]
    h = FINE_LATTICE
    while h > 2 and _lattice_size(k, h) > MAX_LATTICE:
        h //= 2
    if _lattice_size(k, h) <= MAX_LATTICE:
        parts.append(simplex_lattice(k, h))
    return np.concatenate(parts)


def local_candidates(centres_ck: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``N_LOCAL`` draws around each centre: Dirichlet(LOCAL_CONCENTRATION * c + 0.05), a cloud of L1
    radius ~0.05-0.1 that still reaches the faces of the simplex (the +0.05 lets zeros move)."""
    return np.concatenate([rng.dirichlet(LOCAL_CONCENTRATION * np.asarray(c) + 0.05, size=N_LOCAL) for c in centres_ck])


# --------------------------------------------------------------------------------------------------
# Result
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class SearchResult:
    """A finished search. ``best_alpha``/``best_score``/``best_metrics`` are the best *evaluated* point.

    ``trace``: one dict per evaluation, in order: ``alpha`` (list, order of ``domains``), ``metrics``
    (what the evaluator returned), ``score`` (objective, frozen normaliser), ``phase`` (``seed`` |
    ``verify`` | ``cmaes``), ``predicted`` (the regressors' predicted score for verify points, else
    None), ``predicted_terms`` ({term: predicted normalised value} for verify points, else None: how
    well each regressor predicted), ``round`` (verification round or CMA-ES generation; 0 for seeds).
    """

    method: str
    domains: tuple[str, ...]
    best_alpha: np.ndarray
    best_score: float
    best_metrics: dict[str, float]
    trace: list[dict[str, Any]]
    objective: Objective
    settings: dict[str, Any]

    @property
    def evaluations(self) -> int:
        return len(self.trace)

    def mixture(self) -> dict[str, float]:
        """The best alpha as {domain: weight} (the mixture ratio)."""
        return dict(zip(self.domains, (float(a) for a in self.best_alpha)))

    def best_so_far(self, objective: Objective | None = None) -> list[float]:
        """Best score after each evaluation (rescored with ``objective`` if given)."""
        scores = [t["score"] if objective is None else objective.score(t["metrics"]) for t in self.trace]
        return np.maximum.accumulate(np.asarray(scores, np.float64)).tolist()

    def rescore(self, objective: Objective) -> SearchResult:
        """The same evaluations scored with another (calibrated) objective, best re-chosen: compare two
        searches only in one objective's units (each search calibrates its own normaliser)."""
        trace = [{**t, "score": objective.score(t["metrics"])} for t in self.trace]
        return _result(self.method, self.domains, trace, objective,
                       {k: v for k, v in self.settings.items() if k != "best_index"})

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.method, "domains": list(self.domains),
                "best": {"alpha": [float(a) for a in self.best_alpha], "mixture": self.mixture(),
                         "score": float(self.best_score), "metrics": dict(self.best_metrics)},
                "objective": self.objective.to_dict(), "settings": dict(self.settings),
                "evaluations": self.evaluations, "trace": self.trace}

    def to_json(self, indent: int | None = 1) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_json(cls, text: str) -> SearchResult:
        d = json.loads(text)
        return cls(method=d["method"], domains=tuple(d["domains"]), best_alpha=np.asarray(d["best"]["alpha"], np.float64),
                   best_score=float(d["best"]["score"]), best_metrics=dict(d["best"]["metrics"]), trace=list(d["trace"]),
                   objective=Objective.from_dict(d["objective"]), settings=dict(d["settings"]))


def _entry(alpha, metrics, score, phase, predicted, rnd, predicted_terms=None) -> dict[str, Any]:
    numeric = {k: float(v) for k, v in metrics.items()
               if isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)}
    return {"alpha": [float(a) for a in alpha], "metrics": numeric,
            "score": float(score), "phase": phase, "predicted": None if predicted is None else float(predicted),
            "predicted_terms": None if predicted_terms is None else {k: float(v) for k, v in predicted_terms.items()},
            "round": int(rnd)}


def _result(method, domains, trace, objective, settings) -> SearchResult:
    best = max(range(len(trace)), key=lambda i: (trace[i]["score"], -i))  # first among equal scores
    t = trace[best]
    return SearchResult(method, domains, np.asarray(t["alpha"]), t["score"], dict(t["metrics"]), trace, objective,
                        {**settings, "best_index": best})


def _evaluate_all(evaluate: Evaluator, alpha_nk: Sequence[np.ndarray], objective: Objective) -> list[dict[str, float]]:
    """Metrics of each alpha, in order, each checked for the objective's terms. An evaluator with an
    ``evaluate_many(alpha_nk) -> [metrics]`` method gets all of them in one request (it may score
    several merges per compiled call); any other is called alpha by alpha, so a missing term stops
    the search at the first evaluation that lacks it."""
    many = getattr(evaluate, "evaluate_many", None)
    if many is None:
        out = []
        for a in alpha_nk:
            out.append(dict(evaluate(a.copy())))
            objective.check(out[-1], a)
        return out
    out = [dict(m) for m in many(np.array(alpha_nk, np.float64))]
    if len(out) != len(alpha_nk):
        raise SearchError(f"evaluate_many returned {len(out)} results for {len(alpha_nk)} alphas.")
    for a, m in zip(alpha_nk, out):
        objective.check(m, a)
    return out


def _preflight(domains, budget, objective, seed) -> tuple[tuple[str, ...], int, Objective, int]:
    domains = _check_domains(domains)
    budget = _check_int("budget", budget, 1)
    seed = _check_int("seed", seed, 0)
    if objective is None:
        objective = Objective()
    if not isinstance(objective, Objective):
        raise SearchError(f"objective must be a data_mixture.mergemix.search.Objective; got {type(objective).__name__}.")
    return domains, budget, objective, seed


# --------------------------------------------------------------------------------------------------
# MergeMix: seeds -> regressors -> fine search -> verification
# --------------------------------------------------------------------------------------------------


def fit_regressors(alpha_nk: np.ndarray, targets: Mapping[str, np.ndarray], seed: int) -> dict[str, Any]:
    """One LightGBM booster per term, alpha -> normalised term (``LGBM_PARAMS``, ``NUM_ROUNDS``)."""
    import lightgbm as lgb

    boosters = {}
    params = {**LGBM_PARAMS, "seed": int(seed)}
    for key, y in targets.items():
        ds = lgb.Dataset(alpha_nk, np.asarray(y, np.float64), free_raw_data=True, params={"verbose": -1, "min_data_in_bin": 1})
        boosters[key] = lgb.train(params, ds, num_boost_round=NUM_ROUNDS)
    return boosters


def predict_score(boosters: Mapping[str, Any], objective: Objective, alpha_nk: np.ndarray) -> np.ndarray:
    return objective.combine({k: b.predict(alpha_nk, num_threads=1) for k, b in boosters.items()})


def _pick_distinct(cand_nk, pred_n, evaluated_nk, count) -> tuple[np.ndarray, np.ndarray]:
    """Best predicted candidates, pairwise and from evaluated points at least MIN_SEPARATION (L1) apart."""
    order = np.argsort(-pred_n, kind="stable")
    sep = MIN_SEPARATION
    while True:
        picks: list[int] = []
        ref = list(evaluated_nk)
        for j in order:
            c = cand_nk[j]
            if ref and np.abs(np.asarray(ref) - c).sum(-1).min() < sep:
                continue
            picks.append(int(j))
            ref.append(c)
            if len(picks) == count:
                break
        if len(picks) == count or sep < 1e-6:
            return cand_nk[picks], pred_n[picks]
        sep /= 2


def mergemix_search(evaluate: Evaluator, domains: Sequence[str], *, budget: int, objective: Objective | None = None,
                    seed: int = 0, n_seeds: int = 40, n_verify: int | None = None, verify_per_round: int = 5,
                    seeds: np.ndarray | None = None) -> SearchResult:
    """The paper's search (module docstring): ``n_seeds`` seed merges, then ``n_verify`` (default: the rest
    of ``budget``) verification merges in rounds of ``verify_per_round``, refitting after each round.

    ``seeds`` overrides :func:`seed_design` (rows on the simplex, order of ``domains``). Every input is
    checked before the first evaluation; an evaluator's metrics missing an objective term stop the
    search at that evaluation with the key named.
    """
    domains, budget, objective, seed = _preflight(domains, budget, objective, seed)
    k = len(domains)
    n_seeds = _check_int("n_seeds", n_seeds, 2)
    verify_per_round = _check_int("verify_per_round", verify_per_round, 1)
    if budget < n_seeds:
        raise SearchError(f"budget={budget} merges is smaller than the seed design (n_seeds={n_seeds}); allowed: "
                          f"budget >= n_seeds (raise the budget to at least {n_seeds} plus verification merges, or lower n_seeds).")
    if n_verify is None:
        n_verify = budget - n_seeds
    n_verify = _check_int("n_verify", n_verify, 0)
    if n_seeds + n_verify > budget:
        raise SearchError(f"n_seeds={n_seeds} + n_verify={n_verify} = {n_seeds + n_verify} merges exceeds budget={budget}.")
    if seeds is None:
        seed_nk = seed_design(domains, n_seeds, seed)
    else:
        seed_nk = np.asarray(seeds, np.float64)
        if seed_nk.shape != (n_seeds, k):
            raise SearchError(f"seeds has shape {seed_nk.shape}; expected (n_seeds={n_seeds}, K={k}).")
        bad = np.where(~np.isfinite(seed_nk).all(1) | (seed_nk < 0).any(1) | (np.abs(seed_nk.sum(1) - 1) > 1e-6))[0]
        if len(bad):
            raise SearchError(f"seeds row {int(bad[0])} = {seed_nk[bad[0]].tolist()} is off the simplex (finite, >= 0, sum 1).")
    rng = np.random.default_rng(seed)

    seed_metrics = _evaluate_all(evaluate, [_clean(a) for a in seed_nk], objective)
    if not objective.calibrated:
        objective = objective.calibrate(seed_metrics)
    trace = [_entry(_clean(a), m, objective.score(m), "seed", None, 0) for a, m in zip(seed_nk, seed_metrics)]

    rounds, spent = 0, 0
    while spent < n_verify:
        rounds += 1
        alpha_nk = np.asarray([t["alpha"] for t in trace])
        normed = [objective.normalised_terms(t["metrics"]) for t in trace]
        targets = {key: np.array([n[key] for n in normed]) for key in objective.terms()}
        boosters = fit_regressors(alpha_nk, targets, seed + rounds)
        scores = np.array([t["score"] for t in trace])
        top_eval = alpha_nk[np.argsort(-scores, kind="stable")[:3]]
        coarse = fine_candidates(k, rng)
        coarse_pred = predict_score(boosters, objective, coarse)
        top_pred = coarse[np.argsort(-coarse_pred, kind="stable")[:3]]
        local = local_candidates(np.concatenate([top_eval, top_pred]), rng)
        cand = np.concatenate([coarse, local])
        pred = np.concatenate([coarse_pred, predict_score(boosters, objective, local)])
        count = min(verify_per_round, n_verify - spent)
        picks, picks_pred = _pick_distinct(cand, pred, alpha_nk, count)
        if not len(picks):
            raise RuntimeError("internal error: no candidate is distinct from the evaluated points")
        picks_terms = {key: b.predict(picks, num_threads=1) for key, b in boosters.items()}
        picks = [_clean(a) for a in picks]
        for i, (a, p, m) in enumerate(zip(picks, picks_pred, _evaluate_all(evaluate, picks, objective))):
            trace.append(_entry(a, m, objective.score(m), "verify", p, rounds, {key: v[i] for key, v in picks_terms.items()}))
        spent += len(picks)
    settings = {"budget": budget, "seed": seed, "n_seeds": n_seeds, "n_verify": n_verify,
                "verify_per_round": verify_per_round, "verify_rounds": rounds, "lgbm_params": dict(LGBM_PARAMS),
                "lgbm_seed": "seed + verification round",
                "num_rounds": NUM_ROUNDS, "candidates": {"dirichlet": N_DIRICHLET, "fine_lattice": FINE_LATTICE,
                                                         "local_per_centre": N_LOCAL, "local_centres": 6,
                                                         "min_separation_l1": MIN_SEPARATION}}
    return _result("mergemix", domains, trace, objective, settings)


# --------------------------------------------------------------------------------------------------
# CMA-ES on softmax logits
# --------------------------------------------------------------------------------------------------


def softmax(z_k: np.ndarray) -> np.ndarray:
    z = np.asarray(z_k, np.float64)
    e = np.exp(z - z.max())
    return e / e.sum()


@contextlib.contextmanager
def _private_global_rng(box: list):
    """pycma draws from numpy's *global* RNG: swap in this search's own state around each call, so neither
    the caller's global RNG nor an evaluator that uses it can change (or be changed by) the search."""
    outer = np.random.get_state()
    np.random.set_state(box[0])
    try:
        yield
    finally:
        box[0] = np.random.get_state()
        np.random.set_state(outer)


def cmaes_search(evaluate: Evaluator, domains: Sequence[str], *, budget: int, objective: Objective | None = None,
                 seed: int = 0, sigma0: float = 1.0, popsize: int | None = None) -> SearchResult:
    """CMA-ES (pycma) over K logits, ``alpha = softmax(z)``, ``budget`` evaluations (module docstring)."""
    import cma

    domains, budget, objective, seed = _preflight(domains, budget, objective, seed)
    k = len(domains)
    if not (isinstance(sigma0, (int, float)) and math.isfinite(sigma0) and sigma0 > 0):
        raise SearchError(f"sigma0={sigma0!r}; allowed: a step size > 0 in logit units.")
    if popsize is not None:
        popsize = _check_int("popsize", popsize, 2)
    opts = {"seed": seed + 1,  # pycma treats seed 0 as "from the clock"
            "verbose": -9, "maxfevals": budget, "tolfun": 0, "tolx": 0, "tolfunhist": 0, "tolstagnation": 10**9}
    if popsize is not None:
        opts["popsize"] = popsize
    box = [np.random.RandomState(seed + 1).get_state()]
    with _private_global_rng(box):
        es = cma.CMAEvolutionStrategy(np.zeros(k), float(sigma0), opts)
    trace: list[dict[str, Any]] = []
    gen = 0
    while len(trace) < budget:
        gen += 1
        with _private_global_rng(box):
            zs = es.ask()
        take = zs[: budget - len(trace)]
        alphas = [softmax(z) for z in take]
        evals = list(zip(alphas, _evaluate_all(evaluate, alphas, objective)))
        if not objective.calibrated:  # the first generation plays the seed design's part
            objective = objective.calibrate([m for _, m in evals])
        scores = [objective.score(m) for _, m in evals]
        trace += [_entry(a, m, s, "cmaes", None, gen) for (a, m), s in zip(evals, scores)]
        if len(take) == len(zs):
            with _private_global_rng(box):
                es.tell(zs, [-s for s in scores])
    settings = {"budget": budget, "seed": seed, "sigma0": float(sigma0), "popsize": int(es.popsize),
                "generations": gen, "parametrisation": "alpha = softmax(z), K logits, z0 = 0 (uniform)",
                "cma_version": cma.__version__}
    return _result("cmaes", domains, trace, objective, settings)


# --------------------------------------------------------------------------------------------------
# Comparison
# --------------------------------------------------------------------------------------------------


def compare_searches(evaluate: Evaluator, domains: Sequence[str], *, budget: int, objective: Objective | None = None,
                     seed: int = 0, n_seeds: int = 40, **mergemix_kwargs) -> dict[str, Any]:
    """Run both searches with the same budget and report best score vs evaluations spent.

    Each search runs as a user would run it (its own normaliser). For the comparison, both traces are
    rescored with one common objective: ``objective`` calibrated on the MergeMix seed design's
    evaluations (or ``objective`` itself if already calibrated), so the curves share units. Returns
    ``{"objective": dict, "curves": {method: [best-so-far per evaluation]}, "final": {method: {...}},
    "results": {method: SearchResult}}``. With a caching evaluator, repeated alphas cost nothing the
    second time but still count as an evaluation here.
    """
    objective = objective or Objective()
    res_m = mergemix_search(evaluate, domains, budget=budget, objective=objective, seed=seed, n_seeds=n_seeds, **mergemix_kwargs)
    res_c = cmaes_search(evaluate, domains, budget=budget, objective=objective, seed=seed)
    common = objective if objective.calibrated else objective.calibrate(
        [t["metrics"] for t in res_m.trace if t["phase"] == "seed"])
    out: dict[str, Any] = {"objective": common.to_dict(), "curves": {}, "final": {}, "results": {}}
    for res in (res_m, res_c):
        same_units = res.rescore(common)
        out["curves"][res.method] = same_units.best_so_far()
        out["final"][res.method] = {"evaluations": res.evaluations, "best_score": float(same_units.best_score),
                                    "best_alpha": same_units.best_alpha.tolist(),
                                    "best_index": same_units.settings["best_index"]}
        out["results"][res.method] = res
    return out
