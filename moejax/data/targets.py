"""Held-out *target sets* of the built-in corpus: validation-only text that no run trains on.

A mixture is chosen for a target, and a target that is one of the training domains makes the
question trivial (weight that domain). A target set needs several training domains at once but
equals none of them:

``heldout_qa``  questions and answers about the ``knowledge`` domain's fictional world, in
                question forms the corpus never trains on (``Asked: ... / Answered: ...``;
                ``knowledge`` states facts declaratively, ``math`` writes ``Q:``/``A:``), half
                of them needing arithmetic on two facts ("how many years passed between ...",
                answered with the subtraction written out, as ``math`` does) and every answer a
                full English sentence (``prose``). A model does well on it only with the facts
                (knowledge), the arithmetic (math) and the language (prose).

Generated like the other synthetic domains: deterministic from the corpus seed (the world of
``synthetic_knowledge.build_world(seed)`` and a generator seeded by the seed), cached as
``.npy`` token streams under ``<cache_dir>/builtin-targets-v1-seed<seed>/`` (written under a
temporary name and renamed into place). Every document is held out: there is no train split.
``moejax.eval`` scores runs of the built-in corpus on them (``losses.targets`` of
``eval/step_N.json``) and ``data_mixture collect`` turns that into ``loss:heldout_qa`` columns
with no ``mix:`` column.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Final

import numpy as np

from moejax.data.streams import TokenStream, tokenize_documents
from moejax.data.synthetic_knowledge import Entity, build_world
from moejax.data.tokenizer import get_tokenizer

TARGET_SETS: Final = ("heldout_qa",)
TARGETS_VERSION: Final = "builtin-targets-v1"
TARGET_CHARS: Final = 150_000  # about 150k byte tokens: eighteen evaluations of the tiny default's 8,192
MANIFEST_FILE: Final = "manifest.json"

# attribute -> (question, answer sentence); {name}, {value}. None of these wordings is in
# synthetic_knowledge.TEMPLATES or in the benchmarks.
_QUESTIONS: Final[dict[str, dict[str, tuple[str, str]]]] = {
    "person": {
        "birthplace": ("Where was {name} born?", "{name} was born in the city of {value}."),
        "birth_year": ("In which year was {name} born?", "{name} was born in the year {value}."),
        "occupation": ("What did {name} do for a living?", "{name} earned a living as {value}."),
        "residence": ("Which city did {name} live in?", "{name} lived in the city of {value}."),
        "mentor": ("Who taught {name}?", "{name} was taught by {value}."),
    },
    "city": {
        "country": ("Which country is {name} in?", "{name} is in the country of {value}."),
        "founded": ("When was {name} founded?", "{name} was founded in the year {value}."),
        "river": ("Which river runs through {name}?", "The river through {name} is the {value}."),
    },
    "element": {
        "symbol": ("What symbol stands for {name}?", "The symbol that stands for {name} is {value}."),
        "atomic_number": ("What is the atomic number of {name}?", "The atomic number of {name} is {value}."),
        "discoverer": ("Who found {name}?", "{name} was found by {value}."),
        "discovery_year": ("In which year was {name} found?", "{name} was found in the year {value}."),
    },
}


def qa_documents(seed: int, target_chars: int = TARGET_CHARS) -> list[str]:
    """``heldout_qa`` documents for ``seed``: 3 to 6 question/answer pairs each (module docstring)."""
    world = build_world(seed)
    people = [e for e in world if e.kind == "person"]
    cities = {e.name: e for e in world if e.kind == "city"}
    rng = np.random.default_rng([seed, 0x71612D7365]) # "qa-se"
    documents: list[str] = []
    total = 0
    while total < target_chars:
        pairs = []
        for _ in range(int(rng.integers(3, 7))):
            if rng.random() < 0.5:
                pairs.append(_arithmetic(people[int(rng.integers(len(people)))], cities))
            else:
                pairs.append(_lookup(world[int(rng.integers(len(world)))], rng))
        document = "\n\n".join(f"Asked: {q}\nAnswered: {a}" for q, a in pairs)
        documents.append(document)
        total += len(document)
    return documents


def _lookup(entity: Entity, rng: np.random.Generator) -> tuple[str, str]:
    forms = _QUESTIONS[entity.kind]
    attributes = [a for a in forms if a in entity.facts]
    attribute = attributes[int(rng.integers(len(attributes)))]
    question, answer = forms[attribute]
    return (question.format(name=entity.name),
            answer.format(name=entity.name, value=entity.facts[attribute]))


def _arithmetic(person: Entity, cities: dict[str, Entity]) -> tuple[str, str]:
    """Years between the founding of a person's birthplace and their birth: two facts, one subtraction."""
    city = cities[person.facts["birthplace"]]
    born, founded = int(person.facts["birth_year"]), int(city.facts["founded"])
    question = f"How many years after {city.name} was founded was {person.name} born there?"
    answer = (f"{city.name} was founded in {founded} and {person.name} was born in {born}, "
              f"so {born} - {founded} = {born - founded} years.")
    return question, answer


def load_target_sets(seed: int = 0, cache_dir: str | os.PathLike[str] | None = None) -> dict[str, TokenStream]:
    """{target set: its byte-tokenised documents} for ``seed``, built and cached on first use."""
    from moejax.data.corpus import default_cache_dir

    directory = Path(cache_dir or default_cache_dir()) / f"{TARGETS_VERSION}-seed{seed}"
    if not (directory / MANIFEST_FILE).is_file():
        _write(directory, seed)
    streams = {}
    for name in TARGET_SETS:
        tokens, starts = (np.load(directory / f"{name}.{f}.npy", mmap_mode="r", allow_pickle=False) for f in ("tokens", "doc_starts"))
        streams[name] = TokenStream(tokens=tokens, doc_starts=starts)
    return streams


def _write(directory: Path, seed: int) -> None:
    tokenizer = get_tokenizer("byte")
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    try:
        manifest = {"version": TARGETS_VERSION, "seed": seed, "tokenizer": tokenizer.name, "sets": {}}
        for name, docs in (("heldout_qa", qa_documents(seed)),):
            stream = tokenize_documents(docs, tokenizer)
            for field, array in (("tokens", stream.tokens), ("doc_starts", stream.doc_starts)):
                np.save(tmp / f"{name}.{field}.npy", np.asarray(array), allow_pickle=False)
            manifest["sets"][name] = {"documents": len(docs), "tokens": int(stream.num_tokens)}
        (tmp / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2, sort_keys=True))
        try:
            os.rename(tmp, directory)
        except OSError:
            if not (directory / MANIFEST_FILE).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def target_eval_batches(*, seq_len: int, batch_size: int, batches_per_set: int, first_domain_id: int,
                        cache_dir: str | os.PathLike[str] | None = None, seed: int = 0,
                        windows: str = "first") -> dict[str, list]:
    """Fixed evaluation batches of every target set (like ``pipeline.make_eval_batches``, with the
    same ``windows``; batch ``domain`` ids from ``first_domain_id`` on, after the dataset's own domains)."""
    from moejax.data.packing import ShardedPacker
    from moejax.data.pipeline import fixed_batches

    rows = np.arange(batch_size)
    pad_id = get_tokenizer("byte").pad_id
    return {name: fixed_batches(ShardedPacker((stream,), seq_len, first_domain_id + k), batch_size, batches_per_set, rows,
                                pad_id, windows, name)
            for k, (name, stream) in enumerate(load_target_sets(seed, cache_dir).items())}
