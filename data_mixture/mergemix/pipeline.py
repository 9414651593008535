"""``python -m data_mixture mergemix``: experts -> merges -> alpha search -> mixture JSON, end to end.

Stages, each resumable (rerunning the same command continues where it stopped; an ``--out`` that
already holds something other than a mergemix output is refused, before any training):

1. **experts** (:mod:`.experts`): one expert per domain, trained from the base for
   ``expert_tokens`` at a constant learning rate, through the sweep runner (``--backend local``
   or ``ray``), checkpoints kept at every fraction of ``fractions``; ``OUT/experts/``.
2. **merges** (:mod:`.merge`): the experts' checkpoint at ``expert_fraction`` of their budget and
   the base, merged on device; every evaluation cached in ``OUT/cache.jsonl`` (a rerun never
   recomputes one).
3. **search** (:mod:`.search`) of the objective (default: the macro-average of normalised
   benchmark scores, each the task's accuracy or, with ``bench_metric="gold_logprob"``, its mean
   gold log-probability; with only ``loss_weights`` the benchmarks are not run at all, so a merge
   costs only its held-out losses): ``mergemix`` (the paper's seed design -> per-task regressors ->
   fine simplex search -> verification merges), ``cmaes`` (direct search), or ``both`` (same
   budget each, compared per merge evaluated); the router treatment of every merge is ``router``
   (``linear``: the paper's, ``base``: the base's router kept, ``harc``: calibrated, see
   :mod:`.routing`).
4. **outputs**: ``OUT/mixture.json`` (``{"weights": ...}``, what ``launch.sh
   --config.data.mixture_file`` and the law tools read), ``OUT/search_<method>.json`` (every
   merge evaluated: alpha, metrics, score, phase), ``OUT/search.png`` (best score against merges
   evaluated), ``OUT/surface.png`` (the objective over pairs of domains), ``OUT/cost.json``
   (FLOPs, :mod:`.cost`) and ``OUT/summary.json``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import time
from pathlib import Path
from typing import Any

import numpy as np

from data_mixture.mergemix.experts import MergeMixError
from data_mixture.mergemix.objective import BENCH_METRICS
from data_mixture.user_files import check_resumable_dir


@dataclasses.dataclass(frozen=True)
class Options:
    base: str  # base workdir
    domains: tuple[str, ...]
    expert_tokens: int
    out: str
    step: int | None = None  # base checkpoint (default: its latest)
    fractions: tuple[float, ...] = (0.125, 0.25, 0.5, 1.0)  # expert checkpoints kept, as fractions of expert_tokens
    expert_fraction: float = 1.0  # which of them is merged
    router: str = "linear"  # linear | base | harc
    search: str = "mergemix"  # mergemix | cmaes | both
    budget: int = 60  # merges evaluated per search
    n_seeds: int = 40  # the seed design of the mergemix search
    task_weights: dict[str, float] | None = None
    min_weight: dict[str, float] = dataclasses.field(default_factory=dict)  # per-domain floors of alpha
    loss_weights: dict[str, float] | None = None
    bench_metric: str = "accuracy"  # what bench:<task> is: accuracy | gold_logprob (objective.BENCH_METRICS)
    seed: int = 0
    backend: str = "local"
    parallel: int = 1
    max_items: int = 64
    loss_batches: int = 4
    merges_per_call: int = 8  # merges scored per compiled call (merge.MergeEvaluator; 0: one at a time)
    calib_batches: int = 2  # harc: training-split batches per domain it calibrates on (routing.calibration_batches)
    damping: float = 0.1  # harc: pull towards the linearly merged router (routing.py)
    expert_eval_args: str = "--max-items 8 --loss-batches 1"  # moejax.eval flags for the experts' own checkpoints
    experts_dir: str = ""  # default OUT/experts (a directory of trained experts is reused as is)
    cache: str = ""  # evaluation cache JSONL, default OUT/cache.jsonl
    progress: bool = True


ROUTERS = ("linear", "base", "harc")
# what a mergemix --out holds once it has started: a directory with one of them is resumed
OUT_MARKS = ("experts", "cache.jsonl", "mixture.json", "summary.json")
SEARCHES = ("mergemix", "cmaes", "both")


def check_options(o: Options) -> None:
    """Errors for the flags this module owns, before any training (the experts, merge and search
    modules check theirs)."""
    if o.router not in ROUTERS:
        raise MergeMixError(f"--router {o.router!r} is unknown; allowed: {', '.join(ROUTERS)}")
    if o.bench_metric not in BENCH_METRICS:
        raise MergeMixError(f"--bench-metric {o.bench_metric!r} is unknown; allowed: {', '.join(BENCH_METRICS)} "
                            "(accuracy: each task's accuracy or exact match; gold_logprob: the mean "
                            "log-probability of the gold answer, a continuous score)")
    if o.search not in SEARCHES:
        raise MergeMixError(f"--search {o.search!r} is unknown; allowed: {', '.join(SEARCHES)}")
    if o.expert_fraction not in o.fractions:
        raise MergeMixError(f"--expert-fraction {o.expert_fraction} is not one of the kept checkpoints "
                            f"--fractions {','.join(map(str, o.fractions))}")
    if o.search in ("mergemix", "both") and o.budget < o.n_seeds:
        raise MergeMixError(f"--budget {o.budget} is smaller than the seed design (--seeds {o.n_seeds}): the "
                            f"mergemix search evaluates every seed mixture first; raise --budget or lower --seeds")
    if len(set(o.domains)) != len(o.domains) or len(o.domains) < 2:
        raise MergeMixError(f"--domains {','.join(o.domains)}: give at least two distinct training domains")


def lower_bounded(min_weight: dict[str, float], domains: tuple[str, ...]) -> tuple[np.ndarray, float]:
    """The per-domain floors ``lo_k`` and the free mass ``1 - sum lo``: a search over the whole
    simplex in ``beta`` evaluates ``alpha = lo + (1 - sum lo) beta``, so every alpha it can reach
    has ``alpha_k >= lo_k`` (the same floors the mixture-law optimiser takes as ``--min-weight``)."""
    unknown = sorted(set(min_weight) - set(domains))
    if unknown:
        raise MergeMixError(f"--min-weight names {unknown}, not among --domains {','.join(domains)}")
    lo_k = np.array([float(min_weight.get(d, 0.0)) for d in domains])
    bad = [f"{d}={v}" for d, v in zip(domains, lo_k) if not (np.isfinite(v) and v >= 0)]
    if bad or lo_k.sum() >= 1.0:
        raise MergeMixError(f"--min-weight {', '.join(bad) or lo_k.tolist()}: floors must be >= 0 and sum below 1 "
                            f"(they sum to {lo_k.sum():.3g})")
    return lo_k, 1.0 - float(lo_k.sum())


class MergeProxy:
    """``proxy(alpha) -> metrics``: one merge set, one router treatment, cached evaluations.

    The harc treatment calibrates the router for every new alpha (:func:`.routing.treatment_params`)
    and is cached under ``key_extra = "harc:<damping>"``, so a cached alpha skips the calibration too.
    """

    def __init__(self, merge_set, evaluator, router: str, *, calib_batches=None, damping: float = 0.1):
        self.merge_set, self.evaluator, self.router = merge_set, evaluator, router
        self.calib_batches, self.damping = calib_batches, damping

    def __call__(self, alpha_k) -> dict[str, float]:
        return self.evaluate_many([alpha_k])[0]

    def evaluate_many(self, alpha_nk) -> list[dict[str, float]]:
        """Metrics of each alpha; the linear and base treatments are scored together
        (``MergeEvaluator.evaluate_many``), harc calibrates each alpha first."""
        if self.router != "harc":
            return self.evaluator.evaluate_many(alpha_nk, router=self.router)
        return [self._harc(alpha_k) for alpha_k in alpha_nk]

    def _harc(self, alpha_k) -> dict[str, float]:
        from data_mixture.mergemix.routing import treatment_params

        extra = f"harc:{self.damping:g}"
        if self.evaluator.is_cached(alpha_k, key_extra=extra):
            return self.evaluator.evaluate(alpha_k, key_extra=extra)
        params = treatment_params(self.merge_set, alpha_k, "harc", calib_batches=self.calib_batches,
                                  damping=self.damping)
        return self.evaluator.evaluate(alpha_k, params=params, key_extra=extra)


class Floored:
    """The search's evaluator over ``beta`` on the whole simplex: ``proxy(lo + free * beta)``
    (:func:`lower_bounded`), one beta or many at once."""

    def __init__(self, proxy: MergeProxy, lo_k: np.ndarray, free: float):
        self.proxy, self.lo_k, self.free = proxy, lo_k, free

    def __call__(self, beta_k) -> dict[str, float]:
        return self.evaluate_many([beta_k])[0]

    def evaluate_many(self, beta_nk) -> list[dict[str, float]]:
        return self.proxy.evaluate_many([self.lo_k + self.free * np.asarray(b, np.float64) for b in beta_nk])


def open_merge(base: str, step: int | None, experts_dir: str, domains, fraction: float, *, max_items: int,
               loss_batches: int, cache_path: str | None = None, tasks: list[str] | None = None,
               merges_per_call: int = 8, bench_metric: str = "accuracy"):
    """(merge set, cached evaluator) of the experts' checkpoint at ``fraction`` of their budget;
    ``tasks``: the benchmarks evaluated (default: the base run's built-in ones; [] for losses only);
    ``bench_metric``: what each ``bench:<task>`` is (:data:`.objective.BENCH_METRICS`)."""
    from data_mixture.mergemix import experts as experts_lib
    from data_mixture.mergemix.merge import MergeEvaluator, MergeSet
    from moejax.eval.evaluate import make_settings

    plan = experts_lib.load_plan(experts_dir)
    steps = {e["domain"]: fraction_step(e, fraction) for e in plan["runs"]}
    merge_set = MergeSet.open(base, step, {d: (experts_lib.expert_dir(experts_dir, d), steps[d]) for d in domains})
    settings = make_settings(merge_set.erun, tasks=tasks, max_items=max_items, loss_batches=loss_batches)
    return merge_set, MergeEvaluator(merge_set, settings, cache_path=cache_path, merges_per_call=merges_per_call,
                                     bench_metric=bench_metric)


def fraction_step(entry: dict[str, Any], fraction: float) -> int:
    """The checkpoint step of an expert plan entry at ``fraction`` of its budget (a kept one)."""
    steps = entry["fraction_steps"]
    if repr(float(fraction)) not in steps:
        raise MergeMixError(f"expert fraction {fraction} was not kept; kept: {', '.join(steps)}")
    return int(steps[repr(float(fraction))])


def run(o: Options) -> dict[str, Any]:
    """The whole pipeline (module docstring); returns the summary written to ``OUT/summary.json``."""
    from data_mixture.mergemix import cost, experts as experts_lib, plots
    from data_mixture.mergemix.routing import calibration_batches
    from data_mixture.mergemix.search import Objective, cmaes_search, mergemix_search
    from data_mixture.optimize import write_mixture

    check_options(o)
    check_resumable_dir(o.out, "--out", marks=OUT_MARKS, what="a mergemix output")
    objective = Objective(tasks=o.task_weights, losses=o.loss_weights)
    lo_k, free = lower_bounded(o.min_weight, o.domains)
    plan = experts_lib.plan_experts(o.base, base_step=o.step, domains=o.domains, expert_tokens=o.expert_tokens,
                                    fractions=o.fractions, seed=o.seed)
    out = Path(o.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    experts_dir = o.experts_dir or str(out / "experts")
    experts_lib.train_experts(plan, experts_dir, backend=o.backend, parallel=o.parallel, progress=o.progress,
                              eval_args=shlex.split(o.expert_eval_args))
    seconds = {"experts": time.perf_counter() - t0}
    base_step = plan["mergemix"]["base_step"]
    merge_set, evaluator = open_merge(o.base, base_step, experts_dir, o.domains, o.expert_fraction,
                                      max_items=o.max_items, loss_batches=o.loss_batches,
                                      cache_path=o.cache or str(out / "cache.jsonl"),
                                      tasks=[] if o.loss_weights and not o.task_weights else None,
                                      merges_per_call=o.merges_per_call, bench_metric=o.bench_metric)
    calib = (calibration_batches(merge_set.erun, list(o.domains), batches_per_domain=o.calib_batches)
             if o.router == "harc" else None)
    proxy = MergeProxy(merge_set, evaluator, o.router, calib_batches=calib, damping=o.damping)
    evaluate = Floored(proxy, lo_k, free)

    results = {}
    for method in (("mergemix", "cmaes") if o.search == "both" else (o.search,)):
        t0 = time.perf_counter()
        if method == "mergemix":
            res = mergemix_search(evaluate, o.domains, budget=o.budget, objective=objective, seed=o.seed,
                                  n_seeds=o.n_seeds)
        else:
            res = cmaes_search(evaluate, o.domains, budget=o.budget, objective=objective, seed=o.seed)
        seconds[f"search_{method}"] = time.perf_counter() - t0
        for entry in res.trace:  # the search ran over beta; record the merge weights too
            entry["merge_alpha"] = (lo_k + free * np.asarray(entry["alpha"])).tolist()
        results[method] = res
    # one objective's units for every search: the mergemix search's (calibrated on its seed design)
    common = plots.common_objective(results)
    results = {m: r.rescore(common) for m, r in results.items()}
    for method, res in results.items():
        (out / f"search_{method}.json").write_text(res.to_json())
    best_method = max(results, key=lambda m: results[m].best_score)
    best = results[best_method]
    alpha_k = lo_k + free * best.best_alpha
    mixture = {d: float(a) for d, a in zip(o.domains, alpha_k)}
    write_mixture({"weights": mixture, "method": f"mergemix:{best_method}", "router": o.router,
                   "objective": best.objective.to_dict(), "bench_metric": o.bench_metric, "score": best.best_score, "metrics": best.best_metrics,
                   "base": os.path.abspath(o.base), "base_step": base_step, "expert_fraction": o.expert_fraction,
                   "min_weight": dict(zip(o.domains, lo_k.tolist()))}, out / "mixture.json")
    erun = merge_set.erun
    from moejax.model.transformer import param_counts

    n_active = float(param_counts(erun.cfg.model)["active"])
    expert_tokens = plan["runs"][0]["tokens_per_step"] * fraction_step(plan["runs"][0], o.expert_fraction)
    # distinct merges the searches needed (some may have come from a cache filled earlier)
    merges = len({tuple(np.round(t["merge_alpha"], 9)) for r in results.values() for t in r.trace})
    eval_tokens = float(np.nanmean([t["metrics"].get("eval_tokens", np.nan) for r in results.values() for t in r.trace]))
    flops = cost.mergemix_cost(params_active=n_active, base_tokens=base_tokens(erun, base_step),
                               expert_tokens=expert_tokens, num_experts=len(o.domains),
                               merges=merges, eval_tokens_per_merge=eval_tokens)
    flops.update(merges_evaluated=merges, eval_tokens_per_merge=eval_tokens,
                 expert_tokens=expert_tokens, params_active=n_active)
    summary = {"mixture": mixture, "best_method": best_method, "router": o.router,
               "searches": {m: {"best_score": r.best_score, "best_mixture": dict(zip(o.domains, (lo_k + free * r.best_alpha).tolist())),
                                "evaluations": r.evaluations} for m, r in results.items()},
               "merges_evaluated": evaluator.merges_evaluated, "cache_hits": evaluator.cache_hits,
               "flops": flops, "seconds": seconds, "options": dataclasses.asdict(o)}
    (out / "cost.json").write_text(json.dumps(flops, indent=1))
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=list))
    plots.search_curves(results, out / "search.png")
    plots.surface(results.get("mergemix", best), out / "surface.png", lo_k=lo_k, free=free)
    return summary


def base_tokens(erun, step: int) -> float:
    """Training tokens the base saw up to ``step`` (its batch x sequence per step)."""
    return float(step * erun.cfg.train.global_batch_size * erun.cfg.train.seq_len)
