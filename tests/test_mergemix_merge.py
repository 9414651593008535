"""MergeMix merging (data_mixture/mergemix/merge.py): exact vertices, the base router, the evaluation
equal to a saved merged checkpoint's, the cache, and the errors on bad input."""

import dataclasses
import json
import os
import shutil
import time
import types

import jax
import numpy as np
import pytest

from data_mixture.mergemix.arithmetic import is_router_path
from data_mixture.mergemix.merge import (
    MergeEvaluator, MergeMismatch, MergeSet, check_alpha, compatibility_problems, flat_metrics,
)
from data_mixture.mergemix.objective import SearchError
from moejax.errors import ConfigError
from moejax.eval.evaluate import Evaluator, make_settings
from moejax.eval.restore import EvalRun, open_run
from moejax.train.checkpoint import Checkpointer
from tests.mergemix_fixture import BASE_STEP, EXPERT_DOMAINS, EXPERT_STEPS, mergemix_runs  # noqa: F401

TASKS = ["know_chars", "prose_swap"]  # two built-in multiple-choice tasks (no generator to compile)


def _experts(runs: str, step: int = EXPERT_STEPS[-1]) -> dict:
    return {d: (os.path.join(runs, "experts", d), step) for d in EXPERT_DOMAINS}


@pytest.fixture(scope="module")
def merge_set(mergemix_runs):
    return MergeSet.open(os.path.join(mergemix_runs, "base"), BASE_STEP, _experts(mergemix_runs))


@pytest.fixture(scope="module")
def settings(merge_set):
    return make_settings(merge_set.erun, max_items=4, loss_batches=1, tasks=TASKS)


@pytest.fixture(scope="module")
def evaluator(merge_set, settings):
    """One Evaluator of the base run, shared by the module's MergeEvaluators (compiled once)."""
    return Evaluator(merge_set.erun, settings, progress=False)


def _bits(x) -> np.ndarray:
    x = np.asarray(x)
    return x.view(np.dtype(f"u{x.dtype.itemsize}"))


def _bit_equal(a, b) -> dict:
    """{parameter path: bit-for-bit equal} over two params trees of the same structure."""
    flat_a, flat_b = jax.tree_util.tree_flatten_with_path(a)[0], jax.tree.leaves(b)
    assert len(flat_a) == len(flat_b)
    return {jax.tree_util.keystr(p): np.array_equal(_bits(x), _bits(y)) for (p, x), y in zip(flat_a, flat_b)}


def test_vertices_and_zero_are_exact_and_sharded_like_the_base(merge_set, mergemix_runs):
    assert merge_set.domains == EXPERT_DOMAINS
    for k, domain in enumerate(EXPERT_DOMAINS):
        # The expert straight from its own checkpoint on disk, not through the stack.
        on_disk = open_run(os.path.join(mergemix_runs, "experts", domain)).load(EXPERT_STEPS[-1]).params
        assert all(_bit_equal(merge_set.expert(domain).params, on_disk).values())
        merged = merge_set.merge(np.eye(len(EXPERT_DOMAINS))[k])
        equal = _bit_equal(merged, on_disk)
        assert all(equal.values()), [name for name, ok in equal.items() if not ok]
    zero = merge_set.merge(np.zeros(len(EXPERT_DOMAINS)))
    assert all(_bit_equal(zero, merge_set.base.params).values())
    # The naive base + 1.0 * (expert - base) in float32 misses some bits: the exactness is not free.
    expert0 = merge_set.expert(0).params
    naive = jax.tree.map(lambda b, e: np.asarray(b) + np.float32(1) * (np.asarray(e) - np.asarray(b)),
                         merge_set.base.params, expert0)
    assert not all(_bit_equal(naive, expert0).values())
    # Output shardings are the base's parameter shardings.
    shardings = merge_set.erun.run.state_shardings["params"]
    for leaf, want in zip(jax.tree.leaves(zero), jax.tree.leaves(shardings)):
        assert leaf.sharding.is_equivalent_to(want, leaf.ndim)
    # The stacked experts: leading K axis unsharded, the rest like the parameter.
    for leaf, want in zip(jax.tree.leaves(merge_set.stacked), jax.tree.leaves(shardings)):
        assert leaf.shape[0] == len(EXPERT_DOMAINS) and tuple(leaf.sharding.spec) == (None, *want.spec)


