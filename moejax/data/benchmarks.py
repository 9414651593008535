"""Downstream benchmarks of the built-in corpus: one JSONL file per domain, deterministic.

=========  ===============  =====  ============================================================
domain     kind             items  what
=========  ===============  =====  ============================================================
math       exact match      400    arithmetic in the training format (sums, differences,
                                   products, exact quotients): ``{"prompt": "Q: What is 37 +
                                   45?\\nA:", "answer": " 82"}``; fresh draws of trained kinds
knowledge  multiple choice  400    a fact about the fictional world that the *train* split
                                   states, asked with a template that ends in the answer;
                                   distractors are the same attribute of other entities. Only
                                   memorised facts answer it: it rewards capacity.
code       multiple choice  400    the next line of a *held-out* stdlib file, after up to 1,000
                                   characters of context; distractors are other lines of the
                                   same file
prose      multiple choice  400    the next word (a cloze) in *held-out* prose, after up to 600
                                   characters; distractors are other words of the same document
=========  ===============  =====  ============================================================

Item formats (one JSON object per line, ``id`` is ``"<domain>/<n>"``):

- multiple choice: ``{"id", "context", "choices", "gold"}``; score a model by the
  log-likelihood of each ``context + choice`` continuation and pick the highest (``gold`` is the
  index of the right choice; choices start with the separator they need, e.g. a space).
- exact match: ``{"id", "prompt", "answer"}``; greedy-decode after ``prompt`` and compare the
  text, up to the first newline, with ``answer``.

Benchmarks derive from the corpus of the same seed and from their own seeded generators, so the
same seed and interpreter give the same files. ``load_benchmarks`` caches them under
``<cache_dir>/<version>-seed<seed>/`` with a ``manifest.json`` holding each file's sha256,
the corpus hashes they derive from and one combined ``sha256``; compare it across machines.

Versions (``VERSIONS``): ``benchmarks-v1`` (this module: one task per domain, named after the
domain) and ``benchmarks-v2`` (:mod:`moejax.data.benchmarks_v2`: graded tasks that carry signal
for sweep-sized models). Both stay buildable: ``load_benchmarks(seed, cache_dir, version)``.
The helpers here (seeded generators, multiple-choice assembly, the atomic writer) are shared by
both versions.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import platform
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import numpy as np

from moejax.config import BENCHMARK_VERSIONS
from moejax.data.corpus import DOMAINS, TokenizedCorpus, default_cache_dir, load_tokenized_corpus
from moejax.data.synthetic_knowledge import _TEMPLATES, Entity, build_world
from moejax.data.synthetic_math import exact_answer_problems

VERSION: Final = "benchmarks-v1"
VERSIONS: Final = BENCHMARK_VERSIONS  # the values of the config key data.benchmarks
ITEMS_PER_DOMAIN: Final = 400
NUM_CHOICES: Final = 4
CODE_CONTEXT_CHARS: Final = 1000
PROSE_CONTEXT_CHARS: Final = 600
KINDS: Final = {"code": "multiple_choice", "prose": "multiple_choice", "math": "exact_match",
                "knowledge": "multiple_choice"}  # in DOMAINS order
_WORD: Final = re.compile(r"[A-Za-z]{4,}")
_MIN_LINE_CHARS: Final = 12
_MAX_ATTEMPTS: Final = 200_000


@dataclasses.dataclass(frozen=True)
class Benchmarks:
    """The built-in benchmarks: ``items[domain]`` is a list of dicts; files live in ``directory``."""

    manifest: dict[str, Any]
    items: dict[str, list[dict[str, Any]]]  # task name (v1: the domain) -> items
    directory: Path

    def path(self, task: str) -> Path:
        """The JSONL file of one task (v1: of one domain)."""
        return self.directory / f"{task}.jsonl"


def build_benchmarks(corpus: TokenizedCorpus, seed: int = 0) -> dict[str, list[dict[str, Any]]]:
    """Every domain's items, from ``corpus`` (the tokenized corpus of ``seed``)."""
    builders: dict[str, Callable[[], list[dict[str, Any]]]] = {
        "code": lambda: _next_line_items(corpus.documents("code", "heldout"), _rng(seed, "code")),
        "prose": lambda: _cloze_items(corpus.documents("prose", "heldout"), _rng(seed, "prose")),
        "math": lambda: [{"prompt": p, "answer": a}
                         for p, a in exact_answer_problems(seed, ITEMS_PER_DOMAIN)],
        "knowledge": lambda: _fact_items(build_world(seed), "\n".join(
            corpus.documents("knowledge", "train")), _rng(seed, "knowledge")),
    }
    return {domain: [{"id": f"{domain}/{i}", **item} for i, item in enumerate(builders[domain]())]
            for domain in DOMAINS}


