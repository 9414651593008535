"""Benchmarks v2: graded tasks that carry signal for the sweep's tiny models (``benchmarks-v2``).

Why a second version. The v1 tasks (:mod:`moejax.eval.benchmarks.v1`) ask for memorised facts,
exact arithmetic and the right next line among lines of the same file. Models of 50k-600k active
parameters trained for a few hundred steps of 16 x 128 tokens (0.3-0.6M tokens: at most about a
tenth of the knowledge split, so each fact, stated about ten times there, is seen about once at
most) score at chance on all of them, so a
loss-to-benchmark law has nothing to fit. v2 keeps the same two item formats and scoring
(:mod:`moejax.eval.harness`) and grades difficulty from "what a bigram model already knows" to
"what needs the domain's structure", per domain, so that scores rise with model size and with
the weight of the matching domain in the mixture. The training corpus is not touched: every item
derives from the corpus (held-out split) or from the fictional world and the math generator's
training formats.

=============  =====  =======================================================================
task           items  what (4 choices, chance 0.25; "span": 16 characters of held-out text)
=============  =====  =======================================================================
code_chars     400    after up to 48 characters of a held-out stdlib file, the next span vs
                      three random permutations of its characters (same bytes: a unigram
                      model is at chance; local character statistics of code solve it)
code_swap      400    the next span vs three copies with two adjacent characters swapped
                      (finer: spelling of identifiers, operators, indentation)
prose_chars    400    as ``code_chars`` on held-out prose
prose_swap     400    as ``code_swap`` on held-out prose
math_chars     400    as ``code_chars`` on held-out worksheets (digits, operators, the Q/A form)
math_swap      400    as ``code_swap`` on held-out worksheets (digit order, i.e. arithmetic)
know_chars     400    as ``code_chars`` on held-out fact paragraphs (the world's names)
know_swap      400    as ``code_swap`` on held-out fact paragraphs
know_type      400    a fact of the world stated at least ``MIN_MENTIONS`` times in the train
                      split, asked with a template that ends in the value (``"The atomic
                      number of Dreneium is"``); distractors are values of *other* attributes
                      of close length (a city, a colour, a year ...), never of an attribute
                      whose template reads the same up to the value: the model must know which
                      kind of value the template asks for
math_copy      400    the first step of a worked answer, which repeats the question's numbers
                      (``"Q: What is 76 squared?\\nA:"`` -> ``" 76 * 76"``; remainders,
                      percentages, linear equations); distractors put other numbers of the
                      same digit counts in the same places: only copying from the prompt helps
=============  =====  =======================================================================

Every choice of a ``*_chars``/``*_swap`` item holds exactly the bytes of the gold span, so the
summed log-likelihood (``accuracy``) is not biased by length or by character frequencies.
Contexts are short (rows of at most 64 byte tokens), which keeps scoring cheap: 10 tasks x 64
items cost about as many tokens as v1's 3 multiple-choice tasks x 64 items.

Item fields are v1's (``id`` is ``"<task>/<n>"``); ``know_type`` items also carry ``mentions``
(how often the asked fact is stated in the train split, any wording) for analysis.
"""

from __future__ import annotations

import collections
import re
from collections.abc import Callable
from typing import Any, Final

import numpy as np

from moejax.data.corpus import TokenizedCorpus
from moejax.data.synthetic_knowledge import TEMPLATES, build_world
from moejax.eval.benchmarks.builders import exactly, multiple_choice, task_rng

VERSION: Final = "benchmarks-v2"
ITEMS_PER_TASK: Final = 400
SPAN_CHARS: Final = 16
CONTEXT_CHARS: Final = 48
SWAPS: Final = 2
MIN_MENTIONS: Final = 3
TEXTURE_DOMAINS: Final = {"code": "code", "prose": "prose", "math": "math", "know": "knowledge"}
KINDS: Final = {
    **{f"{short}_{level}": "multiple_choice" for short in TEXTURE_DOMAINS for level in ("chars", "swap")},
    "know_type": "multiple_choice",
    "math_copy": "multiple_choice",
}
_MAX_ATTEMPTS: Final = 200_000
_PERTURB_TRIES: Final = 60
_NUM_CHOICES: Final = 4


