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

The objective (how an evaluation's metrics become one score, normalised over the seed design) is
:mod:`.objective`; the seed design and the candidate sets on the simplex are :mod:`.design`. Their
names are importable from here too. Measured behaviour of both searches on a synthetic surface:
docs/mergemix.md.

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
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from data_mixture.mergemix.design import (
    FINE_LATTICE,
    LOCAL_CONCENTRATION,
    MAX_LATTICE,
    N_DIRICHLET,
    N_LOCAL,
    SEED_LATTICE,
    SEED_POOL,
    check_domains,
    check_int,
    clip_to_simplex,
    fine_candidates,
    local_candidates,
    seed_design,
    simplex_lattice,
)
from data_mixture.mergemix.objective import NORMALISATIONS, Objective, SearchError

__all__ = [  # the searches, and (re-exported) the names of the objective and the design
    "FINE_LATTICE", "LGBM_PARAMS", "LOCAL_CONCENTRATION", "MAX_LATTICE", "MIN_SEPARATION", "NORMALISATIONS",
    "NUM_ROUNDS", "N_DIRICHLET", "N_LOCAL", "PHASES", "SEED_LATTICE", "SEED_POOL", "Evaluator", "Objective",
    "SearchError", "SearchResult", "cmaes_search", "compare_searches", "fine_candidates", "fit_regressors",
    "local_candidates", "mergemix_search", "predict_score", "seed_design", "simplex_lattice", "softmax",
]

Evaluator = Callable[[np.ndarray], Mapping[str, float]]

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

MIN_SEPARATION = 0.05


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
    domains = check_domains(domains)
    budget = check_int("budget", budget, 1)
    seed = check_int("seed", seed, 0)
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
    n_seeds = check_int("n_seeds", n_seeds, 2)
    verify_per_round = check_int("verify_per_round", verify_per_round, 1)
    if budget < n_seeds:
        raise SearchError(f"budget={budget} merges is smaller than the seed design (n_seeds={n_seeds}); allowed: "
                          f"budget >= n_seeds (raise the budget to at least {n_seeds} plus verification merges, or lower n_seeds).")
    if n_verify is None:
        n_verify = budget - n_seeds
    n_verify = check_int("n_verify", n_verify, 0)
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

    seed_metrics = _evaluate_all(evaluate, [clip_to_simplex(a) for a in seed_nk], objective)
    if not objective.calibrated:
        objective = objective.calibrate(seed_metrics)
    trace = [_entry(clip_to_simplex(a), m, objective.score(m), "seed", None, 0) for a, m in zip(seed_nk, seed_metrics)]

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
        picks = [clip_to_simplex(a) for a in picks]
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
        popsize = check_int("popsize", popsize, 2)
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
