"""The built-in benchmarks as a package (moejax/eval/benchmarks/): every version's items are byte-identical
to what the code generated before the package existed, the registry matches the config, and the old
import paths still work."""

from __future__ import annotations

import hashlib
import json
import platform

import pytest

from moejax.config import BENCHMARK_VERSIONS
from moejax.data.corpus import load_tokenized_corpus
from moejax.eval.benchmarks import REGISTRY, VERSIONS, get_version, task_names, v1, v2

# sha256 of each task's JSONL bytes (one ``json.dumps(item, sort_keys=True)`` line per item, as the
# cache writes them) of ``build_benchmarks(load_tokenized_corpus(seed), seed)``, computed with the
# modules moejax/data/benchmarks.py and moejax/data/benchmarks_v2.py of commit c702a67 (before they
# became this package) under Python 3.11.7. Results depend on these items: they must never change.
# The tasks made from the code and prose domains follow the interpreter's stdlib (the corpus's
# source), so they are compared on that interpreter only.
ORIGINAL_SHA256 = {
    ("benchmarks-v1", 0): {
        "code": "04367937e4e5e66a742313e9ca685b5ea43eee4bdc5e47b31fe9a7d3b6d63432",
        "prose": "76091d79dbcad0262aa2fe7a72fc02f02974bf73cf9f7ac474f2df2ee43b7722",
        "math": "22585a7a5c9f03d2eb2eaf7cea9d7f9ab7c2fc999ad8e8512aa6ec7dbd4af931",
        "knowledge": "176bc3df9dcdee632852a113aaef06597b18d139e47c0ac708f9bb72c79a19e3",
    },
    ("benchmarks-v1", 1): {
        "code": "b3ad2f6b69063cc60be59d2da600534a68be990fbfc80f198a0786b64798f8d8",
        "prose": "a7da7ea3bf26e77a35caec0e583fc4232f46555db7740d8f61778f3b81aff0ee",
        "math": "4c72a8b9c06e95f13f0fd5ce0d7380bf6009b860de9631881b89155e93529383",
        "knowledge": "14e9697ab5c6b6ab090e4a2be673fff77a98c89533f2b84a14ca0231755e0725",
    },
    ("benchmarks-v2", 0): {
        "code_chars": "fd361865cad56d6d5d62fc65f53c7958412e202e332bda5ef97df4d7206d76f1",
        "code_swap": "34baf48092918248c38f135fa9ec478db545938e0854c2bde892ede146c7b245",
        "prose_chars": "bf6c3b9121a564c5ee8650761a192d8cc82692ad6217f70b104fab93cc5bb32a",
        "prose_swap": "a128181c758e61006ae6514b09e9b9da60949ba8e38184e56f46dca1e7d52778",
        "math_chars": "8532a9c50449cd278d67f6139e39ad65cfa48267b8c37511befc8c5fa8407148",
        "math_swap": "5b36b231263dc9cb5a363e364f5066e91f94ba8801a19cd5a912364f586c27fb",
        "know_chars": "06d52bfce0c0fa94d1a22dbb8ac550d62ccf87795cafcb3b40b18865a83c4817",
        "know_swap": "89de72d8a6c213a025a51e793cdb3bb32f2992538d256c59f46ed8ac2d3b0464",
        "know_type": "88397d0ef97c02ec3f01e57f7699edba031ec3e00491f2101a7daff08a649aa3",
        "math_copy": "2db656ae5bb25e72ea432dc4c06e1d038863ede79ff9b1970216571478550685",
    },
    ("benchmarks-v2", 1): {
        "code_chars": "65b66e3cc3f0fadbbd6f9ad95a15d27c2dd02c81df2d16e0d132f08f0c5d62c8",
        "code_swap": "665beaa1d256e0096183e68ea61661f4c44de17d2473d21a9dfda5770dded30f",
        "prose_chars": "bebe8999ac89e6243362380b2cb224935242e43ef2ff77a6243f2d1c844c2010",
        "prose_swap": "ff520855e35ea9bd2efcf3f8c5a36ec67815fdd9d22e9ad8fca35c3e3c2920c5",
        "math_chars": "844dbdd2e9d4a354030f008160fa64df4fb1a979b3e9e1732d88911a077a4aa5",
        "math_swap": "6a1336742bd3aaf8a28750a149c58fc9be805604b32f0460a11fbecef0c9df36",
        "know_chars": "4400b98d53a468de15b38b58ce190ff433761e857e087050e3d7c15c2f099b52",
        "know_swap": "3fdd2713fd441ca5dbe8f07ee3193015e98e47cf2b7f998420ccc66bc9ba3471",
        "know_type": "10571180541b956480fe7ad6a230b347a1141ffa139193928be0691e47efa221",
        "math_copy": "28bbe587e2e67d321259af14f59fc2bde715ed4af306e6458959128862320869",
    },
}
ORIGINAL_PYTHON = "3.11.7"
STDLIB_DOMAINS = ("code", "prose")


def _digests(items: dict[str, list[dict]]) -> dict[str, str]:
    return {task: hashlib.sha256("".join(json.dumps(item, sort_keys=True) + "\n" for item in task_items).encode())
            .hexdigest() for task, task_items in items.items()}


# Seed 1 builds a second corpus (the slow part), so it runs with the slow drills; seed 0 pins both
# versions in the default suite.
@pytest.mark.parametrize("seed", [0, pytest.param(1, marks=pytest.mark.slow)])
def test_every_version_builds_the_original_items(seed, corpus_cache):
    corpus = load_tokenized_corpus(seed, corpus_cache)
    same_interpreter = platform.python_version() == ORIGINAL_PYTHON
    for version in VERSIONS:
        got, want = _digests(REGISTRY[version].build(corpus, seed)), ORIGINAL_SHA256[(version, seed)]
        assert list(got) == list(want) == list(task_names(version)), version  # the same tasks, in file order
        for task, digest in want.items():
            if same_interpreter or not task.startswith(STDLIB_DOMAINS):
                assert got[task] == digest, (version, seed, task)


def test_registry_lists_the_versions_the_config_accepts():
    assert VERSIONS == tuple(REGISTRY) == BENCHMARK_VERSIONS == ("benchmarks-v1", "benchmarks-v2")
    assert get_version("benchmarks-v1").build is v1.build_benchmarks and get_version("benchmarks-v2").kinds is v2.KINDS
    assert set(task_names("benchmarks-v1")).isdisjoint(task_names("benchmarks-v2"))  # a task name names its version
    with pytest.raises(ValueError, match="unknown benchmarks version 'v3'; allowed: benchmarks-v1, benchmarks-v2"):
        task_names("v3")