def build_benchmarks(corpus: TokenizedCorpus, seed: int = 0) -> dict[str, list[dict[str, Any]]]:
    """Every v2 task's items, from ``corpus`` (the tokenized corpus of ``seed``)."""
    tasks: dict[str, list[dict[str, Any]]] = {}
    for short, domain in TEXTURE_DOMAINS.items():
        documents = corpus.documents(domain, "heldout")
        for level in ("chars", "swap"):
            name = f"{short}_{level}"
            tasks[name] = _texture_items(documents, level, task_rng(seed, name, VERSION), name)
    tasks["know_type"] = _type_items(seed, corpus.documents("knowledge", "train"), task_rng(seed, "know_type", VERSION))
    tasks["math_copy"] = _copy_items(task_rng(seed, "math_copy", VERSION))
    return {name: [{"id": f"{name}/{i}", **item} for i, item in enumerate(tasks[name])] for name in KINDS}


# --- texture levels: the true span against permutations of its own bytes ------------------------


def _texture_items(documents: list[str], level: str, rng: np.random.Generator, name: str) -> list[dict[str, Any]]:
    """Items whose gold is the 16 characters after a word start and whose distractors perturb it."""
    usable = [d for d in documents if len(d) > 2 * SPAN_CHARS]
    items: dict[tuple[str, str], dict[str, Any]] = {}
    for _ in range(_MAX_ATTEMPTS):
        if len(items) == ITEMS_PER_TASK:
            break
        text = usable[int(rng.integers(len(usable)))]
        start = _word_start(text, int(rng.integers(SPAN_CHARS, len(text) - SPAN_CHARS)))
        span = text[start : start + SPAN_CHARS]
        if start < 0 or len(span) < SPAN_CHARS or "\n" in span or len(set(span)) < 5:
            continue
        context = text[max(0, start - CONTEXT_CHARS) : start]
        if start > CONTEXT_CHARS:  # cut inside the text: begin at a word
            cut = re.search(r"\s", context)
            context = context[cut.end():] if cut else context
        if not context.strip() or (context, span) in items:
            continue
        others = _perturbations(span, level, rng)
        if len(others) < _NUM_CHOICES - 1:
            continue
        item = multiple_choice(context, span, others, rng, _NUM_CHOICES)
        if item is not None:
            items[(context, span)] = item
    return exactly(list(items.values()), name, ITEMS_PER_TASK)


def _word_start(text: str, position: int) -> int:
    """The first index >= ``position`` that starts a word (non-space after a space or newline); -1 if none."""
    match = re.compile(r"(?<=[ \n])\S").search(text, position)
    return match.start() if match else -1


def _perturbations(span: str, level: str, rng: np.random.Generator) -> list[str]:
    """Three distinct strings with the bytes of ``span`` (``chars``: shuffled; ``swap``: SWAPS
    adjacent transpositions of unequal characters at non-overlapping places), sorted."""
    found: set[str] = set()
    pairs = [i for i in range(len(span) - 1) if span[i] != span[i + 1]]
    for _ in range(_PERTURB_TRIES):
        chars = list(span)
        if level == "chars":
            chars = [chars[i] for i in rng.permutation(len(chars))]
        else:
            picked: list[int] = []
            for i in rng.permutation(pairs).tolist():
                if all(abs(i - j) >= 2 for j in picked):
                    picked.append(i)
                if len(picked) == SWAPS:
                    break
            for i in picked:
                chars[i], chars[i + 1] = chars[i + 1], chars[i]
        candidate = "".join(chars)
        if candidate != span:
            found.add(candidate)
        if len(found) == _NUM_CHOICES - 1:
            break
    return sorted(found)


# --- know_type: which kind of value a template asks for -----------------------------------------


def fact_mentions(train_documents: list[str]) -> collections.Counter:
    """How often each sentence occurs in the knowledge train split (sentences end with ". ")."""
    counts: collections.Counter = collections.Counter()
    for document in train_documents:
        counts.update(re.split(r"(?<=\.) ", document))
    return counts


