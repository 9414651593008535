"""Scoring several merges per compiled call: the fast evaluation behind :class:`.merge.MergeEvaluator`.

A merge's evaluation is the held-out loss of every domain and one score per benchmark task, the
numbers :func:`.merge.flat_metrics` takes from a ``moejax.eval`` result. :class:`BatchedScorer`
computes the same numbers for up to ``C`` merges at a time:

Merges on device, in one preallocated stack
    ``C`` alphas are merged by one jitted ``vmap`` of :func:`.arithmetic.merge_params` into a stack of
    ``C`` parameter sets (leading axis unsharded, each slice sharded like the base's parameters);
    parameters from elsewhere (a calibrated router's) are written into a slot of the same stack.
    Fewer than ``C`` merges leave the other slots unused: one stack shape, one compile.

One program per evaluation batch for all the merges
    Every evaluation batch (a held-out batch, a chunk of benchmark items) is scored by a jitted
    function of (stack, count, batch) that loops over the first ``count`` slots on device
    (``fori_loop`` with a traced trip count: no recompilation for another number of merges) and
    returns every merge's numbers in one transfer. The batches themselves are built once, when the
    scorer is made, not once per merge. A loop rather than ``vmap`` over the stack: the forward
    is compute-bound on CPU, and the vmapped model (its dropless dispatch batched over merges)
    was slower per merge than the plain one (docs/mergemix.md), so on CPU the merge-independent
    work (batches, transfers, host-side scoring) is what batching merges saves.

Held-out losses without the routing statistics
    The same forward as ``moejax.eval``'s held-out losses (the run's own batches, per-row sums of
    target log-probabilities), but without the per-layer routing statistics that a merge's
    metrics never read.

Multiple choice with each context run once
    ``moejax.eval`` scores an item's choices as separate rows ``context + choice``, each padded to
    a length bucket, so the context runs once per choice. Here each distinct context (the row
    minus its choice, exactly as :func:`moejax.eval.harness.choice_rows` cuts rows to the model's
    length) runs once through the model's key/value-cache forward (``Transformer.decode``, the
    forward ``moejax.generate`` uses, equal to the full forward up to float rounding), and each
    choice then runs as a continuation over a copy of its context's cache: the choice's first
    token is scored from the context's last logits, the others from the continuation. Contexts and
    continuations are padded to buckets of 8, 12, 16, 24, 32, ... tokens (few compiles), in chunks
    of ``settings.batch_size`` contexts with the contexts of all tasks sorted by length (full
    chunks). Per item that is ``context + sum(choice)`` tokens instead of ``choices x (context +
    choice)`` padded. The task's score (``bench_metric``: the accuracy, or the mean log-probability
    of the gold choice) is then computed from the log-likelihoods as :mod:`moejax.eval.harness`
    does (items grouped by number of choices, :func:`~moejax.eval.harness.multiple_choice_metrics`).

Exact match
    Scored by exact match (``bench_metric="accuracy"``), greedy decoding stays ``moejax.eval``'s
    (:func:`~moejax.eval.harness.score_exact_match`, the evaluator's ``Generator``), merge by merge:
    the same predictions, no speed-up. Scored by ``gold_logprob``, an exact-match task is the
    answer's log-probability after its prompt by teacher forcing, as ``moejax.eval`` computes it
    (:func:`~moejax.eval.harness.answers_as_choices`): its items join the multiple-choice chunks as
    one-choice items, and nothing is decoded.

Same numbers, up to float rounding. The losses and log-likelihoods come from other programs than
``moejax.eval``'s (another grouping of rows, the cache forward's attention), so they agree to
float32 rounding (the tests hold losses to 1e-5 relative), not bit for bit; an accuracy could
differ only where two choices' log-likelihoods tie within that rounding. Within one stack each
merge's numbers do not depend on the other merges in it (each slot runs the same program alone).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from moejax.eval.evaluate import Evaluator, benchmark_score
from moejax.eval.harness import answers_as_choices, choice_rows, multiple_choice_metrics, score_exact_match
from moejax.eval.restore import Checkpoint
from moejax.eval.tasks import EXACT_MATCH, Task
from moejax.model.decode import KVCache, init_cache
from moejax.model.transformer import DTYPES

from data_mixture.mergemix.arithmetic import ROUTERS, merge_params, set_slot, stacked_sharding
from data_mixture.mergemix.objective import check_bench_metric

ROW_KEYS = ("inputs", "targets", "positions", "segment_ids", "loss_mask")
MERGES_PER_CALL = 8  # C: merges merged and scored per compiled call (memory: C copies of the parameters)


def bench_score(result: dict[str, Any], bench_metric: str) -> float:
    """A task's ``bench:<task>`` from its ``moejax.eval`` result under ``bench_metric``; NaN if no item
    was scored."""
    if check_bench_metric(bench_metric) == "accuracy":
        return benchmark_score(result)
    value = result.get("gold_logprob")
    return float("nan") if value is None else float(value)


def width_bucket(n: int) -> int:
    """The smallest of 8, 12, 16, 24, 32, 48, ... (powers of two and 1.5 x them) that is >= n."""
    size = 8
    while True:
        for width in (size, size * 3 // 2):
            if width >= n:
                return width
        size *= 2


# --------------------------------------------------------------------------------------------------
# The jitted functions (one merge's parameters; looped over the stack by _over_stack).


def _row_logprob(params, balance, batch, *, graphdef, balancer) -> dict[str, jax.Array]:
    """Per-row sums of target log-probabilities over ``loss_mask``, and the scored tokens (as
    ``moejax.eval.forward.Scorer`` computes them, without routing statistics)."""
    model = nnx.merge(graphdef, params)
    logits_btv, _ = model(batch["inputs"], batch["positions"], batch["segment_ids"],
                          balancer=balancer if balance else None, balance_state=balance)
    logprob_bt = -optax.softmax_cross_entropy_with_integer_labels(logits_btv, batch["targets"])
    mask_bt = batch["loss_mask"]
    return {"logprob_b": jnp.sum(logprob_bt * mask_bt, axis=-1), "tokens_b": jnp.sum(mask_bt, axis=-1)}


def _choice_logprob(params, balance, chunk, *, graphdef, balancer, model_cfg, dtype) -> jax.Array:
    """Log-likelihood of each choice row ``s`` of a chunk after its context (module docstring).

    ``chunk``: ``context_bp`` (contexts, right-padded), ``context_len_b``, ``source_s`` (the
    context of each choice row), ``choice_st`` (the choice's tokens, right-padded to T + 1) and
    ``choice_len_s`` (0 for padding rows, whose result is 0).
    """
    model = nnx.merge(graphdef, params)
    kw = {"balancer": balancer if balance else None, "balance_state": balance}
    context_bp, context_len_b = chunk["context_bp"], chunk["context_len_b"]
    source_s, choice_st, choice_len_s = chunk["source_s"], chunk["choice_st"], chunk["choice_len_s"]
    width_p, width_t = context_bp.shape[1], choice_st.shape[1] - 1
    cache = init_cache(model_cfg, context_bp.shape[0], width_p + width_t, dtype)
    logits_bpv, cache = model.decode(context_bp, cache, jnp.zeros_like(context_len_b), **kw)
    last_bv = jnp.take_along_axis(logits_bpv, (context_len_b - 1)[:, None, None], axis=1)[:, 0]
    first_s = -optax.softmax_cross_entropy_with_integer_labels(last_bv[source_s], choice_st[:, 0])
    cache_s = KVCache(cache.k_lbskh[:, source_s], cache.v_lbskh[:, source_s])
    logits_stv, _ = model.decode(choice_st[:, :-1], cache_s, context_len_b[source_s], **kw)
    rest_st = -optax.softmax_cross_entropy_with_integer_labels(logits_stv, choice_st[:, 1:])
    mask_st = jnp.arange(width_t)[None, :] < (choice_len_s - 1)[:, None]
    return jnp.where(choice_len_s > 0, first_s + jnp.sum(jnp.where(mask_st, rest_st, 0.0), axis=-1), 0.0)


def _over_stack(fn):
    """``fn(params, balance, batch)`` -> ``f(stack_c, count, balance, batch)``: ``fn`` of each of the
    first ``count`` slots of the stack, outputs stacked [C, ...] (slots past ``count``: zeros)."""

    def run(stack_c, count, balance, batch):
        one = lambda i: jax.tree.map(lambda x: jax.lax.dynamic_index_in_dim(x, i, 0, keepdims=False), stack_c)
        abstract = lambda tree: jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)
        shapes = jax.eval_shape(fn, abstract(one(0)), abstract(balance), abstract(batch))
        capacity = jax.tree.leaves(stack_c)[0].shape[0]
        init = jax.tree.map(lambda s: jnp.zeros((capacity, *s.shape), s.dtype), shapes)

        def body(i, out_c):
            return jax.tree.map(lambda o, x: o.at[i].set(x), out_c, fn(one(i), balance, batch))

        return jax.lax.fori_loop(0, count, body, init)

    return run


# --------------------------------------------------------------------------------------------------
# What is scored: built once per scorer.


@dataclasses.dataclass
class ChoicePlan:
    """Multiple-choice tasks as ``chunks`` (arrays, and the (task, item, choice) of each choice row)
    and the ``tokens`` they run per merge (contexts and choices, no padding)."""

    chunks: list[tuple[dict[str, Any], list[tuple[str, int, int]]]]
    tokens: int


def plan_choices(tasks: Sequence[Task], tokenizer, *, max_len: int, batch_size: int) -> ChoicePlan:
    """The chunks that score every choice of ``tasks`` (module docstring): rows exactly as
    :func:`~moejax.eval.harness.choice_rows` makes them, each distinct context once, contexts of all
    tasks sorted by length and ``batch_size`` to a chunk (so chunks are full and little is padded)."""
    by_context: dict[tuple[int, ...], list[tuple[str, int, int, np.ndarray]]] = {}
    for task in tasks:
        for i, c, ids, n in choice_rows(task, tokenizer, max_len):
            if len(ids) == n:  # a context that encodes to no token (task files refuse empty contexts)
                raise ValueError(f"task {task.name!r} item {i}: its context encodes to no token; score it one "
                                 "merge at a time (merges_per_call=0)")
            by_context.setdefault(tuple(ids[:-n].tolist()), []).append((task.name, i, c, ids[-n:]))
    per_chunk = batch_size * max((len(item["choices"]) for task in tasks for item in task.items), default=1)
    # (context, choices) units, a context shared by more rows than a chunk holds split over chunks
    units = sorted(((ctx, ch[s:s + per_chunk]) for ctx, ch in by_context.items() for s in range(0, len(ch), per_chunk)),
                   key=lambda unit: len(unit[0]))
    chunks, group = [], []
    for context, choices in units:
        if group and (len(group) == batch_size or sum(len(ch) for _, ch in group) + len(choices) > per_chunk):
            chunks.append(_chunk(group, batch_size, per_chunk))
            group = []
        group.append((context, choices))
    if group:
        chunks.append(_chunk(group, batch_size, per_chunk))
    tokens = sum(len(ctx) + sum(len(ids) - 1 for *_, ids in ch) for ctx, ch in units)
    return ChoicePlan(chunks, tokens)


def _chunk(group, batch_size: int, per_chunk: int) -> tuple[dict[str, np.ndarray], list[tuple[str, int, int]]]:
    """Arrays of one chunk of contexts and their choice rows, padded to fixed shapes."""
    width_p = width_bucket(max(len(ctx) for ctx, _ in group))
    width_t = width_bucket(max(len(ids) for _, choices in group for *_, ids in choices) - 1)
    out = {"context_bp": np.zeros((batch_size, width_p), np.int32), "context_len_b": np.ones(batch_size, np.int32),
           "source_s": np.zeros(per_chunk, np.int32), "choice_st": np.zeros((per_chunk, width_t + 1), np.int32),
           "choice_len_s": np.zeros(per_chunk, np.int32)}
    keys, s = [], 0
    for b, (context, choices) in enumerate(group):
        out["context_bp"][b, :len(context)] = context
        out["context_len_b"][b] = len(context)
        for name, i, c, ids in choices:
            out["source_s"][s], out["choice_len_s"][s] = b, len(ids)
            out["choice_st"][s, :len(ids)] = ids
            keys.append((name, i, c))
            s += 1
    return out, keys


def choice_score(task: Task, loglik: dict[tuple[int, int], float], metric: str = "accuracy") -> float:
    """The task's ``metric`` (a key of :func:`~moejax.eval.harness.multiple_choice_metrics` that does
    not read token or byte counts: ``accuracy``, ``gold_logprob``) from its choices' log-likelihoods,
    as :func:`moejax.eval.harness.score_multiple_choice` computes it (NaN if no item was scored)."""
    scored = sorted({i for i, _ in loglik})
    if not scored:
        return float("nan")
    results, weights = [], []
    for num_choices in sorted({len(task.items[i]["choices"]) for i in scored}):
        index = [i for i in scored if len(task.items[i]["choices"]) == num_choices]
        loglik_nc = np.array([[loglik[i, c] for c in range(num_choices)] for i in index])
        ones_nc = np.ones_like(loglik_nc)  # per-token and per-byte variants are not read here
        gold_n = np.array([task.items[i]["gold"] for i in index])
        results.append(multiple_choice_metrics(loglik_nc, ones_nc, ones_nc, gold_n)[metric])
        weights.append(len(index))
    return float(np.average(results, weights=weights))


# --------------------------------------------------------------------------------------------------


class BatchedScorer:
    """Flat metrics of up to ``capacity`` merges of ``merge_set`` per compiled call (module docstring).

    ``evaluator``: a ``moejax.eval`` :class:`Evaluator` of the base run; its tasks, held-out batches
    and settings are what is scored (and its generator decodes exact-match tasks scored by
    accuracy). ``bench_metric``: what ``bench:<task>`` is, one of :data:`.objective.BENCH_METRICS`.
    """

    def __init__(self, merge_set, evaluator: Evaluator, capacity: int = MERGES_PER_CALL,
                 bench_metric: str = "accuracy"):
        if capacity < 1:
            raise ValueError(f"capacity={capacity}: at least one merge per call")
        self.merge_set, self.evaluator, self.capacity = merge_set, evaluator, int(capacity)
        self.bench_metric = check_bench_metric(bench_metric)
        erun, s = merge_set.erun, evaluator.settings
        run = erun.run
        self.mesh = run.mesh
        param_shardings = run.state_shardings["params"]
        self._stack_shardings = jax.tree.map(stacked_sharding, param_shardings)
        self._replicated = NamedSharding(self.mesh, P())
        self._batch_sharding = run.batch_sharding(accum=False)
        self._merge = {
            router: jax.jit(
                jax.vmap(functools.partial(merge_params, router=router), in_axes=(None, None, 0)),
                in_shardings=(param_shardings, self._stack_shardings, self._replicated),
                out_shardings=self._stack_shardings,
            )
            for router in ROUTERS
        }
        self._set = jax.jit(set_slot, donate_argnums=0, out_shardings=self._stack_shardings)
        kw = {"graphdef": run.graphdef, "balancer": run.balancer}
        self._rows = jax.jit(_over_stack(functools.partial(_row_logprob, **kw)), out_shardings=self._replicated)
        self._choices = jax.jit(
            _over_stack(functools.partial(_choice_logprob, model_cfg=erun.cfg.model,
                                          dtype=DTYPES[erun.cfg.train.compute_dtype], **kw)),
            out_shardings=self._replicated,
        )
        self.heldout = [(domain, self._put(batch), int(np.sum(batch["segment_ids"] > 0)))
                        for domain, batches in evaluator.eval_batches.items() for batch in batches]
        self.choice_tasks = [t for t in evaluator.tasks if t.kind != EXACT_MATCH]
        self.exact_tasks = [t for t in evaluator.tasks if t.kind == EXACT_MATCH]
        if self.bench_metric == "gold_logprob":  # the answers by teacher forcing, with the choices
            self.choice_tasks += [answers_as_choices(t) for t in self.exact_tasks]
            self.exact_tasks = []
        plan = plan_choices(self.choice_tasks, erun.tokenizer, max_len=s.max_len, batch_size=s.batch_size)
        self.choice_chunks = [(self._put(arrays), keys) for arrays, keys in plan.chunks]
        self.choice_tokens = plan.tokens

    def _put(self, batch: dict[str, np.ndarray]) -> dict[str, jax.Array]:
        keys = ROW_KEYS if "inputs" in batch else batch.keys()
        return {k: jax.device_put(np.asarray(batch[k]), self._batch_sharding) for k in keys}

    # -- the stack ---------------------------------------------------------------------------------
    def merge(self, alpha_nk: np.ndarray, router: str = "linear") -> Any:
        """A stack holding ``merge_set.merge(alpha_n, router)`` for each row (at most ``capacity``);
        unused slots hold the base."""
        alpha_nk = np.asarray(alpha_nk, np.float32).reshape(-1, self.merge_set.num_experts)
        if len(alpha_nk) > self.capacity:
            raise ValueError(f"{len(alpha_nk)} merges do not fit a stack of {self.capacity}")
        padded = np.zeros((self.capacity, alpha_nk.shape[1]), np.float32)
        padded[:len(alpha_nk)] = alpha_nk
        with jax.set_mesh(self.mesh):
            return self._merge[router](self.merge_set.base.params, self.merge_set.stacked,
                                       jax.device_put(padded, self._replicated))

    def stack(self, params_list: Sequence[Any]) -> Any:
        """A stack holding these parameter sets (each of the base's structure), in order."""
        if not 1 <= len(params_list) <= self.capacity:
            raise ValueError(f"{len(params_list)} parameter sets; a stack holds 1 to {self.capacity}")
        stack_c = self.merge(np.zeros((0, self.merge_set.num_experts)))
        with jax.set_mesh(self.mesh):
            for i, params in enumerate(params_list):
                stack_c = self._set(stack_c, params, jnp.int32(i))
        return stack_c

    # -- scoring -----------------------------------------------------------------------------------
    def metrics(self, stack_c: Any, count: int) -> list[dict[str, float]]:
        """Flat metrics (``loss:<domain>``, ``bench:<task>``, ``eval_tokens``) of the first ``count``
        slots of ``stack_c``, as :func:`.merge.flat_metrics` gives them for one merge."""
        out = self.losses(stack_c, count)
        for m, loglik in enumerate(self.choice_logliks(stack_c, count)):
            out[m].update({f"bench:{t.name}": choice_score(t, loglik[t.name], self.bench_metric)
                           for t in self.choice_tasks})
            out[m]["eval_tokens"] = float(sum(real for *_, real in self.heldout) + self.choice_tokens)
        s, balance = self.evaluator.settings, self.merge_set.base.balance
        for task in self.exact_tasks:  # scored by exact match: moejax.eval's greedy decoding, merge by merge
            for m in range(count):
                ckpt = Checkpoint(self.merge_set.base.step, jax.tree.map(lambda x: x[m], stack_c), balance)
                result, tokens = score_exact_match(self.evaluator.generator, ckpt, task, self.merge_set.erun.tokenizer,
                                                   max_new_tokens=s.max_new_tokens, batch_size=s.batch_size,
                                                   progress=False)
                out[m][f"bench:{task.name}"] = benchmark_score(result)
                out[m]["eval_tokens"] += tokens
        return out

    def losses(self, stack_c: Any, count: int) -> list[dict[str, float]]:
        """``loss:<domain>`` of each merge: nats per scored token over the domain's held-out
        batches, summed as :func:`moejax.eval.losses.heldout_losses` sums them."""
        sums = self.heldout_sums(stack_c, count)
        out: list[dict[str, float]] = [{} for _ in range(count)]
        for domain, sums_mb2 in sums.items():
            for m in range(count):
                nats = tokens = 0.0  # batch by batch, in order
                for batch_nats, batch_tokens in sums_mb2[m]:
                    nats, tokens = nats + float(batch_nats), tokens + float(batch_tokens)
                out[m][f"loss:{domain}"] = nats / max(tokens, 1.0)
        return out

    def heldout_sums(self, stack_c: Any, count: int, batches: int | None = None) -> dict[str, np.ndarray]:
        """Per domain, ``[count, b, 2]`` (float64): each merge's summed nats and scored tokens on
        each of the domain's first ``b`` held-out batches (``batches``, default all of them: the
        evaluator's ``loss_batches``, fewer if the domain has fewer). A domain's loss over its first
        ``k`` batches is what ``loss_batches=k`` gives (the batches are a fixed prefix)."""
        if batches is not None and batches < 1:
            raise ValueError(f"batches={batches}: at least one held-out batch per domain")
        rows: dict[str, list[np.ndarray]] = {d: [] for d in self.evaluator.eval_batches}
        count_ = jax.device_put(np.int32(count), self._replicated)
        with jax.set_mesh(self.mesh):
            for domain, batch, _ in self.heldout:
                if batches is not None and len(rows[domain]) == batches:
                    continue
                got = jax.device_get(self._rows(stack_c, count_, self.merge_set.base.balance, batch))
                rows[domain].append(np.array([(-float(got["logprob_b"][m].sum()), float(got["tokens_b"][m].sum()))
                                              for m in range(count)], np.float64).reshape(count, 2))
        return {d: np.stack(r, axis=1) for d, r in rows.items()}

    def choice_logliks(self, stack_c: Any, count: int) -> list[dict[str, dict[tuple[int, int], float]]]:
        """Per merge, per multiple-choice task, the log-likelihood of each (item, choice) scored."""
        loglik = [{t.name: {} for t in self.choice_tasks} for _ in range(count)]
        count_ = jax.device_put(np.int32(count), self._replicated)
        with jax.set_mesh(self.mesh):
            for chunk, keys in self.choice_chunks:
                values_cs = np.asarray(jax.device_get(self._choices(stack_c, count_, self.merge_set.base.balance, chunk)))
                for m in range(count):
                    for (name, i, c), value in zip(keys, values_cs[m]):
                        loglik[m][name][i, c] = float(value)
        return loglik


@functools.lru_cache(maxsize=1)
def shared_scorer(merge_set, evaluator: Evaluator, capacity: int = MERGES_PER_CALL,
                  bench_metric: str = "accuracy") -> BatchedScorer:
    """The :class:`BatchedScorer` of (merge set, evaluator, capacity, bench metric), built on first
    use: the merge evaluators of the same merges share its compiled functions. Only the latest is
    kept, so an earlier merge set's device memory is freed once another one is scored."""
    return BatchedScorer(merge_set, evaluator, capacity, bench_metric)
