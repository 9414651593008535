"""benchmarks-v1: one task per domain of the built-in corpus, named after the domain.

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

Item formats, caching and the other version: :mod:`moejax.eval.benchmarks`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, Final

import numpy as np

from moejax.data.corpus import DOMAINS, TokenizedCorpus
from moejax.data.synthetic_knowledge import TEMPLATES, Entity, build_world
from moejax.data.synthetic_math import exact_answer_problems
from moejax.eval.benchmarks.builders import exactly, multiple_choice, task_rng

VERSION: Final = "benchmarks-v1"
ITEMS_PER_DOMAIN: Final = 400
NUM_CHOICES: Final = 4
CODE_CONTEXT_CHARS: Final = 1000
PROSE_CONTEXT_CHARS: Final = 600
KINDS: Final = {"code": "multiple_choice", "prose": "multiple_choice", "math": "exact_match",
                "knowledge": "multiple_choice"}  # in DOMAINS order
_WORD: Final = re.compile(r"[A-Za-z]{4,}")
_MIN_LINE_CHARS: Final = 12
_MAX_ATTEMPTS: Final = 200_000


def build_benchmarks(corpus: TokenizedCorpus, seed: int = 0) -> dict[str, list[dict[str, Any]]]:
    """Every domain's items, from ``corpus`` (the tokenized corpus of ``seed``)."""
    builders: dict[str, Callable[[], list[dict[str, Any]]]] = {
        "code": lambda: _next_line_items(corpus.documents("code", "heldout"), task_rng(seed, "code", VERSION)),
        "prose": lambda: _cloze_items(corpus.documents("prose", "heldout"), task_rng(seed, "prose", VERSION)),
        "math": lambda: [{"prompt": p, "answer": a}
                         for p, a in exact_answer_problems(seed, ITEMS_PER_DOMAIN)],
        "knowledge": lambda: _fact_items(build_world(seed), "\n".join(
            corpus.documents("knowledge", "train")), task_rng(seed, "knowledge", VERSION)),
    }
    return {domain: [{"id": f"{domain}/{i}", **item} for i, item in enumerate(builders[domain]())]
            for domain in DOMAINS}


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
        item = multiple_choice(context[cut:], lines[line], others, rng, NUM_CHOICES)
        if item is not None:
            items.setdefault((item["context"], lines[line]), item)
    return exactly(list(items.values()), "code", ITEMS_PER_DOMAIN)


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
        item = multiple_choice(context[cut:], " " + gold, [" " + w for w in others], rng, NUM_CHOICES)
        if item is not None:
            items.setdefault((item["context"], gold), item)
    return exactly(list(items.values()), "prose", ITEMS_PER_DOMAIN)


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
        templates = TEMPLATES[entity.kind][attribute]
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
        item = multiple_choice(context, " " + value, [" " + v for v in others], rng, NUM_CHOICES)
        if item is not None:
            items.setdefault(context, item)
    return exactly(list(items.values()), "knowledge", ITEMS_PER_DOMAIN)