def test_merge_on_a_sharded_mesh_reshards_the_experts_and_stays_exact(mergemix_runs, tmp_path):
    # The base copied with an fsdp x expert mesh (the experts keep their data-parallel one): the
    # experts are placed in the base's layout, stacked with the K axis unsharded, and stay exact.
    base = str(tmp_path / "base_fsdp")
    shutil.copytree(os.path.join(mergemix_runs, "base"), base)
    for step in os.listdir(os.path.join(base, "checkpoints")):
        meta_path = os.path.join(base, "checkpoints", step, "meta", "metadata")
        if os.path.isfile(meta_path):
            with open(meta_path) as f:
                meta = json.load(f)
            meta["config"]["mesh"].update(fsdp=2, expert=2)
            with open(meta_path, "w") as f:
                json.dump(meta, f)
    sharded = MergeSet.open(base, BASE_STEP, _experts(mergemix_runs))
    assert dict(sharded.erun.run.mesh.shape) == {"data": 2, "fsdp": 2, "expert": 2, "tensor": 1}
    shardings = sharded.erun.run.state_shardings["params"]
    specs = [tuple(s.spec) for s in jax.tree.leaves(shardings)]
    assert any("fsdp" in str(spec) for spec in specs) and any("expert" in str(spec) for spec in specs)
    for leaf, want in zip(jax.tree.leaves(sharded.stacked), jax.tree.leaves(shardings)):
        assert tuple(leaf.sharding.spec) == (None, *want.spec)
    for k, domain in enumerate(EXPERT_DOMAINS):
        on_disk = open_run(os.path.join(mergemix_runs, "experts", domain)).load(EXPERT_STEPS[-1]).params
        merged = sharded.merge(np.eye(len(EXPERT_DOMAINS))[k])
        assert all(_bit_equal(merged, on_disk).values())
        for leaf, want in zip(jax.tree.leaves(merged), jax.tree.leaves(shardings)):
            assert leaf.sharding.is_equivalent_to(want, leaf.ndim)
    assert all(_bit_equal(sharded.merge([0.0, 0.0], router="base"), sharded.base.params).values())


def test_interior_merge_is_the_formula_and_alpha_is_traced(merge_set):
    alpha = np.array([0.3, 0.45])  # any finite vector, not only the simplex
    merged = merge_set.merge(alpha)
    base, experts = merge_set.base.params, [merge_set.expert(k).params for k in range(2)]
    for m, b, e0, e1 in zip(*map(jax.tree.leaves, (merged, base, *experts))):
        b64 = np.asarray(b, np.float64)
        want = b64 + alpha[0] * (np.asarray(e0, np.float64) - b64) + alpha[1] * (np.asarray(e1, np.float64) - b64)
        np.testing.assert_allclose(np.asarray(m), want, rtol=1e-6, atol=1e-7)
    for a in ([0.1, 0.9], [1.0, 0.0], [0.0, 0.0], [2.0, -1.0]):
        merge_set.merge(a)
    assert merge_set._merge["linear"]._cache_size() == 1  # one compile for every alpha


def test_base_router_keeps_the_base_router_leaves(merge_set):
    alpha = [0.5, 0.5]
    linear, kept = merge_set.merge(alpha), merge_set.merge(alpha, router="base")
    flat_kept = jax.tree_util.tree_flatten_with_path(kept)[0]
    routers = [is_router_path(p) for p, _ in flat_kept]
    # The fixture's 2 MoE layers are one scanned run: one router leaf, w_de [L, d, E] (no router bias).
    assert [jax.tree_util.keystr(p) for (p, _), r in zip(flat_kept, routers) if r] == [
        jax.tree_util.keystr(p) for p, _ in flat_kept if jax.tree_util.keystr(p).endswith("['router']['w_de']")]
    assert sum(routers) == 1
    for is_router, (path, x), b, lin in zip(routers, flat_kept, jax.tree.leaves(merge_set.base.params),
                                            jax.tree.leaves(linear)):
        if is_router:
            assert np.array_equal(_bits(x), _bits(b)), jax.tree_util.keystr(path)
            assert not np.array_equal(np.asarray(lin), np.asarray(b))  # the linear merge moves it
        else:
            assert np.array_equal(_bits(x), _bits(lin)), jax.tree_util.keystr(path)


def _save_as_checkpoint(source_workdir: str, step: int, params, target: str) -> None:
    """A copy of ``source_workdir`` whose checkpoint ``step`` holds ``params`` (the rest of its
    train state, data state and metadata unchanged), written by moejax's own Checkpointer."""
    shutil.copytree(source_workdir, target)
    erun = open_run(target)
    ckpt_dir = os.path.join(target, "checkpoints")
    checkpointer = Checkpointer(ckpt_dir, max_to_keep=10)
    restored = checkpointer.restore(step, erun.run.abstract_state)
    checkpointer.close()
    shutil.rmtree(os.path.join(ckpt_dir, str(step)))
    checkpointer = Checkpointer(ckpt_dir, max_to_keep=10)
    checkpointer.save(step, {**restored.state, "params": params}, restored.data, restored.meta)
    checkpointer.close()


