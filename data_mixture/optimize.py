"""The best training mixture at a target (size, tokens), under constraints, from a fitted law.

Objective (``objective=``):

- ``"loss"``: minimise ``sum_v a_v L_v(N, D, w)``, the predicted validation losses weighted by
  ``loss_weights`` (default: equal weights over the fit's validation domains, normalised to 1);
- ``"bench"``: maximise ``sum_t b_t acc_t(L(N, D, w))``, the predicted benchmark accuracies of
  the fit's loss-to-benchmark laws weighted by ``task_weights`` (default: equal, normalised).

Feasible set: the simplex ``sum_m w_m = 1`` intersected with the box ``lo_m <= w_m <= hi_m``,
where ``lo_m`` is the domain's minimum weight (default 0) and
``hi_m = min(max_weight_m, available_tokens_m x max_epochs / D)`` (default 1): the **repetition
cap** says a domain may be repeated at most ``max_epochs`` times, so its share of the D target
tokens is at most its available tokens times ``max_epochs`` over D. All constraints are linear,
so infeasibility is decided exactly before any optimisation (:func:`feasible_bounds`): a
domain whose minimum exceeds its cap, minimums summing to more than 1, or caps summing to less
than 1, each with an error naming the domains and the numbers.

Search (``optimize``), the same for every law so that a non-smooth regressor (RegMix's LightGBM)
is handled too:

1. 4,096 feasible candidates (Dirichlet(1) draws, the centre, and the box vertices' neighbours,
   each projected exactly onto the feasible set) evaluated in one batched prediction;
2. the ``starts`` best are refined with scipy SLSQP (bounds + the equality constraint), with
   gradients from batched forward differences (one prediction of M + 1 rows per gradient: laws
   are arbitrary callables, LightGBM has no gradient);
3. every refined point is projected back onto the feasible set (Euclidean projection by
   bisection, residual put on a coordinate strictly inside its bounds), re-evaluated, and the best
   of candidates and refined points wins. The returned weights satisfy every bound exactly and
   sum to 1 within 1e-12 (checked; an internal error otherwise).

Uncertainty: the point fit gives the optimum; with a bootstrapped fit, the optimisation is
repeated for every bootstrap member (fewer candidates and starts), which gives the spread of the
optimal weights themselves: ``bootstrap.weights[d]`` holds, per training domain, the mean, sd
and the central ``interval`` (``lo``, ``hi``: the (1 - interval)/2 and (1 + interval)/2
quantiles) of the members' optimal weights, and ``bootstrap.optima`` every member's optimum.
Predicted losses/accuracies at the optimum get intervals from the members' predictions at it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Callable

import numpy as np
from scipy.optimize import minimize

from data_mixture.simplex import check_feasible, project
from moejax.errors import UserError

FD_STEP = 1e-5
CANDIDATES = 4096
BOOT_CANDIDATES = 512
BOOT_STARTS = 2


class OptimizeError(UserError):
    """Infeasible or malformed constraints/objective; names the domain, flag and numbers."""


@dataclasses.dataclass
class Constraints:
    """Per-domain bounds and the repetition cap (see the module docstring)."""

    min_weight: Mapping[str, float] = dataclasses.field(default_factory=dict)
    max_weight: Mapping[str, float] = dataclasses.field(default_factory=dict)
    available_tokens: Mapping[str, float] | None = None  # domains not listed are not capped
    max_epochs: float = 1.0
    # Per-domain epoch caps {domain: E}: share x D <= U_d x E with U_d the domain's unique tokens
    # (``pools``, else ``available_tokens``); a domain named here needs one of them.
    domain_epochs: Mapping[str, float] = dataclasses.field(default_factory=dict)
    pools: Mapping[str, float] = dataclasses.field(default_factory=dict)  # unique tokens per domain


def available_tokens(*, explicit: Mapping[str, float] | None = None, dataset: str | None = None,
                     cache_dir: str = "", domains: Sequence[str] | None = None) -> dict[str, float]:
    """Training tokens per domain: explicit values, a prepared dataset's ``dataset.json``
    (``train_tokens`` per domain) or the built-in corpus manifest (``dataset='builtin'``, built on
    first use); explicit values override the dataset's.

    ``domains``: the fit's training domains. When given, they are checked before anything is read
    or built: ``--available`` may name only them, and the dataset must hold every one of them that
    ``--available`` does not give (a dataset without a domain of the fit could not train the
    mixture, and the domain would silently get no repetition cap). A dataset may hold more.
    """
    explicit = dict(explicit or {})
    if domains is not None:
        unknown = sorted(set(explicit) - set(domains))
        if unknown:
            raise OptimizeError(f"--available names domain(s) {', '.join(unknown)} that the fit does not train on; "
                                f"its training domains: {', '.join(domains)}.")
    out: dict[str, float] = {}
    if dataset is not None:
        out = _dataset_tokens(dataset, cache_dir, domains, explicit)
    for d, v in explicit.items():
        if not (math.isfinite(v) and v > 0):
            raise OptimizeError(f"available tokens for {d!r} is {v!r}; allowed: a finite number > 0.")
        out[d] = float(v)
    return out


def _dataset_tokens(dataset: str, cache_dir: str, domains: Sequence[str] | None,
                    explicit: Mapping[str, float]) -> dict[str, float]:
    """Training tokens per domain of ``--dataset`` (the fit's ``domains`` checked against it first)."""
    if dataset in ("builtin", ""):
        from moejax.data.corpus import DOMAINS, load_tokenized_corpus

        _check_dataset_domains("builtin", DOMAINS, domains, explicit)
        manifest = load_tokenized_corpus(0, cache_dir or None).manifest
        return {d: float(v["train"]["tokens"]) for d, v in manifest["domains"].items()}
    path = Path(dataset) / "dataset.json"
    if not path.is_file():
        raise OptimizeError(f"--dataset {dataset!r}: no dataset.json there; give a directory written by "
                            "python -m moejax.data.prepare, or 'builtin' for the built-in corpus.")
    try:
        listed = json.loads(path.read_text(encoding="utf-8")).get("domains", {})
        found = {d: float(v["train_tokens"]) for d, v in listed.items()}
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise OptimizeError(f"--dataset {dataset!r}: {path} is not a readable dataset description ({e}); prepare "
                            "the dataset again with python -m moejax.data.prepare.") from None
    _check_dataset_domains(dataset, tuple(found), domains, explicit)
    return found


def _check_dataset_domains(dataset: str, have: Sequence[str], domains: Sequence[str] | None,
                           explicit: Mapping[str, float]) -> None:
    if domains is None:
        return
    missing = [d for d in domains if d not in have and d not in explicit]
    if missing:
        raise OptimizeError(
            f"--dataset {dataset} has domains {', '.join(have) or '(none)'}, but the fit trains on "
            f"{', '.join(domains)}: {', '.join(missing)} not in the dataset, so the mixture could not be trained on it "
            "and would get no repetition cap there. Give the dataset the fit's runs trained on, or those domains' "
            f"tokens with --available {missing[0]}=TOKENS.")


def feasible_bounds(domains: Sequence[str], constraints: Constraints, tokens: float) -> tuple[np.ndarray, np.ndarray, dict]:
    """(lo_m, hi_m, notes) for the feasible box; raises OptimizeError naming what is infeasible."""
    c = constraints
    known = set(domains)
    for flag, mapping in (("--min-weight", c.min_weight), ("--max-weight", c.max_weight),
                          ("--available", c.available_tokens or {})):
        unknown = sorted(set(mapping) - known)
        if unknown and flag != "--available":
            raise OptimizeError(f"{flag} names domain(s) {', '.join(unknown)} that the fit does not train on; "
                                f"its training domains: {', '.join(domains)}.")
    if not (math.isfinite(c.max_epochs) and c.max_epochs > 0):
        raise OptimizeError(f"--max-epochs is {c.max_epochs!r}; allowed: a number > 0.")
    if not (math.isfinite(tokens) and tokens > 0):
        raise OptimizeError(f"target tokens is {tokens!r}; allowed: a number > 0.")
    lo = np.array([float(c.min_weight.get(d, 0.0)) for d in domains])
    hi = np.array([float(c.max_weight.get(d, 1.0)) for d in domains])
    for d, a, b in zip(domains, lo, hi):
        if not 0.0 <= a <= 1.0:
            raise OptimizeError(f"--min-weight {d}={a:g}: allowed: a share in [0, 1].")
        if not 0.0 <= b <= 1.0:
            raise OptimizeError(f"--max-weight {d}={b:g}: allowed: a share in [0, 1].")
    cap = np.ones(len(domains))
    caps: dict[str, float] = {}
    available = c.available_tokens or {}
    for j, d in enumerate(domains):
        if d in available:
            cap[j] = min(1.0, available[d] * c.max_epochs / tokens)
            caps[d] = float(cap[j])
    unknown = sorted(set(c.domain_epochs) - known)
    if unknown:
        raise OptimizeError(f"--max-epochs names domain(s) {', '.join(unknown)} that the fit does not train on; "
                            f"its training domains: {', '.join(domains)}.")
    for j, d in enumerate(domains):
        if d not in c.domain_epochs:
            continue
        e = float(c.domain_epochs[d])
        if not (math.isfinite(e) and e > 0):
            raise OptimizeError(f"--max-epochs {d}={e!r}; allowed: a number of epochs > 0.")
        pool = c.pools.get(d, available.get(d))
        if pool is None or not math.isfinite(pool):
            raise OptimizeError(f"--max-epochs {d}={e:g} needs the unique tokens of {d!r}: give --unique-tokens {d}=N "
                                f"(or --available / --dataset), or fit a repetition-aware law on a table with unique:{d}.")
        cap[j] = min(cap[j], pool * e / tokens)
        caps[d] = float(cap[j])
    limit = np.minimum(hi, cap)
    why = {d: ("repetition cap" if cap[j] < hi[j] else "max weight") for j, d in enumerate(domains)}
    for j, d in enumerate(domains):
        if lo[j] > limit[j] + 1e-12:
            if cap[j] < hi[j] and d in c.domain_epochs:
                detail = (f"its repetition cap {cap[j]:.4g} = {c.pools.get(d, available.get(d)):.4g} unique tokens x "
                          f"{c.domain_epochs[d]:g} epochs / {tokens:.4g} target tokens")
            elif cap[j] < hi[j]:
                detail = (f"its repetition cap {cap[j]:.4g} = {available[d]:.4g} available tokens x "
                          f"{c.max_epochs:g} epochs / {tokens:.4g} target tokens")
            else:
                detail = f"its max weight {hi[j]:g}"
            raise OptimizeError(f"infeasible: domain {d!r} has min weight {lo[j]:g} above {detail}. Lower --min-weight "
                                f"{d}, raise --max-weight/--max-epochs/available tokens, or lower --tokens.")
    if lo.sum() > 1 + 1e-12:
        listed = ", ".join(f"{d} {v:g}" for d, v in zip(domains, lo) if v > 0)
        raise OptimizeError(f"infeasible: the min weights sum to {lo.sum():.4g} > 1 ({listed}); lower some --min-weight.")
    if limit.sum() < 1 - 1e-12:
        listed = ", ".join(f"{d} <= {v:.4g} ({why[d]})" for d, v in zip(domains, limit))
        raise OptimizeError(f"infeasible: the largest shares allowed sum to {limit.sum():.4g} < 1 ({listed}); raise "
                            "--max-weight or --max-epochs, add available tokens, or lower --tokens.")
    notes = {"min_weight": dict(zip(domains, lo.tolist())), "max_weight": dict(zip(domains, limit.tolist())),
             "repetition_cap": caps, "max_epochs": c.max_epochs, "binding_upper": why,
             **({"domain_epochs": dict(c.domain_epochs)} if c.domain_epochs else {})}
    return lo, limit, notes


def _candidates(lo_m, hi_m, count: int, rng: np.random.Generator) -> np.ndarray:
    m = lo_m.shape[0]
    raw = [rng.dirichlet(np.ones(m), size=count), np.full((1, m), 1.0 / m), np.eye(m)]
    return project(np.concatenate(raw), lo_m, hi_m)


def _minimise(f: Callable[[np.ndarray], np.ndarray], lo_m, hi_m, *, candidates: int, starts: int,
              rng: np.random.Generator) -> tuple[np.ndarray, float, dict]:
    """Candidate search + SLSQP refinement + exact projection (see the module docstring)."""
    cand = _candidates(lo_m, hi_m, candidates, rng)
    vals = f(cand)
    finite = np.isfinite(vals)
    if not finite.any():
        raise OptimizeError("the law predicts non-finite values everywhere on the feasible set; check the fit.")
    vals = np.where(finite, vals, np.inf)
    order = np.argsort(vals)[:max(1, starts)]
    m = lo_m.shape[0]
    eye = np.eye(m) * FD_STEP

    def fun_grad(w):
        rows = np.concatenate([w[None], w[None] + eye])
        v = f(rows)
        return float(v[0]), (v[1:] - v[0]) / FD_STEP

    best_w, best_v = cand[order[0]], float(vals[order[0]])
    iters = []
    for k in order:
        res = minimize(fun_grad, cand[k], jac=True, method="SLSQP", bounds=list(zip(lo_m, hi_m)),
                       constraints=[{"type": "eq", "fun": lambda w: w.sum() - 1.0, "jac": lambda w: np.ones(m)}],
                       options={"maxiter": 200, "ftol": 1e-12})
        iters.append(int(res.nit))
        w = project(res.x, lo_m, hi_m)[0]
        v = float(f(w[None])[0])
        if np.isfinite(v) and v < best_v:
            best_w, best_v = w, v
    check_feasible(best_w, lo_m, hi_m)
    return best_w, best_v, {"candidates": int(cand.shape[0]), "starts": int(len(order)), "slsqp_iterations": iters}


def _losses(fit, size_r, tokens_r, w_km, member, unique_m):
    """fit.predict_losses, with the target's pools when known (repetition-aware laws)."""
    if unique_m is None:
        return np.asarray(fit.predict_losses(size_r, tokens_r, w_km, member=member))
    return np.asarray(fit.predict_losses(size_r, tokens_r, w_km, member=member, unique_rm=unique_m))


def _objective(fit, size: float, tokens: float, kind: str, loss_weights, task_weights, member, unique_m=None):
    """f(W_km) -> (K,) to minimise, for the point fit (member None) or one bootstrap member."""
    if kind == "loss":
        a_v = loss_weights

        def f(w_km):
            n = w_km.shape[0]
            return _losses(fit, np.full(n, size), np.full(n, tokens), w_km, member, unique_m) @ a_v
    else:
        b_t = task_weights

        def f(w_km):
            n = w_km.shape[0]
            loss = _losses(fit, np.full(n, size), np.full(n, tokens), w_km, member, unique_m)
            return -(np.asarray(fit.predict_bench(loss, member=member)) @ b_t)
    return f


def _weights_vector(names: Sequence[str], given: Mapping[str, float] | None, flag: str, what: str) -> np.ndarray:
    if not given:
        return np.full(len(names), 1.0 / len(names))
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise OptimizeError(f"{flag} names {what} {', '.join(unknown)} that the fit does not have; it has: {', '.join(names)}.")
    v = np.array([float(given.get(n, 0.0)) for n in names])
    if np.any(v < 0) or not np.isfinite(v).all() or v.sum() <= 0:
        raise OptimizeError(f"{flag} must be finite, >= 0 and not all zero; got {dict(given)}.")
    return v / v.sum()


def _target_weights(fit, target, loss_weights):
    """(loss weights, target JSON or None) for ``target`` on ``fit`` (see optimize_mixture)."""
    from data_mixture.table import TableError
    from data_mixture.target import resolve

    target = resolve(target)
    if target is None:
        info = getattr(fit, "info", None)
        return loss_weights, (info.get("target") if isinstance(info, dict) else None)
    if loss_weights:
        raise OptimizeError("give either --target or --loss-weights, not both (a target is a weighted set of domains).")
    if target.domain in fit.loss_domains:
        return {target.domain: 1.0}, target.to_json()
    parts = target.loss_domains()
    missing = [d for d in parts if d not in fit.loss_domains] if parts else list(target.weights)
    if missing:
        raise TableError(f"--target {target.text!r} needs {', '.join(missing)}, which the fit does not predict; it predicts "
                         f"loss:{', loss:'.join(fit.loss_domains)}. Fit the law with --target {target.text!r} instead.")
    return parts, target.to_json()


def _unique_vector(fit, unique_tokens: Mapping[str, float] | None) -> np.ndarray | None:
    """(M,) pools at the target (``inf``: unlimited) from ``unique_tokens``, else the fit's
    recorded ones (repetition-aware laws), else None."""
    domains = tuple(fit.mix_domains)
    if unique_tokens:
        from data_mixture.baselines import checked_pools

        pools = checked_pools(unique_tokens, domains, error=OptimizeError)
        return np.array([pools.get(d, np.inf) for d in domains])
    recorded = _recorded_pools(fit)
    if recorded is None:
        return None
    return np.array([np.inf if v is None else float(v) for v in recorded])


def _recorded_pools(fit) -> list | None:
    """The pools a repetition-aware fit recorded (``info["unique_tokens"]``), else None."""
    point = getattr(fit, "point", None)
    if not isinstance(point, dict):
        return None
    return next((f.info["unique_tokens"] for f in point.values() if "unique_tokens" in getattr(f, "info", {})), None)


def optimize_mixture(fit, *, size: float, tokens: float, objective: str = "loss",
                     loss_weights: Mapping[str, float] | None = None, task_weights: Mapping[str, float] | None = None,
                     constraints: Constraints | None = None, starts: int = 16, seed: int = 0,
                     bootstrap: bool = True, interval: float = 0.9, target=None,
                     unique_tokens: Mapping[str, float] | None = None, robust: str | None = "mean",
                     baselines: Mapping[str, Mapping[str, float]] | None = None) -> dict[str, Any]:
    """The optimal mixture and what the law predicts at it, as the JSON ``optimize`` writes.

    ``fit`` is a :class:`data_mixture.fit.Fit` (anything with ``mix_domains``, ``loss_domains``,
    ``predict_losses``, ``predict_bench``, ``bench``, ``bootstrap``, ``law``, ``size_column``).

    ``target`` (:mod:`data_mixture.target`, text or a Target): the loss to minimise, when it is
    not the fit's own (a fit made with ``--target`` is optimised for its target already): a
    weighted set of the fit's validation domains sets ``loss_weights``. ``unique_tokens``
    {domain: tokens}: each domain's pool at the target, for repetition-aware laws (default: the
    pools the fit recorded) and for ``Constraints.domain_epochs``.

    ``robust`` (``"mean"``, default; ``"qNN"``; None: the point fit's optimum): with a bootstrap
    (and ``objective="loss"``), ``weights`` is the robust pick of :mod:`data_mixture.robust` and
    ``robust`` its report (agreement, odds against ``baselines`` {name: weights} -- default
    :func:`default_baselines` -- and the members on a corner); ``point`` keeps the point optimum.
    """
    t0 = time.perf_counter()
    constraints = constraints or Constraints()
    loss_weights, target_json = _target_weights(fit, target, loss_weights)
    unique_m = _unique_vector(fit, unique_tokens)
    # the pools reach the predictions only of laws that read them (repetition-aware fits record theirs)
    pred_unique = unique_m if _recorded_pools(fit) is not None else None
    domains = tuple(fit.mix_domains)
    tasks, a_v, b_t = _objective_weights(fit, objective, size, interval, loss_weights, task_weights)
    if unique_m is not None:
        constraints = dataclasses.replace(constraints, pools={**{d: float(u) for d, u in zip(domains, unique_m)
                                                                  if np.isfinite(u)}, **constraints.pools})
    lo, hi, notes = feasible_bounds(domains, constraints, tokens)
    rng = np.random.default_rng(seed)
    f = _objective(fit, size, tokens, objective, a_v, b_t, None, pred_unique)
    w_star, v_star, search = _minimise(f, lo, hi, candidates=CANDIDATES, starts=starts, rng=rng)

    n_members = len(getattr(fit, "bootstrap", []) or [])
    members_w = []
    robust_report = None
    w_point = w_star
    if robust and bootstrap and n_members and objective == "loss":
        from data_mixture.robust import robust_pick

        if baselines is None:
            baselines = default_baselines(fit, a_v, target_json, tokens, unique_m)
        robust_report = robust_pick(fit, size=size, tokens=tokens, a_v=a_v, lo_m=lo, hi_m=hi, unique_m=pred_unique,
                                    robust=robust, point_w=w_star, baselines=baselines, seed=seed, interval=interval,
                                    binding=notes["binding_upper"])
        w_star = np.array([robust_report["weights"][d] for d in domains])
        v_star = float(f(w_star[None])[0])
        members_w = [np.array([o[d] for d in domains]) for o in robust_report["member_optima"]]
    elif bootstrap and n_members:
        members_w = [_minimise(_objective(fit, size, tokens, objective, a_v, b_t, b, pred_unique), lo, hi,
                               candidates=BOOT_CANDIDATES, starts=BOOT_STARTS, rng=rng)[0] for b in range(n_members)]
    q = ((1 - interval) / 2, 1 - (1 - interval) / 2)
    predicted = _predicted_at(fit, size, tokens, w_star, n_members, tasks, pred_unique, q)
    value = float(v_star) if objective == "loss" else float(-v_star)
    boot = _bootstrap_summary(members_w, domains, q, interval)
    return {
        "weights": dict(zip(domains, w_star.tolist())),
        "law": fit.law,
        "target": {"size": float(size), "size_column": fit.size_column, "tokens": float(tokens)},
        "objective": {"kind": objective, "value": value,
                      "loss_weights": dict(zip(fit.loss_domains, a_v.tolist())),
                      "task_weights": dict(zip(tasks, b_t.tolist())) if b_t is not None else {},
                      **({"target": target_json} if target_json else {})},
        "constraints": notes,
        **({"unique_tokens": {d: (float(u) if np.isfinite(u) else None) for d, u in zip(domains, unique_m)}}
           if unique_m is not None else {}),
        "predicted": predicted,
        "bootstrap": boot,
        **({"point": dict(zip(domains, w_point.tolist())), "robust": robust_report} if robust_report else {}),
        "search": {**search, "seed": seed, "seconds": time.perf_counter() - t0},
    }


def _objective_weights(fit, objective: str, size: float, interval: float, loss_weights: Mapping[str, float] | None,
                       task_weights: Mapping[str, float] | None) -> tuple[tuple[str, ...], np.ndarray, np.ndarray | None]:
    """The fit's benchmark tasks, the validation-domain weights and (objective 'bench') the task
    weights, after checking the objective, the target size and the interval mass."""
    if objective not in ("loss", "bench"):
        raise OptimizeError(f"objective {objective!r}; allowed: loss | bench.")
    if not (math.isfinite(size) and size > 0):
        raise OptimizeError(f"target size is {size!r}; allowed: a number > 0 (in the fit's {fit.size_column}).")
    if not 0 < interval < 1:
        raise OptimizeError(f"--interval {interval}; allowed: a mass in (0, 1), e.g. 0.9.")
    tasks = tuple(getattr(fit, "bench", {}) or {})
    a_v = _weights_vector(fit.loss_domains, loss_weights, "--loss-weights", "validation domain(s)")
    if objective != "bench":
        return tasks, a_v, None
    if not tasks:
        raise OptimizeError("objective 'bench' needs benchmark laws in the fit, and this fit has none (its runs "
                            "table had no bench:<task> columns); use --objective loss.")
    return tasks, a_v, _weights_vector(tasks, task_weights, "--task-weights", "task(s)")


def _predicted_at(fit, size: float, tokens: float, w_star: np.ndarray, n_members: int, tasks: tuple[str, ...],
                  pred_unique: np.ndarray | None, q: tuple[float, float]) -> dict[str, Any]:
    """What the law predicts at the optimal mixture: each validation loss (and benchmark score),
    with the ``q`` quantiles over the bootstrap members' predictions at that same mixture."""
    size_1, tokens_1 = np.array([float(size)]), np.array([float(tokens)])
    loss_point = _losses(fit, size_1, tokens_1, w_star[None], None, pred_unique)[0]
    bench_point = np.asarray(fit.predict_bench(loss_point[None]))[0] if tasks else None
    at_star_loss, at_star_bench = [], []
    for b in range(n_members):
        lb = _losses(fit, size_1, tokens_1, w_star[None], b, pred_unique)[0]
        at_star_loss.append(lb)
        if tasks:
            at_star_bench.append(np.asarray(fit.predict_bench(lb[None], member=b))[0])

    def summary(point, members):
        out = {"pred": float(point)}
        if len(members):
            out["lo"], out["hi"] = (float(x) for x in np.quantile(members, q))
        return out

    predicted: dict[str, Any] = {}
    for j, d in enumerate(fit.loss_domains):
        predicted["loss:" + d] = summary(loss_point[j], np.array([m[j] for m in at_star_loss]))
    if bench_point is not None:  # None without tasks
        for j, t in enumerate(tasks):
            predicted["bench:" + t] = summary(bench_point[j], np.array([m[j] for m in at_star_bench]))
    return predicted


def _bootstrap_summary(members_w: list[np.ndarray], domains: tuple[str, ...], q: tuple[float, float],
                       interval: float) -> dict[str, Any]:
    """The bootstrap members' optimal weights: per domain mean, sd and ``q`` quantiles, and each optimum."""
    boot: dict[str, Any] = {"members": len(members_w)}
    if members_w:
        wb = np.stack(members_w)
        boot["weights"] = {d: {"mean": float(wb[:, j].mean()), "std": float(wb[:, j].std()),
                               "lo": float(np.quantile(wb[:, j], q[0])), "hi": float(np.quantile(wb[:, j], q[1]))}
                           for j, d in enumerate(domains)}
        boot["optima"] = [dict(zip(domains, w.tolist())) for w in wb]
        boot["interval"] = interval
    return boot


def default_baselines(fit, a_v: np.ndarray, target_json: Mapping | None, tokens: float,
                      unique_m: np.ndarray | None) -> dict[str, dict[str, float]]:
    """The mixtures a robust pick is compared with when none are given: uniform; proportional and
    UniMax when every domain's pool is known; the target-capped practitioner rules
    (:mod:`data_mixture.baselines`; proxy-capped needs the runs table: ``recommend`` adds it)."""
    from data_mixture.baselines import UNIMAX_MAX_EPOCHS, practitioner_mixtures, unimax_weights
    from data_mixture.target import Target

    domains = tuple(fit.mix_domains)
    out = {"uniform": {d: 1.0 / len(domains) for d in domains}}
    if unique_m is not None and np.all(np.isfinite(unique_m)):
        out["proportional"] = dict(zip(domains, (unique_m / unique_m.sum()).tolist()))
        out["unimax"] = dict(zip(domains, unimax_weights(unique_m, tokens, UNIMAX_MAX_EPOCHS).tolist()))
    pools = {} if unique_m is None else {d: float(u) for d, u in zip(domains, unique_m) if np.isfinite(u)}
    target = Target.from_json(target_json) if target_json else dict(zip(fit.loss_domains, np.asarray(a_v).tolist()))
    for name, got in practitioner_mixtures(domains, tokens=tokens, pools=pools, target=target).items():
        if "weights" in got:
            out[name] = got["weights"]
    return out


def write_mixture(result: Mapping[str, Any], path: str | os.PathLike) -> None:
    """Writes the mixture JSON under a temporary name, then renames it into place."""
    from data_mixture.user_files import write_text

    write_text(path, json.dumps(result, indent=1))