def load_benchmarks(seed: int = 0, cache_dir: str | os.PathLike[str] | None = None,
                    version: str = VERSION) -> Benchmarks:
    """The benchmarks of ``version`` for ``seed``, built (seconds with a cached corpus) on first use."""
    build, kinds = _builder(version)
    directory = Path(cache_dir or default_cache_dir()) / f"{version}-seed{seed}"
    if not (directory / "manifest.json").is_file():
        corpus = load_tokenized_corpus(seed, cache_dir)
        _write(directory, build(corpus, seed), corpus, seed, version=version, kinds=kinds)
    with open(directory / "manifest.json", encoding="utf-8") as f:
        manifest = json.load(f)
    items = {}
    for task in kinds:
        with open(directory / f"{task}.jsonl", encoding="utf-8") as f:
            items[task] = [json.loads(line) for line in f]
    return Benchmarks(manifest, items, directory)


def task_names(version: str) -> tuple[str, ...]:
    """The built-in task names of ``version`` (v1: the domains), in file order."""
    return tuple(_builder(version)[1])


def _builder(version: str) -> tuple[Callable[[TokenizedCorpus, int], dict[str, list[dict[str, Any]]]],
                                     dict[str, str]]:
    """(build function, task -> kind) of ``version``; ValueError naming the allowed versions."""
    if version == VERSION:
        return build_benchmarks, KINDS
    if version == VERSIONS[1]:
        from moejax.data import benchmarks_v2  # imports this module's helpers

        return benchmarks_v2.build_benchmarks, benchmarks_v2.KINDS
    raise ValueError(f"unknown benchmarks version {version!r}; allowed: {', '.join(VERSIONS)}")


def _rng(seed: int, domain: str, version: str = VERSION) -> np.random.Generator:
    """The generator of one task: seeded by the corpus seed and a hash of ``version/task``."""
    tag = int.from_bytes(hashlib.sha256(f"{version}/{domain}".encode()).digest()[:8], "little")
    return np.random.default_rng([seed, tag])


def _next_line_items(documents: list[str], rng: np.random.Generator) -> list[dict[str, Any]]:
    """Which line comes next in a held-out source file."""
    files = [doc.split("\n") for doc in documents]
    candidates = [[i for i, line in enumerate(lines) if len(line.strip()) >= _MIN_LINE_CHARS]
                  for lines in files]
    items: dict[tuple[str, str], dict[str, Any]] = {}
    for _ in range(_MAX_ATTEMPTS):
        if len(items) == ITEMS_PER_DOMAIN:
            break
        f = int(rng.integers(len(files)))
        lines, usable = files[f], candidates[f]
        if len(usable) < NUM_CHOICES + 1:
            continue
        line = usable[int(rng.integers(len(usable)))]
        if line < 5:
            continue
        context = "\n".join(lines[:line]) + "\n"
        cut = context.find("\n", max(0, len(context) - CODE_CONTEXT_CHARS)) + 1
        others = list(dict.fromkeys(lines[i] for i in usable if lines[i].strip() != lines[line].strip()))
        item = _multiple_choice(context[cut:], lines[line], others, rng)
        if item is not None:
            items.setdefault((item["context"], lines[line]), item)
    return _exactly(list(items.values()), "code")


