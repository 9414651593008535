"""The built-in corpus's held-out target set: deterministic, never trained on, needing several domains."""

from __future__ import annotations

import re

import numpy as np

from moejax.data.corpus import build_domain
from moejax.data.synthetic_knowledge import build_world
from moejax.data.targets import load_target_sets, qa_documents, target_eval_batches


def test_heldout_qa_is_deterministic_and_asks_in_forms_never_trained_on():
    docs = qa_documents(0, 20_000)
    assert docs == qa_documents(0, 20_000) and docs != qa_documents(1, 20_000)
    text = "\n".join(docs)
    world = {e.name: e for e in build_world(0)}
    sums = re.findall(r"was born in (\d+), so (\d+) - (\d+) = (-?\d+) years", text)
    assert len(sums) > 20 and all(int(a) - int(b) == int(c) for _, a, b, c in sums)  # math on two facts
    asked = re.findall(r"Asked: In which year was ([A-Z][a-z]+ [A-Z][a-z]+) born\?\nAnswered: .* the year (\d+)\.", text)
    assert asked and all(world[n].facts["birth_year"] == y for n, y in asked)  # knowledge facts
    training = "\n".join(build_domain("knowledge", 0)["train"][:3000] + build_domain("math", 0)["train"][:300])
    assert "Asked:" not in training and "Answered:" not in training and "born in the year" not in training


def test_target_batches_are_cached_and_fixed(tmp_path):
    streams = load_target_sets(0, tmp_path)
    assert streams["heldout_qa"].num_tokens > 100_000
    a = target_eval_batches(seq_len=64, batch_size=4, batches_per_set=2, first_domain_id=4, cache_dir=tmp_path)
    b = target_eval_batches(seq_len=64, batch_size=4, batches_per_set=2, first_domain_id=4, cache_dir=tmp_path)
    assert len(a["heldout_qa"]) == 2 and np.array_equal(a["heldout_qa"][1]["inputs"], b["heldout_qa"][1]["inputs"])
    assert int(a["heldout_qa"][0]["domain"].max()) == 4
