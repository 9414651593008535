"""Batched merge evaluation (data_mixture/mergemix/batched.py): the same scores as evaluating merges one
at a time through moejax.eval, whatever the grouping, and a search through it that writes the same
cache entries and scores."""

import json
import os

import numpy as np
import pytest

from data_mixture.mergemix.batched import BatchedScorer, plan_choices, width_bucket
from data_mixture.mergemix.merge import MergeEvaluator, MergeSet
from data_mixture.mergemix.search import mergemix_search
from moejax.eval.evaluate import Evaluator, make_settings
from moejax.eval.harness import choice_logliks
from moejax.eval.restore import Checkpoint
from moejax.eval.tasks import Task
from tests.mergemix_fixture import BASE_STEP, EXPERT_DOMAINS, EXPERT_STEPS, mergemix_runs  # noqa: F401

LOSS_RTOL = 1e-5  # losses: float32 rounding of other programs (grouping of rows, the cache forward)
ALPHAS = np.array([[0.3, 0.7], [1.0, 0.0], [0.8, 0.2]])


@pytest.fixture(scope="module")
def merge_set(mergemix_runs):
    experts = {d: (os.path.join(mergemix_runs, "experts", d), EXPERT_STEPS[-1]) for d in EXPERT_DOMAINS}
    return MergeSet.open(os.path.join(mergemix_runs, "base"), BASE_STEP, experts)


@pytest.fixture(scope="module")
def task_files(tmp_path_factory):
    """A multiple-choice file whose contexts are longer than the model's 64 tokens (rows cut from the
    left, by another amount per choice length) and an exact-match file."""
    path = tmp_path_factory.mktemp("tasks")
    text = "the quick brown fox jumps over the lazy dog; " * 3
    (path / "long.jsonl").write_text("".join(
        json.dumps({"context": text[i:], "choices": [" over", " the lazy dog", " fox"], "gold": g}) + "\n"
        for i, g in ((0, 0), (5, 1), (11, 2))))
    (path / "sums.jsonl").write_text("".join(
        json.dumps({"prompt": f"Q: What is {a} + {b}?\nA:", "answer": f" {a + b}"}) + "\n" for a, b in ((2, 3), (10, 7))))
    return [str(path / "long.jsonl"), str(path / "sums.jsonl")]


@pytest.fixture(scope="module")
def evaluator(merge_set, task_files):
    """A built-in multiple-choice task and the long-context file (the exact-match file has its own test)."""
    settings = make_settings(merge_set.erun, max_items=4, loss_batches=1, tasks=["know_chars", task_files[0]])
    return Evaluator(merge_set.erun, settings, progress=False)


def _assert_same_scores(got: dict, want: dict) -> None:
    assert set(got) == set(want)
    for key in want:
        if key.startswith("loss:"):
            assert got[key] == pytest.approx(want[key], rel=LOSS_RTOL), key
        elif key.startswith("bench:"):
            assert got[key] == want[key], key  # accuracies and exact matches: equal


def test_batched_scores_equal_one_at_a_time(merge_set, evaluator):
    one = MergeEvaluator(merge_set, evaluator.settings, evaluator=evaluator, merges_per_call=0)
    batched = MergeEvaluator(merge_set, evaluator.settings, evaluator=evaluator, merges_per_call=2)
    want = [one.evaluate(a) for a in ALPHAS]
    got = batched.evaluate_many(ALPHAS)  # two calls: 2 merges, then 1
    assert (batched.merges_evaluated, batched.cache_hits) == (3, 0)
    for g, w in zip(got, want):
        _assert_same_scores(g, w)
        assert 0 < g["eval_tokens"] < w["eval_tokens"]  # each context runs once, unpadded
    assert len({g["loss:code"] for g in got}) == len(got)  # the merges differ
    # Every choice's log-likelihood is moejax.eval's, to float32 rounding.
    scorer = batched.scorer
    logliks = scorer.choice_logliks(scorer.merge(ALPHAS[:1]), 1)[0]
    ckpt = Checkpoint(BASE_STEP, merge_set.merge(ALPHAS[0]), merge_set.base.balance)
    for task in evaluator.tasks:
        want_ic = choice_logliks(evaluator.scorer, ckpt, task, merge_set.erun.tokenizer, max_len=evaluator.settings.max_len,
                                 batch_size=evaluator.settings.batch_size, progress=False)[0]
        assert set(logliks[task.name]) == set(want_ic)
        for key, value in want_ic.items():
            assert logliks[task.name][key] == pytest.approx(value, rel=LOSS_RTOL, abs=1e-4), (task.name, key)
    # A merge's numbers do not depend on the merges scored with it.
    alone = MergeEvaluator(merge_set, evaluator.settings, evaluator=evaluator, merges_per_call=2)
    assert {k: v for k, v in alone.evaluate(ALPHAS[1]).items() if k != "seconds"} == {
        k: v for k, v in got[1].items() if k != "seconds"}
    # The base router and explicit parameters go through the same scorer.
    _assert_same_scores(batched.evaluate([0.3, 0.7], router="base"), one.evaluate([0.3, 0.7], router="base"))
    expert = merge_set.expert(0).params
    _assert_same_scores(batched.evaluate([1.0, 0.0], params=expert, key_extra="expert0"), want[1])
    # Repeats within one request count as cache hits, as they would one at a time.
    again = batched.evaluate_many([ALPHAS[0], [0.25, 0.75], [0.25, 0.75]])
    assert again[0] == got[0] and again[1] == again[2]
    assert batched.merges_evaluated == 3 + 2 + 1 and batched.cache_hits == 2