def test_merged_evaluation_equals_evaluating_a_saved_merged_checkpoint(merge_set, settings, evaluator, tmp_path):
    alpha = np.array([0.3, 0.7])
    # merge by merge through moejax.eval: exactly its numbers (the batched scorer's equal them up to
    # float rounding and run fewer tokens: tests/test_mergemix_batched.py)
    merge_eval = MergeEvaluator(merge_set, settings, evaluator=evaluator, merges_per_call=0)
    got = merge_eval.evaluate(alpha)
    target = str(tmp_path / "merged_run")
    _save_as_checkpoint(merge_set.erun.workdir, BASE_STEP, merge_set.merge(alpha), target)
    saved = open_run(target)
    result = Evaluator(saved, make_settings(saved, max_items=4, loss_batches=1, tasks=TASKS),
                       progress=False).evaluate(saved.load(BASE_STEP))
    want = flat_metrics(result)
    assert set(want) == ({f"loss:{d}" for d in merge_set.erun.dataset.domains} | {f"bench:{t}" for t in TASKS}
                         | {"eval_tokens"})
    assert {k: got[k] for k in want} == want
    # The continuous benchmark metric: each bench:<task> is the saved checkpoint's gold_logprob, exactly.
    gold = MergeEvaluator(merge_set, settings, evaluator=evaluator, merges_per_call=0,
                          bench_metric="gold_logprob").evaluate(alpha)
    assert {t: gold[f"bench:{t}"] for t in TASKS} == {t: result["benchmarks"][t]["gold_logprob"] for t in TASKS}
    assert {k: gold[k] for k in want if not k.startswith("bench:")} == {k: v for k, v in want.items()
                                                                       if not k.startswith("bench:")}
    # And the merge differs from the base (the comparison is not between two copies of the base).
    base = flat_metrics(evaluator.evaluate(merge_set.base))
    assert any(base[k] != want[k] for k in want if k.startswith("loss:"))


def test_cache_never_recomputes_in_memory_or_from_the_file(merge_set, settings, evaluator, tmp_path):
    path = str(tmp_path / "cache.jsonl")
    first = MergeEvaluator(merge_set, settings, cache_path=path, evaluator=evaluator)
    a = first.evaluate([0.25, 0.75])
    assert (first.merges_evaluated, first.cache_hits) == (1, 0) and a["seconds"] > 0
    assert first.evaluate(np.array([0.25, 0.75]) + 1e-12) == a  # same key after rounding to 1e-9
    assert (first.merges_evaluated, first.cache_hits) == (1, 1)
    b = first.evaluate([0.25, 0.75], router="base")  # another key
    assert (first.merges_evaluated, first.cache_hits) == (2, 1)
    # params= (e.g. a calibrated router's) must name its treatment, and is keyed apart.
    with pytest.raises(ConfigError, match="key_extra"):
        first.evaluate([1.0, 0.0], params=merge_set.expert(0).params)
    c = first.evaluate([1.0, 0.0], params=merge_set.expert(0).params, key_extra="expert0")
    d = first.evaluate([1.0, 0.0])  # the plain merge at e_0 is expert 0: the same numbers, its own entry
    assert {k: v for k, v in d.items() if k != "seconds"} == {k: v for k, v in c.items() if k != "seconds"}
    assert (first.merges_evaluated, first.cache_hits) == (4, 1)
    with open(path) as f:
        assert len(f.read().splitlines()) == 4
    # A rerun reads the file: nothing is recomputed.
    second = MergeEvaluator(merge_set, settings, cache_path=path, evaluator=evaluator)
    assert second.evaluate([0.25, 0.75]) == a and second.evaluate([0.25, 0.75], router="base") == b
    assert second.evaluate([1.0, 0.0], key_extra="expert0") == c and second.evaluate([1.0, 0.0]) == d
    assert (second.merges_evaluated, second.cache_hits) == (0, 4)
    with pytest.raises(ConfigError, match="no cached evaluation .* key_extra='harc'"):
        second.evaluate([1.0, 0.0], key_extra="harc")  # a key_extra without params only reads
    # A last line cut by a kill mid-write is dropped (recomputed), and the next entry starts a new line.
    with open(path, "a") as f:
        f.write('{"context_id": "')
    third = MergeEvaluator(merge_set, settings, cache_path=path, evaluator=evaluator)
    e = third.evaluate([0.5, 0.5])
    assert (third.merges_evaluated, third.cache_hits) == (1, 0)
    with open(path) as f:
        lines = f.read().splitlines()
    assert len(lines) == 5 and json.loads(lines[-1])["alpha"] == [0.5, 0.5]
    assert MergeEvaluator(merge_set, settings, cache_path=path, evaluator=evaluator).evaluate([0.5, 0.5]) == e
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n")
    with pytest.raises(ConfigError, match="bad.jsonl line 1 is not a cache entry"):
        MergeEvaluator(merge_set, settings, cache_path=str(bad), evaluator=evaluator)
    # A file of other settings is refused, naming what differs.
    other = dataclasses.replace(settings, max_items=2)
    with pytest.raises(ConfigError, match="settings.max_items: file 4 vs this evaluator 2"):
        MergeEvaluator(merge_set, other, cache_path=path)
    # Another number of held-out batches (--loss-batches) too: its losses are other numbers.
    with pytest.raises(ConfigError, match="settings.loss_batches: file 1 vs this evaluator 2"):
        MergeEvaluator(merge_set, dataclasses.replace(settings, loss_batches=2), cache_path=path)