def _cloze_items(documents: list[str], rng: np.random.Generator) -> list[dict[str, Any]]:
    """Which word comes next in held-out prose."""
    items: dict[tuple[str, str], dict[str, Any]] = {}
    for _ in range(_MAX_ATTEMPTS):
        if len(items) == ITEMS_PER_DOMAIN:
            break
        text = documents[int(rng.integers(len(documents)))]
        words = list(_WORD.finditer(text))
        if len(words) < 40:
            continue
        match = words[int(rng.integers(20, len(words)))]
        start = match.start()
        if text[start - 1] != " " or text[match.end():match.end() + 1].isalnum():
            continue  # Only whole words that follow a space.
        context = text[:start - 1]
        cut = context.find(" ", max(0, len(context) - PROSE_CONTEXT_CHARS)) + 1
        gold = match.group()
        others = list(dict.fromkeys(w.group() for w in words if w.group().lower() != gold.lower()))
        item = _multiple_choice(context[cut:], " " + gold, [" " + w for w in others], rng)
        if item is not None:
            items.setdefault((item["context"], gold), item)
    return _exactly(list(items.values()), "prose")


def _fact_items(world: list[Entity], train_text: str, rng: np.random.Generator) -> list[dict[str, Any]]:
    """Facts the training split states, asked as ``"<template up to the value>"`` + value."""
    values: dict[tuple[str, str], list[str]] = {}
    for entity in world:
        for attribute, value in entity.facts.items():
            values.setdefault((entity.kind, attribute), []).append(value)
    askable = {key: sorted(set(v)) for key, v in values.items() if len(set(v)) >= NUM_CHOICES}
    items: dict[str, dict[str, Any]] = {}
    for _ in range(_MAX_ATTEMPTS):
        if len(items) == ITEMS_PER_DOMAIN:
            break
        entity = world[int(rng.integers(len(world)))]
        attributes = [a for a in entity.facts if (entity.kind, a) in askable]
        attribute = attributes[int(rng.integers(len(attributes)))]
        templates = _TEMPLATES[entity.kind][attribute]
        value = entity.facts[attribute]
        stated = [t.format(name=entity.name, value=value) for t in templates]
        if not any(sentence in train_text for sentence in stated):
            continue  # Ask only facts seen in training.
        closing = [t for t in templates if t.endswith(" {value}.") and not t.startswith("{value}")]
        if not closing:
            continue
        template = closing[int(rng.integers(len(closing)))]
        context = template[: -len(" {value}.")].format(name=entity.name)
        others = [v for v in askable[(entity.kind, attribute)] if v != value]
        item = _multiple_choice(context, " " + value, [" " + v for v in others], rng)
        if item is not None:
            items.setdefault(context, item)
    return _exactly(list(items.values()), "knowledge")


def _multiple_choice(context: str, gold: str, others: list[str],
                     rng: np.random.Generator, num_choices: int = NUM_CHOICES) -> dict[str, Any] | None:
    """An item with ``gold`` at a random position among ``num_choices - 1`` distinct ``others``."""
    if len(others) < num_choices - 1 or not context.strip():
        return None
    picks = rng.choice(len(others), num_choices - 1, replace=False)
    choices = [others[i] for i in picks]
    position = int(rng.integers(num_choices))
    choices.insert(position, gold)
    return {"context": context, "choices": choices, "gold": position}


def _exactly(items: list[dict[str, Any]], domain: str, count: int = ITEMS_PER_DOMAIN) -> list[dict[str, Any]]:
    if len(items) < count:
        raise RuntimeError(f"only {len(items)} {domain} benchmark items could be made, {count} are needed")
    return items[:count]


def _write(directory: Path, items: dict[str, list[dict[str, Any]]], corpus: TokenizedCorpus,
           seed: int, *, version: str = VERSION, kinds: dict[str, str] = KINDS) -> None:
    """Write the JSONL files and the manifest into ``directory`` atomically (temp dir + rename)."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    try:
        domains = {}
        for domain, domain_items in items.items():
            data = "".join(json.dumps(item, sort_keys=True) + "\n" for item in domain_items).encode()
            (tmp / f"{domain}.jsonl").write_bytes(data)
            domains[domain] = {"kind": kinds[domain], "items": len(domain_items),
                               "file": f"{domain}.jsonl", "sha256": hashlib.sha256(data).hexdigest()}
        manifest = {
            "version": version,
            "seed": seed,
            "python": platform.python_version(),
            "corpus": {d: {s: corpus.manifest["domains"][d][s]["sha256"] for s in ("train", "heldout")}
                       for d in DOMAINS},
            "domains": domains,
            "sha256": hashlib.sha256("".join(d["sha256"] for d in domains.values()).encode()).hexdigest(),
        }
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))
        try:
            os.rename(tmp, directory)
        except OSError:
            if not (directory / "manifest.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