def test_each_context_runs_once_and_is_cut_like_moejax_eval_rows(merge_set, evaluator):
    tokenizer, s = merge_set.erun.tokenizer, evaluator.settings
    items = ({"context": "one two", "choices": [" x", " yy", " zzz"], "gold": 0},
             {"context": "one two", "choices": [" x", " w"], "gold": 1},  # same context as item 0
             {"context": "three", "choices": [" a", " b"], "gold": 0})
    # A context cut to the model's length keeps max_len + 1 - len(choice) tokens, as moejax.eval's rows.
    long = ({"context": "z" * 100, "choices": [" a", " bcd"], "gold": 0},)
    tasks = [Task("t", "multiple_choice", items, "-"), Task("l", "multiple_choice", long, "-")]
    plan = plan_choices(tasks, tokenizer, max_len=s.max_len, batch_size=s.batch_size)
    assert len(plan.chunks) == 1  # contexts of both tasks in one chunk
    arrays, keys = plan.chunks[0]
    assert sorted(keys) == [("l", 0, 0), ("l", 0, 1), ("t", 0, 0), ("t", 0, 1), ("t", 0, 2), ("t", 1, 0),
                            ("t", 1, 1), ("t", 2, 0), ("t", 2, 1)]
    assert arrays["context_len_b"][:4].tolist() == [5, 7, s.max_len + 1 - 4, s.max_len + 1 - 2]  # by length
    assert plan.tokens == (len("one two") + len("three") + 2 * s.max_len - 4
                           + sum(len(c) - 1 for it in items + long for c in it["choices"]))
    assert [width_bucket(n) for n in (1, 8, 9, 13, 17, 25, 33, 49, 65, 200)] == [8, 8, 12, 16, 24, 32, 48, 64, 96, 256]


def test_heldout_sums_are_per_batch_and_a_prefix_is_fewer_loss_batches(merge_set):
    """Per-batch held-out sums add up to the losses, and the first k batches of a scorer of more
    batches give exactly the losses of a scorer built with loss_batches=k."""
    def scorer(loss_batches):
        settings = make_settings(merge_set.erun, tasks=[], loss_batches=loss_batches)
        return BatchedScorer(merge_set, Evaluator(merge_set.erun, settings, progress=False), capacity=2)

    two, one = scorer(2), scorer(1)
    stack = two.merge(ALPHAS[:2])
    sums = two.heldout_sums(stack, 2)
    assert set(sums) == set(merge_set.erun.dataset.domains)
    assert all(s.shape == (2, 2, 2) and np.all(s[..., 1] > 0) for s in sums.values())
    losses = two.losses(stack, 2)
    for m in range(2):
        for d, s in sums.items():
            assert losses[m][f"loss:{d}"] == pytest.approx(s[m, :, 0].sum() / s[m, :, 1].sum(), rel=1e-12)
    first = two.heldout_sums(stack, 2, batches=1)
    assert all(np.array_equal(first[d], s[:, :1]) for d, s in sums.items())
    got = one.losses(one.merge(ALPHAS[:2]), 2)
    want = [{f"loss:{d}": s[m, 0, 0] / s[m, 0, 1] for d, s in sums.items()} for m in range(2)]
    assert got == want
    with pytest.raises(ValueError, match="batches=0"):
        two.heldout_sums(stack, 2, batches=0)


class _Requests:
    """A MergeEvaluator as the search sees it, recording how many merges each request asked for."""

    def __init__(self, evaluator):
        self.evaluator, self.sizes = evaluator, []

    def __call__(self, alpha_k):
        self.sizes.append(1)
        return self.evaluator.evaluate(alpha_k)

    def evaluate_many(self, alpha_nk):
        self.sizes.append(len(alpha_nk))
        return self.evaluator.evaluate_many(alpha_nk)