def test_cache_never_mixes_benchmark_metrics(merge_set, settings, evaluator, tmp_path):
    path = str(tmp_path / "cache.jsonl")
    accuracy = MergeEvaluator(merge_set, settings, cache_path=path, evaluator=evaluator)
    accuracy.evaluate([0.25, 0.75])
    # The default metric keeps the cache identity of files written before the choice existed.
    assert "bench_metric" not in accuracy.context and json.loads(open(path).readline())["context_id"] == (
        MergeEvaluator(merge_set, settings, evaluator=evaluator, bench_metric="accuracy")._context_id)
    with pytest.raises(ConfigError, match="holds benchmark scores .* as accuracy, but this evaluator scores them as "
                                          "gold_logprob .* --bench-metric accuracy to reuse this one"):
        MergeEvaluator(merge_set, settings, cache_path=path, evaluator=evaluator, bench_metric="gold_logprob")
    gold_path = str(tmp_path / "gold.jsonl")
    MergeEvaluator(merge_set, settings, cache_path=gold_path, evaluator=evaluator, merges_per_call=0,
                   bench_metric="gold_logprob").evaluate([0.25, 0.75])
    with pytest.raises(ConfigError, match="as gold_logprob, but this evaluator scores them as accuracy"):
        MergeEvaluator(merge_set, settings, cache_path=gold_path, evaluator=evaluator)
    # Held-out losses alone do not depend on the metric: one cache serves both.
    losses_only = dataclasses.replace(settings, tasks=())
    assert (MergeEvaluator(merge_set, losses_only, bench_metric="gold_logprob")._context_id
            == MergeEvaluator(merge_set, losses_only)._context_id)
    with pytest.raises(SearchError, match="bench_metric='bpb' is unknown; allowed: accuracy, gold_logprob"):
        MergeEvaluator(merge_set, settings, evaluator=evaluator, bench_metric="bpb")


def test_merge_and_evaluate_seconds(merge_set, settings, evaluator):
    """Prints one merge + evaluation after compile (run with -s); the number goes in the report."""
    merge_eval = MergeEvaluator(merge_set, settings, evaluator=evaluator)
    merge_eval.evaluate([0.6, 0.4])  # compiled already by the other tests, or here
    start = time.perf_counter()
    metrics = merge_eval.evaluate([0.4, 0.6])
    seconds = time.perf_counter() - start
    print(f"\nmerge + evaluate after compile: {seconds:.3f} s (metrics['seconds']={metrics['seconds']:.3f}; "
          f"{settings.loss_batches} held-out batch per domain, {len(TASKS)} tasks x {settings.max_items} items)")
    assert merge_eval.merges_evaluated == 2 and set(metrics) >= {"seconds", *(f"bench:{t}" for t in TASKS)}


