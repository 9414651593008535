"""Merging domain experts on device, and evaluating merges with a cache (MergeMix).

``theta(alpha) = theta_base + sum_k alpha_k (theta_k - theta_base)``, built by one jitted function
in which ``alpha_k`` is a traced argument: every alpha reuses one compile, and the merged
parameters come out sharded exactly like the base run's parameters
(``erun.run.state_shardings["params"]``), so the compiled evaluation functions of one
:class:`moejax.eval.evaluate.Evaluator` of the base run serve every merge. Nothing is written to
disk.

Exactness. ``base + 1.0 * (theta_k - base)`` is not ``theta_k`` bit-for-bit in floating point
(``theta_k - base`` is rounded; Sterbenz's lemma makes it exact only where the two are within a
factor of two of each other). A merge proxy whose vertices are not the experts themselves would
rank a pure-domain mixture by a model nobody trained, so the merge keeps the expert parameters
``theta_k`` themselves (stacked, leading K axis unsharded, each slice sharded like the base's
parameter), forms ``delta_k = theta_k - theta_base`` inside the jitted function (fused per leaf,
never materialised as a K-fold copy), and selects exactly: alpha equal to the unit vector e_k
returns ``theta_k``, the zero vector returns ``theta_base`` (selects on the traced alpha, so still
one compile). Everywhere else it is the paper's formula, accumulated in float32 (or wider) in the
order k = 0..K-1 and cast back to the parameter dtype. Storing ``theta_k`` rather than ``delta_k``
costs the same memory (K + 1 parameter copies) and loses no bits.

Router treatments (``router=``): ``"linear"`` merges every parameter, router included (the paper);
``"base"`` keeps the base's router leaves (every leaf with a ``router`` key on its path:
``w_de`` and, if configured, ``select_bias_e``) and merges the rest. The calibrated (HARC) router
is :mod:`.routing`'s; its params go to :meth:`MergeEvaluator.evaluate` through ``params=``.

Compatibility. :meth:`MergeSet.open` checks every expert against the base before any weight is
read: the same tokenizer, the same architecture config (every ``model.*`` key except the ones
that only choose how the same function is executed or trained, :data:`EXECUTION_KEYS`, plus
``train.param_dtype`` and ``train.scan_layers``, which change the parameter tree) and the same
parameter tree and shapes; the error names every differing key and parameter of every expert.

Evaluation. :class:`MergeEvaluator` evaluates merges under one set of :class:`Settings` and
returns flat metrics ``loss:<domain>`` (held-out loss, nats/token), ``bench:<task>`` (by default the
task's headline score, :func:`moejax.eval.evaluate.benchmark_score`; with ``bench_metric="gold_logprob"``
the mean log-probability of the gold answer, :data:`.objective.BENCH_METRICS`), ``eval_tokens`` and ``seconds``
(merge + evaluation wall time of the computation that produced the entry; a merge scored with
others gets its share). By default (``merges_per_call`` >= 1) several merges are merged and scored
per compiled call by :mod:`.batched`, which computes the same numbers with fewer tokens (equal up
to float rounding); ``merges_per_call=0`` scores each merge with ``moejax.eval``'s Evaluator, exactly
as ``python -m moejax.eval`` scores a saved checkpoint. :meth:`MergeEvaluator.evaluate_many` takes a
list of alphas (what the searches ask for). The merged model runs with the base's
balancing state (``Checkpoint(base_step, merged, base.balance)``): the balancing state is
inference state of the base run (e.g. loss-free biases), not a parameter that is merged.
Results are cached on (alpha rounded to 1e-9, router, key_extra), in memory and optionally in a
JSONL file, one line per evaluation, so the same key is never computed twice, also across
processes; each line records the merge set and settings it belongs to, and a file written for
another merge set or other settings is refused. The two ways of scoring share one cache file (the
same context): their entries agree up to float rounding, and a file written by either serves both.
The benchmark metric is part of the context (when benchmarks are scored and it is not the default
accuracy, so accuracy caches keep their identity): a file of the other metric is refused, never mixed.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import os
import time
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from moejax.errors import ConfigError
from moejax.errors import DataError
from moejax.data.tokenizer import check_tokenizer_matches
from moejax.eval.evaluate import Evaluator, Settings
from moejax.eval.restore import Checkpoint, EvalRun, open_run
from moejax.train.checkpoint import CheckpointMismatch, describe_mismatch, flat_shapes

from data_mixture.mergemix.arithmetic import ROUTERS, merge_params, set_slot, stacked_sharding
from data_mixture.mergemix.batched import MERGES_PER_CALL, BatchedScorer, bench_score, shared_scorer
from data_mixture.mergemix.objective import check_bench_metric

# model.* keys that choose how the same parameters are executed or trained, not what they compute
# at evaluation time (dispatch backend and its tuning, training losses, initialisation); experts may
# differ in them. Every other model.* key must match the base's.
EXECUTION_KEYS = frozenset({
    "model.moe.backend", "model.moe.capacity_factor", "model.moe.grouped_matmul", "model.moe.tile_size",
    "model.moe.ep_comm", "model.moe.ep_capacity_factor", "model.moe.ep_balance", "model.moe.ep_spill_slots",
    "model.moe.ep_spill_capacity_factor", "model.moe.balancing", "model.logits_z_loss", "model.init_std",
})
# train.* keys that change the parameter tree (dtype, scanned-layer stacking).
PARAM_TRAIN_KEYS = ("train.param_dtype", "train.scan_layers")

ALPHA_ROUND = 9  # decimals of alpha in cache keys (1e-9)
SIMPLEX_TOL = 1e-6


class MergeMismatch(CheckpointMismatch):
    """An expert cannot be merged with the base: another architecture, tokenizer or parameter tree."""


def check_alpha(alpha: Mapping[str, float] | Sequence[float] | np.ndarray, domains: Sequence[str]) -> np.ndarray:
    """A user's alpha as a float64 vector in the order of ``domains``, checked to lie on the simplex.

    Accepts a sequence (one weight per domain, in order) or a dict {domain: weight} naming every
    domain exactly once. Raises ConfigError naming the bad entry: wrong length, unknown or missing
    domain, a non-finite or negative weight, or a sum off 1 by more than 1e-6.
    """
    domains = list(domains)
    if isinstance(alpha, Mapping):
        unknown = [d for d in alpha if d not in domains]
        if unknown:
            raise ConfigError(f"alpha names domain {unknown[0]!r}, which has no expert; domains: {domains}")
        missing = [d for d in domains if d not in alpha]
        if missing:
            raise ConfigError(f"alpha has no weight for domain {missing[0]!r}; give one for each of {domains}")
        values = [alpha[d] for d in domains]
    else:
        values = list(np.asarray(alpha, dtype=object).reshape(-1)) if np.ndim(alpha) else [alpha]
        if np.ndim(alpha) > 1 or len(values) != len(domains):
            raise ConfigError(
                f"alpha has {len(values)} entries (shape {np.shape(alpha)}); it needs one weight per domain, "
                f"{len(domains)}: {domains}"
            )
    out = np.zeros(len(domains))
    for i, (d, v) in enumerate(zip(domains, values)):
        try:
            out[i] = float(v)
        except (TypeError, ValueError):
            raise ConfigError(f"alpha[{d!r}] = {v!r} is not a number") from None
    for d, v in zip(domains, out):
        if not math.isfinite(v):
            raise ConfigError(f"alpha[{d!r}] = {v} is not finite; weights are finite numbers >= 0 summing to 1")
        if v < 0:
            raise ConfigError(f"alpha[{d!r}] = {v} is negative; weights are >= 0 and sum to 1")
    total = float(out.sum())
    if abs(total - 1.0) > SIMPLEX_TOL:
        raise ConfigError(
            f"alpha sums to {total:.9g}, not 1 (within {SIMPLEX_TOL:g}): "
            + ", ".join(f"{d}={v:g}" for d, v in zip(domains, out)) + "; normalise it"
        )
    return out


def _flat_config(tree: Any, prefix: str) -> dict[str, Any]:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flat_config(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = value
    return out


def architecture_keys(cfg) -> dict[str, Any]:
    """The config keys that must agree between the base and an expert (see the module docstring)."""
    flat = {k: v for k, v in _flat_config(cfg.model.to_dict(), "model.").items() if k not in EXECUTION_KEYS}
    for key in PARAM_TRAIN_KEYS:
        flat[key] = cfg.train.get(key.split(".", 1)[1])
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in flat.items()}


def compatibility_problems(base: EvalRun, expert: EvalRun) -> list[str]:
    """Everything that keeps ``expert`` from being merged with ``base``: differing tokenizer,
    architecture config keys and parameter shapes (empty: compatible). Reads no weights."""
    problems = []
    try:
        check_tokenizer_matches(
            base.tokenizer.name, expert.tokenizer.name, data_source=f"the base {base.workdir}",
            checkpoint=f"the expert {expert.workdir}",
        )
    except DataError as e:
        problems.append(str(e))
    base_keys, expert_keys = architecture_keys(base.cfg), architecture_keys(expert.cfg)
    for key in sorted(set(base_keys) | set(expert_keys)):
        if base_keys.get(key) != expert_keys.get(key):
            problems.append(f"config {key}: base {base_keys.get(key)!r} vs expert {expert_keys.get(key)!r}")
    shapes = describe_mismatch(
        flat_shapes(expert.run.abstract_state["params"]), flat_shapes(base.run.abstract_state["params"])
    )
    problems += [f"parameter {_reword(line)}" for line in shapes]
    base_dtypes = _flat_dtypes(base.run.abstract_state["params"])
    for name, dtype in sorted(_flat_dtypes(expert.run.abstract_state["params"]).items()):
        if name in base_dtypes and base_dtypes[name] != dtype:
            problems.append(f"parameter {name}: expert dtype {dtype} vs base {base_dtypes[name]}")
    return problems


_SIDES = ((": in the checkpoint ", ": in the expert "), (", not in the model", ", not in the base"),
          (": in the model ", ": in the base "), (", not in the checkpoint", ", not in the expert"),
          (": checkpoint ", ": expert "), (" vs model ", " vs base "))


def _reword(line: str) -> str:
    """A :func:`describe_mismatch` line (checkpoint vs model) said of an expert vs the base."""
    for old, new in _SIDES:
        line = line.replace(old, new)
    return line


def _flat_dtypes(tree: Any) -> dict[str, str]:
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {
        "/".join(str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path): str(leaf.dtype)
        for path, leaf in flat
    }


class MergeSet:
    """A base checkpoint and K domain experts of the same architecture, on device, ready to merge.

    Attributes: ``domains`` (the order of alpha), ``erun`` (the base's EvalRun), ``base`` (the base
    :class:`Checkpoint`: params and balancing state), ``expert_runs`` and ``expert_steps`` (per
    domain), ``stacked`` (the experts' parameters, leading K axis, see the module docstring).
    """

    def __init__(self, erun: EvalRun, base: Checkpoint, domains: Sequence[str], expert_runs: Sequence[EvalRun],
                 expert_steps: Sequence[int], stacked: Any, expert_balance: Sequence[dict]):
        self.erun, self.base, self.domains = erun, base, tuple(domains)
        self.expert_runs, self.expert_steps = tuple(expert_runs), tuple(expert_steps)
        self.stacked, self._expert_balance = stacked, tuple(expert_balance)
        param_shardings = erun.run.state_shardings["params"]
        replicated = NamedSharding(erun.run.mesh, P())
        self._alpha_sharding = replicated
        self._merge = {  # one jitted function per router treatment; alpha is traced
            router: jax.jit(
                functools.partial(merge_params, router=router),
                in_shardings=(param_shardings, jax.tree.map(stacked_sharding, param_shardings), replicated),
                out_shardings=param_shardings,
            )
            for router in ROUTERS
        }
        self._slice = jax.jit(
            lambda stacked_k, k: jax.tree.map(lambda s: s[k], stacked_k), out_shardings=param_shardings
        )

    @classmethod
    def open(cls, base_workdir: str, base_step: int | None, experts: Mapping[str, tuple[str, int]]) -> "MergeSet":
        """Opens the base run and the experts ({domain: (workdir, step)}), checks every expert
        against the base (architecture, tokenizer, parameter tree: one error naming every
        difference, before any weight is read), then loads the base and stacks the experts on device."""
        if not experts:
            raise ConfigError("a merge needs at least one expert: pass {domain: (workdir, step)}")
        erun = open_run(base_workdir)
        base_step = erun.steps[-1] if base_step is None else int(base_step)
        if base_step not in erun.steps:
            raise ConfigError(f"base {erun.checkpoint_dir} has no checkpoint at step {base_step}; steps: {list(erun.steps)}")
        domains, runs, steps, problems = list(experts), [], [], []
        for domain in domains:
            entry = experts[domain]
            if not (isinstance(entry, (tuple, list)) and len(entry) == 2):
                raise ConfigError(f"expert {domain!r}: {entry!r} is not a (workdir, step) pair")
            workdir, step = entry
            expert = open_run(workdir)
            step = expert.steps[-1] if step is None else int(step)
            if step not in expert.steps:
                problems.append(f"expert {domain!r} ({expert.checkpoint_dir}) has no checkpoint at step {step}; "
                                f"steps: {list(expert.steps)}")
            problems += [f"expert {domain!r} ({expert.workdir}): {p}" for p in compatibility_problems(erun, expert)]
            runs.append(expert)
            steps.append(step)
        if problems:
            raise MergeMismatch(
                f"the experts cannot be merged with the base {erun.workdir} (step {base_step}); "
                f"{len(problems)} difference(s):\n  " + "\n  ".join(problems)
            )
        base = erun.load(base_step)
        param_shardings = erun.run.state_shardings["params"]
        stacked_shardings = jax.tree.map(stacked_sharding, param_shardings)
        with jax.set_mesh(erun.run.mesh):
            stacked = jax.jit(
                lambda p: jax.tree.map(lambda x: jnp.zeros((len(domains), *x.shape), x.dtype), p),
                out_shardings=stacked_shardings,
            )(base.params)
            put_slot = jax.jit(set_slot, donate_argnums=0, out_shardings=stacked_shardings)
            balances = []
            for k, (expert, step) in enumerate(zip(runs, steps)):
                ckpt = expert.load(step)
                params = jax.device_put(ckpt.params, param_shardings)  # the base's mesh and layout
                stacked = put_slot(stacked, params, jnp.int32(k))
                balances.append(ckpt.balance)
                del ckpt, params
        return cls(erun, base, domains, runs, steps, stacked, balances)

    @property
    def num_experts(self) -> int:
        return len(self.domains)

    def _index(self, k: int | str) -> int:
        if isinstance(k, str):
            if k not in self.domains:
                raise ConfigError(f"no expert for domain {k!r}; domains: {list(self.domains)}")
            return self.domains.index(k)
        if not 0 <= int(k) < len(self.domains):
            raise ConfigError(f"expert index {k} is out of range [0, {len(self.domains)})")
        return int(k)

    def expert(self, k: int | str) -> Checkpoint:
        """Expert ``k`` (index or domain) as a Checkpoint: its step, its parameters (in the base's
        shardings, a slice of ``stacked``) and its own balancing state."""
        k = self._index(k)
        with jax.set_mesh(self.erun.run.mesh):
            params = self._slice(self.stacked, jnp.int32(k))
        return Checkpoint(self.expert_steps[k], params, self._expert_balance[k])

    def merge(self, alpha_k: Sequence[float] | np.ndarray, router: str = "linear") -> Any:
        """``theta(alpha)`` on device, sharded like the base's parameters. ``alpha_k`` is any finite
        vector of K weights (the simplex is :func:`check_alpha`'s job); one compile per router."""
        if router not in ROUTERS:
            raise ConfigError(f"router={router!r} is unknown; allowed: {', '.join(ROUTERS)}")
        alpha = np.asarray(alpha_k, dtype=np.float64)
        if alpha.shape != (self.num_experts,):
            raise ConfigError(f"alpha has shape {alpha.shape}; it needs {self.num_experts} weights, one per "
                              f"domain {list(self.domains)}")
        bad = [d for d, a in zip(self.domains, alpha) if not math.isfinite(a)]
        if bad:
            raise ConfigError(f"alpha[{bad[0]!r}] is not finite: {alpha.tolist()}")
        alpha32 = jax.device_put(alpha.astype(np.float32), self._alpha_sharding)
        with jax.set_mesh(self.erun.run.mesh):
            return self._merge[router](self.base.params, self.stacked, alpha32)

    def fingerprint(self) -> dict[str, Any]:
        """What identifies this merge set in a cache file."""
        return {
            "base": [self.erun.workdir, self.base.step],
            "experts": {d: [r.workdir, s] for d, r, s in zip(self.domains, self.expert_runs, self.expert_steps)},
        }


def flat_metrics(result: dict[str, Any], bench_metric: str = "accuracy") -> dict[str, float]:
    """``loss:<domain>`` and ``bench:<task>`` (the task's ``bench_metric``, :data:`.objective.BENCH_METRICS`)
    from an Evaluator result (a step_N.json dict), and ``eval_tokens``: the tokens the evaluation
    ran (for FLOP accounting)."""
    out = {f"loss:{d}": float(v["loss"]) for d, v in result["losses"]["domains"].items()}
    out.update({f"bench:{t}": bench_score(b, bench_metric) for t, b in result["benchmarks"].items()})
    out["eval_tokens"] = float(result["throughput"]["total"]["tokens"])
    return out


class MergeEvaluator:
    """Evaluates merges of ``merge_set`` under ``settings``, caching every result (module docstring).

    One :class:`Evaluator` of the base run is built once and reused (``evaluator=`` shares an
    existing one, e.g. between evaluators with different cache files). ``merges_per_call``: merges
    merged and scored per compiled call by :class:`.batched.BatchedScorer` (built on first use, so
    nothing recompiles across merges); 0 scores merge by merge with the Evaluator itself, exactly
    as ``python -m moejax.eval`` scores a saved checkpoint (the reference the batched scores equal
    up to float rounding, :mod:`.batched`). ``cache_path``: a JSONL file read at start (entries of
    this merge set and settings, whichever way they were scored) and appended to after each new
    evaluation. ``bench_metric``: what ``bench:<task>`` is (:data:`.objective.BENCH_METRICS`; higher is
    better either way): ``"accuracy"`` (default) or ``"gold_logprob"``, computed from the same
    log-likelihoods by both ways of scoring. Counters: ``merges_evaluated`` (computed here),
    ``cache_hits`` (answered from the cache, file entries included).
    """

    def __init__(self, merge_set: MergeSet, settings: Settings, *, cache_path: str | None = None,
                 evaluator: Evaluator | None = None, progress: bool = False, merges_per_call: int = MERGES_PER_CALL,
                 bench_metric: str = "accuracy"):
        self.merge_set, self.settings, self.cache_path = merge_set, settings, cache_path
        if evaluator is not None and (evaluator.erun is not merge_set.erun or evaluator.settings != settings):
            raise ConfigError("evaluator= must be an Evaluator of merge_set.erun with the same settings")
        if not (isinstance(merges_per_call, int) and merges_per_call >= 0):
            raise ConfigError(f"merges_per_call={merges_per_call!r}: a number of merges >= 1, or 0 for one at a time")
        self.evaluator = evaluator or Evaluator(merge_set.erun, settings, progress=progress)
        self.merges_per_call = merges_per_call
        self.bench_metric = check_bench_metric(bench_metric)
        self.merges_evaluated, self.cache_hits = 0, 0
        self.context = json.loads(json.dumps({  # as a file holds it (tuples as lists)
            "merge_set": merge_set.fingerprint(), "settings": dataclasses.asdict(settings),
            "domains": list(merge_set.domains),
            # the default (accuracy) and a losses-only evaluation leave it out: their files keep their ids
            **({"bench_metric": bench_metric} if bench_metric != "accuracy" and settings.tasks else {}),
        }))
        self._context_id = hashlib.sha256(json.dumps(self.context, sort_keys=True).encode()).hexdigest()[:16]
        self._cache: dict[tuple, dict[str, float]] = {}
        self._truncate_at: int | None = None
        if cache_path and os.path.exists(cache_path):
            self._read_cache(cache_path)

    @property
    def scorer(self) -> BatchedScorer:
        """The batched scorer (built on first use and shared by the MergeEvaluators of one merge set,
        Evaluator, ``merges_per_call`` and ``bench_metric``, so they compile once; needs
        ``merges_per_call`` >= 1)."""
        return shared_scorer(self.merge_set, self.evaluator, self.merges_per_call, self.bench_metric)

    def key(self, alpha: Sequence[float] | np.ndarray, router: str = "linear", key_extra: str = "") -> tuple:
        """The cache key: (alpha rounded to 1e-9, router, key_extra)."""
        rounded = tuple(float(a) + 0.0 for a in np.round(np.asarray(alpha, dtype=np.float64), ALPHA_ROUND))
        return rounded, router, key_extra

    def is_cached(self, alpha: Sequence[float] | np.ndarray, router: str = "linear", key_extra: str = "") -> bool:
        """Whether :meth:`evaluate` would answer this key from the cache (without computing)."""
        return self.key(alpha, router, key_extra) in self._cache

    def evaluate(self, alpha: Sequence[float] | np.ndarray, router: str = "linear", params: Any = None,
                 key_extra: str = "") -> dict[str, float]:
        """Flat metrics of the merge ``alpha`` (``loss:<domain>``, ``bench:<task>``, ``seconds``),
        from the cache if this key was evaluated before. ``params``: evaluate these parameters
        (e.g. a calibrated router's) instead of ``merge(alpha, router)``; they need a non-empty
        ``key_extra`` naming the treatment, so they never share a cache entry with a plain merge
        (a ``key_extra`` without ``params`` only reads the cache)."""
        if params is not None and not key_extra:
            raise ConfigError("evaluate(params=...) needs key_extra naming how the params were made (e.g. 'harc')")
        if params is None:
            return self.evaluate_many([alpha], router, key_extra=key_extra)[0]
        self._check_router(router)
        key = self.key(self._check(alpha), router, key_extra)
        if key in self._cache:
            self.cache_hits += 1
            return dict(self._cache[key])
        start = time.perf_counter()
        if self.merges_per_call:
            metrics = self.scorer.metrics(self.scorer.stack([params]), 1)[0]
        else:
            metrics = self._reference(params)
        self._store(key, metrics, time.perf_counter() - start)
        return dict(self._cache[key])

    def evaluate_many(self, alphas: Sequence[Sequence[float]] | np.ndarray, router: str = "linear",
                      key_extra: str = "") -> list[dict[str, float]]:
        """:meth:`evaluate` of each alpha, in order. The keys not cached are computed
        ``merges_per_call`` at a time (each distinct key once; a repeat counts as a cache hit, as
        it would one at a time); ``seconds`` of each is its share of its call's wall time."""
        self._check_router(router)
        keys = [self.key(self._check(a), router, key_extra) for a in alphas]
        todo = list(dict.fromkeys(k for k in keys if k not in self._cache))
        if todo and key_extra:
            raise ConfigError(f"no cached evaluation of alpha {list(todo[0][0])} with key_extra={key_extra!r}: "
                              "pass the params that key_extra names (evaluate(..., params=...))")
        step = self.merges_per_call or 1
        for start in range(0, len(todo), step):
            chunk = todo[start:start + step]
            began = time.perf_counter()
            if self.merges_per_call:
                alpha_nk = np.array([k[0] for k in chunk])
                results = self.scorer.metrics(self.scorer.merge(alpha_nk, router), len(chunk))
            else:
                results = [self._reference(self.merge_set.merge(np.array(chunk[0][0]), router))]
            seconds = (time.perf_counter() - began) / len(chunk)
            for key, metrics in zip(chunk, results):
                self._store(key, metrics, seconds)
        self.cache_hits += len(keys) - len(todo)
        return [dict(self._cache[k]) for k in keys]

    def _reference(self, params: Any) -> dict[str, float]:
        """One merge scored by the moejax.eval Evaluator (``merges_per_call=0``)."""
        return flat_metrics(self.evaluator.evaluate(Checkpoint(self.merge_set.base.step, params,
                                                               self.merge_set.base.balance)), self.bench_metric)

    def _check_router(self, router: str) -> None:
        if router not in ROUTERS:
            raise ConfigError(f"router={router!r} is unknown; allowed: {', '.join(ROUTERS)}")

    def _check(self, alpha) -> np.ndarray:
        alpha = np.asarray(alpha, dtype=np.float64)
        if alpha.shape != (self.merge_set.num_experts,) or not np.all(np.isfinite(alpha)):
            raise ConfigError(f"alpha {alpha.tolist()} must be {self.merge_set.num_experts} finite weights, "
                              f"one per domain {list(self.merge_set.domains)}")
        return alpha

    def _store(self, key: tuple, metrics: dict[str, float], seconds: float) -> None:
        metrics = {**metrics, "seconds": seconds}
        self.merges_evaluated += 1
        self._cache[key] = metrics
        if self.cache_path:
            self._append(key, metrics)

    def _append(self, key: tuple, metrics: dict[str, float]) -> None:
        line = {"context_id": self._context_id, "alpha": list(key[0]), "router": key[1], "key_extra": key[2],
                "metrics": metrics, "context": self.context}
        os.makedirs(os.path.dirname(os.path.abspath(self.cache_path)), exist_ok=True)
        with open(self.cache_path, "ab") as f:
            if self._truncate_at is not None:  # drop a last line cut by a kill mid-write
                f.truncate(self._truncate_at)
                self._truncate_at = None
            f.write((json.dumps(line) + "\n").encode())
            f.flush()

    def _read_cache(self, path: str) -> None:
        """Loads the entries of ``path``; a last line cut mid-write (no newline, not JSON) is
        dropped and overwritten by the next entry. Any other bad line, or an entry of another merge
        set or settings, is an error naming the line and what differs."""
        offset = 0
        with open(path, "rb") as f:
            for number, raw in enumerate(f, 1):
                text = raw.decode("utf-8", errors="replace")
                if text.strip():
                    try:
                        line = json.loads(text)
                        context_id, alpha, router, extra, metrics = (
                            line["context_id"], line["alpha"], line["router"], line["key_extra"], line["metrics"])
                    except (json.JSONDecodeError, KeyError, TypeError) as e:
                        if not text.endswith("\n"):
                            self._truncate_at = offset
                            break
                        raise ConfigError(f"merge cache {path} line {number} is not a cache entry ({e}); "
                                          "delete the file or pass another cache path") from None
                    if context_id != self._context_id:
                        saved = _flat_config(line.get("context", {}), "")
                        mine = _flat_config(self.context, "")
                        differs = [k for k in sorted(set(saved) | set(mine)) if saved.get(k) != mine.get(k)]
                        if differs == ["bench_metric"]:
                            theirs = saved.get("bench_metric") or "accuracy"
                            raise ConfigError(
                                f"merge cache {path} line {number} holds benchmark scores (bench:<task>) as "
                                f"{theirs}, but this evaluator scores them as {self.bench_metric} (bench_metric, "
                                "--bench-metric); one cache never mixes the two. Pass another cache path "
                                f"(--cache, or another --out) for {self.bench_metric}, or --bench-metric {theirs} "
                                "to reuse this one.")
                        described = [f"{k}: file {saved.get(k)!r} vs this evaluator {mine.get(k)!r}" for k in differs]
                        raise ConfigError(
                            f"merge cache {path} line {number} was written for another merge set or settings ("
                            + ("; ".join(described[:10]) or "another context id") + "). Pass another cache path."
                        )
                    self._cache[self.key(alpha, router, extra)] = metrics
                offset += len(raw)
