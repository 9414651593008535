"""benchmarks-v2 (moejax/eval/benchmarks/v2.py): deterministic, graded, answerable from the train
split, v1 unchanged, and scored by moejax.eval on a tiny model (default version from the config)."""
import collections
import hashlib
import platform
import re

import numpy as np
import pytest

from moejax.checks import validate
from moejax.config import default_config
from moejax.errors import ConfigError
from moejax.data.corpus import load_tokenized_corpus
from moejax.data.synthetic_knowledge import TEMPLATES, build_world
from moejax.eval.benchmarks import VERSIONS, load_benchmarks, task_names
from moejax.eval.benchmarks import v2
from moejax.eval.evaluate import Evaluator, make_settings
from moejax.eval.tasks import resolve_tasks
from tests.test_benchmarks import ORIGINAL_SHA256
from tests.test_eval import ckpt, erun, workdir  # noqa: F401 (shared fixtures: the tiny eval run)

# benchmarks-v1 as committed before v2 existed (python 3.11.7 built the code/prose files; the
# generated math and knowledge files do not depend on the interpreter).
V1_SHA256 = {
    "math": "22585a7a5c9f03d2eb2eaf7cea9d7f9ab7c2fc999ad8e8512aa6ec7dbd4af931",
    "knowledge": "176bc3df9dcdee632852a113aaef06597b18d139e47c0ac708f9bb72c79a19e3",
    "code": "04367937e4e5e66a742313e9ca685b5ea43eee4bdc5e47b31fe9a7d3b6d63432",
    "prose": "76091d79dbcad0262aa2fe7a72fc02f02974bf73cf9f7ac474f2df2ee43b7722",
}
V1_COMBINED = "51c993b843553aa2ec3f702ee07d29c881091ff28694db86a69f971286ee513c"
# benchmarks-v2 as calibrated (docs/eval.md) and used by the sweep: the tasks made from generated
# text only (the code/prose ones follow the interpreter's stdlib, like v1's).
V2_SHA256 = {k: v for k, v in ORIGINAL_SHA256[("benchmarks-v2", 0)].items() if k.startswith(("math_", "know_"))}
TEXTURE = [t for t in v2.KINDS if t.endswith(("_chars", "_swap"))]


@pytest.fixture(scope="module")
def bench(corpus_cache):
    return load_benchmarks(0, corpus_cache, v2.VERSION)


@pytest.fixture(scope="module")
def corpus(corpus_cache):
    return load_tokenized_corpus(0, corpus_cache)


def test_v2_is_deterministic_and_has_the_documented_tasks(bench, corpus):
    assert tuple(bench.items) == task_names(v2.VERSION) == tuple(v2.KINDS)
    assert len(v2.KINDS) == 10 and bench.manifest["version"] == "benchmarks-v2"
    for name, items in bench.items.items():
        assert len(items) == v2.ITEMS_PER_TASK == bench.manifest["domains"][name]["items"] == 400
        assert [item["id"] for item in items] == [f"{name}/{i}" for i in range(400)]
        assert hashlib.sha256(bench.path(name).read_bytes()).hexdigest() == bench.manifest["domains"][name]["sha256"]
        for item in items:
            assert len(item["choices"]) == 4 == len(set(item["choices"])) and 0 <= item["gold"] < 4
        golds = np.bincount([item["gold"] for item in items], minlength=4)
        assert golds.min() > 60, (name, golds)  # the right answer is not always in one place
    assert v2.build_benchmarks(corpus, 0) == bench.items  # same seed, same items
    for name, digest in V2_SHA256.items():  # and the same files as the calibrated version
        assert bench.manifest["domains"][name]["sha256"] == digest, name


def test_v1_is_unchanged_and_both_versions_resolve(builtin_benchmarks, bench, corpus_cache):
    manifest = builtin_benchmarks.manifest
    assert manifest["version"] == "benchmarks-v1" and set(builtin_benchmarks.items) == set(V1_SHA256)
    assert builtin_benchmarks.directory.name == "benchmarks-v1-seed0" and bench.directory.name == "benchmarks-v2-seed0"
    same_interpreter = platform.python_version() == "3.11.7"
    for domain, digest in V1_SHA256.items():
        if domain in ("math", "knowledge") or same_interpreter:
            assert manifest["domains"][domain]["sha256"] == digest, domain
    if same_interpreter:
        assert manifest["sha256"] == V1_COMBINED
    tasks = resolve_tasks(["code", "know_type", "math"], corpus_cache)
    assert [(t.name, t.kind) for t in tasks] == [("code", "multiple_choice"), ("know_type", "multiple_choice"),
                                                ("math", "exact_match")]
    assert "benchmarks-v1-seed0" in tasks[0].source and "benchmarks-v2-seed0" in tasks[1].source
    assert VERSIONS == ("benchmarks-v1", "benchmarks-v2")
    with pytest.raises(ValueError, match="unknown benchmarks version 'v3'; allowed: benchmarks-v1, benchmarks-v2"):
        load_benchmarks(0, corpus_cache, "v3")