def _type_items(seed: int, train_documents: list[str], rng: np.random.Generator) -> list[dict[str, Any]]:
    world = build_world(seed)
    mentions = fact_mentions(train_documents)
    values: dict[tuple[str, str], set[str]] = collections.defaultdict(set)
    for entity in world:
        for attribute, value in entity.facts.items():
            values[(entity.kind, attribute)].add(value)
    pools = {key: sorted(v) for key, v in values.items()}
    items: dict[str, dict[str, Any]] = {}
    for _ in range(_MAX_ATTEMPTS):
        if len(items) == ITEMS_PER_TASK:
            break
        entity = world[int(rng.integers(len(world)))]
        attribute = list(entity.facts)[int(rng.integers(len(entity.facts)))]
        value = entity.facts[attribute]
        templates = TEMPLATES[entity.kind][attribute]
        count = sum(mentions[t.format(name=entity.name, value=value)] for t in templates)
        closing = [t for t in templates if t.endswith(" {value}.") and not t.startswith("{value}")]
        if count < MIN_MENTIONS or not closing:
            continue
        prefix = closing[int(rng.integers(len(closing)))][: -len(" {value}.")]
        # Attributes of this kind with a wording that reads the same up to the value answer too.
        same_prefix = {a for a, ts in TEMPLATES[entity.kind].items() if any(t.startswith(prefix + " {value}") for t in ts)}
        others = []
        for key in sorted(pools):
            if key[0] == entity.kind and key[1] in same_prefix:
                continue
            gap = min(abs(len(v) - len(value)) for v in pools[key])
            closest = [v for v in pools[key] if abs(len(v) - len(value)) == gap]
            others.append((gap, float(rng.random()), closest[int(rng.integers(len(closest)))]))
        distractors: list[str] = []  # distinct, and no value this entity has for any attribute
        for _, _, v in sorted(others):
            if v not in entity.facts.values() and " " + v not in distractors and len(distractors) < _NUM_CHOICES - 1:
                distractors.append(" " + v)
        context = prefix.format(name=entity.name)
        item = multiple_choice(context, " " + value, distractors, rng, _NUM_CHOICES)
        if item is not None and context not in items:
            items[context] = {**item, "mentions": count}
    return exactly(list(items.values()), "know_type", ITEMS_PER_TASK)


# --- math_copy: the first step of a worked answer repeats the question's numbers ---------------


def _number(rng: np.random.Generator, low: int, high: int, step: int = 1) -> int:
    """A multiple of ``step`` in [low, high], uniform."""
    return step * int(rng.integers(-(-low // step), high // step + 1))


def _copy_problem(rng: np.random.Generator) -> tuple[str, Callable[[list[int]], str], list[int], list[tuple[int, int, int]]]:
    """(context, first step of the answer from the numbers, the question's numbers, their
    (low, high, step) ranges) of one problem kind, in the training format and ranges of
    :mod:`moejax.data.synthetic_math`."""
    kind = int(rng.integers(4))
    if kind == 0:
        n = _number(rng, 10, 99)
        return f"Q: What is {n} squared?\nA:", lambda v: f" {v[0]} * {v[0]}", [n], [(10, 99, 1)]
    if kind == 1:
        a, b = _number(rng, 10, 2000), _number(rng, 2, 30)
        return (f"Q: What is the remainder when {a} is divided by {b}?\nA:", lambda v: f" {v[0]} =",
                [a], [(10, 2000, 1)])
    if kind == 2:
        p, base = _number(rng, 5, 95, 5), _number(rng, 20, 1000, 20)
        return (f"Q: What is {p}% of {base}?\nA:", lambda v: f" {v[0]} / 100 * {v[1]}", [p, base],
                [(5, 95, 5), (20, 1000, 20)])
    a, x, b = _number(rng, 2, 12), _number(rng, -20, 20), _number(rng, 1, 50)
    sign, c = ("+", a * x + b) if rng.random() < 0.5 else ("-", a * x - b)
    inverse = "-" if sign == "+" else "+"
    return (f"Solve for x: {a}x {sign} {b} = {c}.\n", lambda v: f"{v[0]}x = {c} {inverse} {v[1]}",
            [a, b], [(2, 12, 1), (1, 50, 1)])


def _same_digits(rng: np.random.Generator, n: int, low: int, high: int, step: int) -> int:
    """A number from the same range as ``n`` with as many digits."""
    low, high = max(low, 10 ** (len(str(n)) - 1)), min(high, 10 ** len(str(n)) - 1)
    return _number(rng, low, high, step)


def _copy_items(rng: np.random.Generator) -> list[dict[str, Any]]:
    items: dict[str, dict[str, Any]] = {}
    for _ in range(_MAX_ATTEMPTS):
        if len(items) == ITEMS_PER_TASK:
            break
        context, step, numbers, ranges = _copy_problem(rng)
        gold = step(numbers)
        others = set()
        for _ in range(_PERTURB_TRIES):
            drawn = [_same_digits(rng, n, *r) for n, r in zip(numbers, ranges)]
            other = step(drawn)
            # Every distractor puts at least one number that is not in the prompt.
            stated = set(re.findall(r"\d+", context + step([0] * len(numbers))))  # e.g. the "100" of "p / 100 * b"
            if len(other) == len(gold) and not set(map(str, drawn)) <= stated:
                others.add(other)
            if len(others) == _NUM_CHOICES - 1:
                break
        item = multiple_choice(context, gold, sorted(others), rng, _NUM_CHOICES)
        if item is not None and context not in items:
            items[context] = item
    return exactly(list(items.values()), "math_copy", ITEMS_PER_TASK)
