"""benchmarks-v1 (moejax/eval/benchmarks/v1.py): the documented sizes and formats, deterministic
across independent corpus builds, answers that are right, facts seen in training, held-out text."""

from __future__ import annotations

import hashlib
import json
import re

import numpy as np
import pytest

from moejax.data.corpus import DOMAINS, load_tokenized_corpus
from moejax.data.synthetic_knowledge import TEMPLATES, build_world
from moejax.eval.benchmarks.v1 import ITEMS_PER_DOMAIN, build_benchmarks
# An independent build of the seed-0 corpus in a cache of its own (cache_dir, from rebuilt) and the
# run's shared one (tokenized).
from tests.test_data import cache_dir, rebuilt, tokenized  # noqa: F401


@pytest.fixture(scope="module")
def benchmarks(builtin_benchmarks):
    """The run's shared benchmarks (tests/conftest.py), built from the shared corpus cache."""
    return builtin_benchmarks


def test_benchmarks_have_the_documented_sizes_formats_and_hash(benchmarks, tokenized, cache_dir):
    manifest = benchmarks.manifest
    assert set(benchmarks.items) == set(DOMAINS)
    for domain, items in benchmarks.items.items():
        assert len(items) == ITEMS_PER_DOMAIN == manifest["domains"][domain]["items"]
        assert [item["id"] for item in items] == [f"{domain}/{i}" for i in range(len(items))]
        data = benchmarks.path(domain).read_bytes()
        assert hashlib.sha256(data).hexdigest() == manifest["domains"][domain]["sha256"]
        if manifest["domains"][domain]["kind"] == "exact_match":
            assert all(set(item) == {"id", "prompt", "answer"} for item in items)
        else:
            for item in items:
                assert set(item) == {"id", "context", "choices", "gold"}
                assert len(item["choices"]) == 4 == len(set(item["choices"]))
                assert 0 <= item["gold"] < 4
            golds = np.bincount([item["gold"] for item in items], minlength=4)
            assert golds.min() > 60, golds  # The right answer is not always in one place.
        assert len({json.dumps(item, sort_keys=True) for item in items}) == len(items)
    corpus_hash = tokenized.manifest["domains"]["knowledge"]["train"]["sha256"]
    assert manifest["corpus"]["knowledge"]["train"] == corpus_hash
    rebuilt = build_benchmarks(load_tokenized_corpus(0, cache_dir), 0)
    assert rebuilt == benchmarks.items  # Deterministic.


def test_math_benchmark_answers_are_correct(benchmarks):
    for item in benchmarks.items["math"]:
        expression = re.fullmatch(r"Q: (?:What is (.+)\?|Calculate (\d+) times (\d+)\.)\nA:", item["prompt"])
        assert expression, item
        a = expression.group(1) or f"{expression.group(2)} * {expression.group(3)}"
        assert item["answer"] == f" {int(eval(a.replace('/', '//')))}"  # noqa: S307 - digits only


def test_knowledge_benchmark_asks_facts_seen_in_training(benchmarks, tokenized):
    train = "\n".join(tokenized.documents("knowledge", "train"))
    world = build_world(0)
    for item in benchmarks.items["knowledge"]:
        gold = item["choices"][item["gold"]].strip()
        entity = max((e for e in world if e.name in item["context"]), key=lambda e: len(e.name))
        attribute = next(a for a, v in entity.facts.items() if v == gold)
        wordings = [t.format(name=entity.name, value=gold) for t in TEMPLATES[entity.kind][attribute]]
        assert f"{item['context']} {gold}." in wordings
        assert any(w in train for w in wordings), item["id"]
        assert all(c.strip() != gold for i, c in enumerate(item["choices"]) if i != item["gold"])


def test_code_and_prose_benchmarks_come_from_heldout_documents(benchmarks, tokenized):
    for domain in ("code", "prose"):
        heldout = "\x00".join(tokenized.documents(domain, "heldout"))
        for item in benchmarks.items[domain]:
            assert item["context"] + item["choices"][item["gold"]] in heldout, item["id"]