def test_check_alpha():
    domains = ["code", "math", "prose"]
    np.testing.assert_array_equal(check_alpha([0.2, 0.3, 0.5], domains), [0.2, 0.3, 0.5])
    np.testing.assert_array_equal(check_alpha({"prose": 0.5, "code": 0.2, "math": 0.3}, domains), [0.2, 0.3, 0.5])
    check_alpha([0.2, 0.3, 0.5 + 5e-7], domains)  # within 1e-6
    cases = [
        ([0.5, 0.5], "2 entries.*3"),
        ([0.5, -0.1, 0.6], r"alpha\['math'\] = -0.1 is negative"),
        ([0.5, float("nan"), 0.5], r"alpha\['math'\] = nan is not finite"),
        ([0.5, float("inf"), 0.5], r"alpha\['math'\] = inf is not finite"),
        ([0.5, 0.3, 0.3], "sums to 1.1"),
        ([0.5, "x", 0.5], r"alpha\['math'\] = 'x' is not a number"),
        ({"code": 0.5, "math": 0.5}, "no weight for domain 'prose'"),
        ({"code": 0.5, "math": 0.5, "prose": 0.0, "web": 0.0}, "domain 'web', which has no expert"),
    ]
    for alpha, message in cases:
        with pytest.raises(ConfigError, match=message):
            check_alpha(alpha, domains)


def test_merge_input_errors(merge_set):
    with pytest.raises(ConfigError, match="needs 2 weights"):
        merge_set.merge([1.0, 0.0, 0.0])
    with pytest.raises(ConfigError, match=r"alpha\['math'\] is not finite"):
        merge_set.merge([0.5, float("nan")])
    with pytest.raises(ConfigError, match="router='harc' is unknown; allowed: linear, base"):
        merge_set.merge([0.5, 0.5], router="harc")
    with pytest.raises(ConfigError, match="no expert for domain 'prose'"):
        merge_set.expert("prose")


def test_architecture_mismatch_names_keys_and_parameters_before_loading(mergemix_runs, tmp_path, monkeypatch):
    # A copy of the math expert that says it has 2 experts and top-1 routing: its config differs
    # from the base's (and its weights would not even fit that model, so a load before the check
    # would fail with another error).
    other = str(tmp_path / "other")
    shutil.copytree(os.path.join(mergemix_runs, "experts", "math"), other)
    for step in EXPERT_STEPS:
        meta_path = os.path.join(other, "checkpoints", str(step), "meta", "metadata")
        with open(meta_path) as f:
            meta = json.load(f)
        meta["config"]["model"]["moe"]["num_experts"] = 2
        meta["config"]["model"]["moe"]["experts_per_token"] = 1
        with open(meta_path, "w") as f:
            json.dump(meta, f)

    def no_load(self, step=None):
        raise AssertionError(f"weights of {self.workdir} were loaded before the compatibility check")

    monkeypatch.setattr(EvalRun, "load", no_load)
    experts = {"code": (os.path.join(mergemix_runs, "experts", "code"), EXPERT_STEPS[-1]), "math": (other, 4)}
    with pytest.raises(MergeMismatch) as info:
        MergeSet.open(os.path.join(mergemix_runs, "base"), BASE_STEP, experts)
    message = str(info.value)
    assert "expert 'code'" not in message  # the compatible expert is not blamed
    for needle in ("expert 'math'", "config model.moe.num_experts: base 4 vs expert 2",
                   "config model.moe.experts_per_token: base 2 vs expert 1",
                   "parameter layers/0/mlp/router/w_de: expert (2, 32, 2) vs base (2, 32, 4)",
                   "parameter layers/0/mlp/w_gate_edf: expert (2, 2, 32, 16) vs base (2, 4, 32, 16)"):
        assert needle in message, (needle, message)
    # A missing step is named too, in the same pass.
    with pytest.raises(MergeMismatch, match=r"expert 'code' .* has no checkpoint at step 3; steps: \[2, 4\]"):
        MergeSet.open(os.path.join(mergemix_runs, "base"), BASE_STEP,
                      {"code": (os.path.join(mergemix_runs, "experts", "code"), 3)})
    with pytest.raises(ConfigError, match="no checkpoint at step 5"):
        MergeSet.open(os.path.join(mergemix_runs, "base"), 5, _experts(mergemix_runs))
    with pytest.raises(ConfigError, match="at least one expert"):
        MergeSet.open(os.path.join(mergemix_runs, "base"), BASE_STEP, {})


def test_tokenizer_mismatch_is_named(merge_set):
    expert = merge_set.expert_runs[0]
    other = dataclasses.replace(expert, tokenizer=types.SimpleNamespace(name="bpe-4096-other"))
    problems = compatibility_problems(merge_set.erun, other)
    assert len(problems) == 1 and "tokenizer mismatch" in problems[0] and "bpe-4096-other" in problems[0]
    assert compatibility_problems(merge_set.erun, expert) == []