def test_texture_levels_permute_heldout_text(bench, corpus):
    for name in TEXTURE:
        domain = v2.TEXTURE_DOMAINS[name.split("_")[0]]
        heldout = "\x00".join(corpus.documents(domain, "heldout"))
        for item in bench.items[name]:
            gold = item["choices"][item["gold"]]
            assert len(gold) == v2.SPAN_CHARS and len(item["context"]) <= v2.CONTEXT_CHARS
            assert item["context"] + gold in heldout, item["id"]
            for choice in item["choices"]:
                assert sorted(choice) == sorted(gold)  # the same bytes: no length or unigram cue
                if name.endswith("_swap") and choice != gold:
                    assert 2 <= sum(a != b for a, b in zip(choice, gold)) <= 2 * v2.SWAPS


def _bigram_accuracy(items, train_text: str) -> float:
    """Accuracy of an add-one character-bigram model of ``train_text`` (context's last character
    included): what the texture levels ask for at the least."""
    data = np.frombuffer(train_text.encode("utf-8"), np.uint8).astype(np.int64)
    logp = np.log(np.bincount(data[:-1] * 256 + data[1:], minlength=65536).reshape(256, 256) + 1.0)
    logp -= np.log(logp.shape[1] + np.exp(logp).sum(1, keepdims=True))
    correct = []
    for item in items:
        scores = []
        for choice in item["choices"]:
            ids = np.frombuffer((item["context"][-1:] + choice).encode("utf-8"), np.uint8)
            scores.append(logp[ids[:-1], ids[1:]].sum())
        correct.append(int(np.argmax(scores)) == item["gold"])
    return float(np.mean(correct))


def test_texture_levels_are_answerable_from_the_train_split_and_graded(bench, corpus):
    accuracy = {}
    for name in TEXTURE:
        domain = v2.TEXTURE_DOMAINS[name.split("_")[0]]
        accuracy[name] = _bigram_accuracy(bench.items[name][:200], "\n".join(corpus.documents(domain, "train")[:3000]))
    for short in v2.TEXTURE_DOMAINS:
        assert accuracy[f"{short}_chars"] > 0.85, accuracy
        assert 0.35 < accuracy[f"{short}_swap"] < accuracy[f"{short}_chars"], accuracy  # the harder level


def test_know_type_asks_facts_stated_in_train_with_distractors_that_are_false(bench, corpus):
    train = "\n".join(corpus.documents("knowledge", "train"))
    world = {e.name: e for e in build_world(0)}
    names = sorted(world, key=len, reverse=True)
    mentions = collections.Counter(item["mentions"] for item in bench.items["know_type"])
    assert min(mentions) >= v2.MIN_MENTIONS
    for item in bench.items["know_type"][:100]:
        entity = world[next(n for n in names if n in item["context"])]
        gold = item["choices"][item["gold"]].strip()
        attribute = next(a for a, v in entity.facts.items() if v == gold)
        wordings = [t.format(name=entity.name, value=gold) for t in TEMPLATES[entity.kind][attribute]]
        assert f"{item['context']} {gold}." in wordings
        assert sum(train.count(w) for w in wordings) >= item["mentions"] >= v2.MIN_MENTIONS, item["id"]
        true = {t.format(name=entity.name, value=v) for a, v in entity.facts.items() for t in TEMPLATES[entity.kind][a]}
        for i, choice in enumerate(item["choices"]):
            if i != item["gold"]:
                assert f"{item['context']}{choice}." not in true, item  # no distractor states a fact
                assert choice.strip() not in entity.facts.values()


def test_math_copy_gold_repeats_the_prompt_numbers(bench):
    for item in bench.items["math_copy"]:
        numbers = re.findall(r"\d+", item["context"]) + ["100"]  # "p / 100 * base" states the 100
        for i, choice in enumerate(item["choices"]):
            copied = all(n in numbers for n in re.findall(r"\d+", choice))
            assert copied == (i == item["gold"]), item
            assert len(choice) == len(item["choices"][item["gold"]])


def test_eval_scores_v2_by_default_and_v1_on_request(erun, ckpt):
    assert erun.cfg.data.benchmarks == "benchmarks-v2"
    settings = make_settings(erun, max_items=4)
    assert settings.tasks == tuple(v2.KINDS) and settings.benchmarks == "benchmarks-v2"
    result = Evaluator(erun, settings, progress=False).evaluate(ckpt)
    assert set(result["benchmarks"]) == set(v2.KINDS)
    for name, res in result["benchmarks"].items():
        assert res["kind"] == "multiple_choice" and res["items"] == 4 and res["skipped"] == 0, name
        assert 0 <= res["accuracy"] <= 1
    assert make_settings(erun, max_items=4, benchmarks="benchmarks-v1").tasks == ("code", "prose", "math", "knowledge")
    with pytest.raises(ConfigError, match="benchmarks version 'v9' is unknown"):
        make_settings(erun, benchmarks="v9")


def test_config_rejects_an_unknown_benchmarks_version():
    cfg = default_config()
    cfg.data.benchmarks = "benchmarks-v3"
    with pytest.raises(ConfigError, match="config key 'data.benchmarks' has value 'benchmarks-v3'; allowed: "
                                          "'benchmarks-v1' or 'benchmarks-v2'"):
        validate(cfg, 8)