def test_search_through_the_batched_path_writes_the_same_cache(merge_set, evaluator, tmp_path):
    def search(merges_per_call, batched):
        path = str(tmp_path / f"cache_{merges_per_call}.jsonl")
        ev = MergeEvaluator(merge_set, evaluator.settings, evaluator=evaluator, cache_path=path,
                            merges_per_call=merges_per_call)
        requests = _Requests(ev)
        result = mergemix_search(requests if batched else requests.__call__, EXPERT_DOMAINS, budget=6, n_seeds=4,
                                 verify_per_round=1, seed=0)
        with open(path) as f:
            return result, requests.sizes, [json.loads(line) for line in f]

    want, sizes_one, lines_one = search(0, batched=False)
    got, sizes_batched, lines_batched = search(2, batched=True)
    assert sizes_one == [1] * 6 and sizes_batched == [4, 1, 1]  # the seed design, then each round
    assert [t["alpha"] for t in got.trace] == [t["alpha"] for t in want.trace]
    assert [t["score"] for t in got.trace] == [t["score"] for t in want.trace]
    assert got.best_alpha.tolist() == want.best_alpha.tolist()
    assert len(lines_batched) == len(lines_one) == 6
    for a, b in zip(lines_batched, lines_one):
        assert (a["context_id"], a["alpha"], a["router"], a["key_extra"]) == (
            b["context_id"], b["alpha"], b["router"], b["key_extra"])
        _assert_same_scores(a["metrics"], b["metrics"])
    # Either file serves the other way of scoring: the same context, nothing recomputed.
    reread = MergeEvaluator(merge_set, evaluator.settings, evaluator=evaluator,
                            cache_path=str(tmp_path / "cache_0.jsonl"), merges_per_call=2)
    reread.evaluate_many([t["alpha"] for t in want.trace])
    assert (reread.merges_evaluated, reread.cache_hits) == (0, 6)


def test_exact_match_tasks_are_decoded_as_moejax_eval_does(merge_set, task_files):
    settings = make_settings(merge_set.erun, max_items=2, loss_batches=1, tasks=[task_files[1]])
    evaluator = Evaluator(merge_set.erun, settings, progress=False)
    one = MergeEvaluator(merge_set, settings, evaluator=evaluator, merges_per_call=0)
    batched = MergeEvaluator(merge_set, settings, evaluator=evaluator, merges_per_call=2)
    for got, want in zip(batched.evaluate_many(ALPHAS[:1]), (one.evaluate(a) for a in ALPHAS[:1])):
        _assert_same_scores(got, want)
        assert "bench:sums" in got
        assert got["eval_tokens"] <= want["eval_tokens"]  # moejax.eval may also score the answers (gold_logprob)


def test_gold_logprob_equals_one_at_a_time_and_decodes_nothing(merge_set, task_files, monkeypatch):
    """``bench_metric="gold_logprob"``: every bench:<task> (multiple choice, and exact match by its
    teacher-forced answer) is moejax.eval's gold_logprob, both ways, and the batched path decodes nothing."""
    from data_mixture.mergemix import batched as batched_lib

    settings = make_settings(merge_set.erun, max_items=2, loss_batches=1, tasks=["know_chars", *task_files])
    evaluator = Evaluator(merge_set.erun, settings, progress=False)
    one = MergeEvaluator(merge_set, settings, evaluator=evaluator, merges_per_call=0, bench_metric="gold_logprob")
    want = [one.evaluate(a) for a in ALPHAS[:2]]
    # merge by merge: exactly the Evaluator's own gold_logprob of each task (exact match: its answers)
    result = evaluator.evaluate(Checkpoint(BASE_STEP, merge_set.merge(ALPHAS[0]), merge_set.base.balance))
    assert {t: want[0][f"bench:{t}"] for t in ("know_chars", "long", "sums")} == {
        t: result["benchmarks"][t]["gold_logprob"] for t in ("know_chars", "long", "sums")}
    assert all(v < 0 for k, v in want[0].items() if k.startswith("bench:"))  # log-probabilities, not accuracies

    def no_decoding(*args, **kwargs):
        raise AssertionError("the gold_logprob path decoded an exact-match task")

    monkeypatch.setattr(batched_lib, "score_exact_match", no_decoding)
    batched = MergeEvaluator(merge_set, settings, evaluator=evaluator, merges_per_call=2, bench_metric="gold_logprob")
    got = batched.evaluate_many(ALPHAS[:2])
    for g, w in zip(got, want):
        assert set(g) == set(w)
        for key in w:
            if key.startswith(("loss:", "bench:")):
                assert g[key] == pytest.approx(w[key], rel=LOSS_RTOL, abs=1e-4), key
        assert 0 < g["eval_tokens"] < w["eval_tokens"]
    assert got[0]["bench:know_chars"] != got[1]["bench:know_chars"]  # the merges differ
