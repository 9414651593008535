"""Generated encyclopaedic facts about a fixed fictional world (the ``knowledge`` domain).

The seed fixes a world of people, cities and chemical elements, each with attributes
(birthplace, founding year, atomic number, ...); attributes link entities to each other (a
person's birthplace is a city, an element's discoverer is a person). A document is a short
paragraph about one entity: a random subset of its facts, in random order, each stated with one
of several sentence templates. At the default size every entity is described about fifteen
times, so the same facts recur in different wordings: a model with enough capacity can memorise
them, and held-out documents test recall of facts seen in training rather than new facts.
"""

from __future__ import annotations

import dataclasses
import string
from typing import Final

import numpy as np

NUM_PEOPLE: Final = 1200
NUM_CITIES: Final = 200
NUM_ELEMENTS: Final = 100
NUM_COUNTRIES: Final = 20
NUM_FIRST_NAMES: Final = 150
NUM_SURNAMES: Final = 400

_MAX_ATTEMPTS: Final = 10_000
_SYLLABLES: Final = (
    "ba", "ber", "ca", "dor", "el", "fen", "ga", "hal", "is", "jo", "ka", "lin", "mar", "ne",
    "or", "pel", "qua", "ros", "sa", "tesk", "ul", "ven", "wil", "xa", "yor", "zan", "mi", "tor",
    "la", "dre", "vi", "nor",
)
_RIVERS: Final = (
    "Amber", "Silt", "Greywater", "Loma", "Brisk", "Ostra", "Kell", "Varn", "Mireth", "Sable",
    "Tarrow", "Eddin", "Corl", "Wend", "Isk", "Halden",
)
_OCCUPATIONS: Final = (
    "an astronomer", "a chemist", "a cartographer", "a poet", "a shipbuilder", "a physician",
    "a composer", "a mathematician", "an architect", "a botanist", "a historian", "a painter",
    "an engineer", "a judge", "a merchant", "a geologist", "a linguist", "a sculptor",
)
_COLOURS: Final = ("silver", "pale green", "deep blue", "golden", "violet", "black", "white", "red")
_STATES: Final = ("solid", "liquid", "gas")

# kind -> attribute -> the sentences that state it ({name}, {value}); the built-in benchmarks ask
# facts with the same wordings (moejax.eval.benchmarks).
TEMPLATES: Final[dict[str, dict[str, tuple[str, ...]]]] = {
    "person": {
        "birthplace": (
            "{name} was born in {value}.",
            "The birthplace of {name} is {value}.",
            "{name} is a native of {value}.",
        ),
        "birth_year": (
            "{name} was born in {value}.",
            "The year of birth of {name} is {value}.",
            "In {value}, {name} was born.",
        ),
        "occupation": (
            "{name} worked as {value}.",
            "By profession, {name} was {value}.",
            "{name} is remembered as {value}.",
        ),
        "residence": (
            "{name} lived in {value}.",
            "For most of their life, {name} lived in {value}.",
            "{name} made a home in {value}.",
        ),
        "mentor": (
            "{name} studied under {value}.",
            "The mentor of {name} was {value}.",
            "{value} was the teacher of {name}.",
        ),
        "discovered": (
            "{name} discovered {value}.",
            "{value} was discovered by {name}.",
            "The element {value} was first described by {name}.",
        ),
    },
    "city": {
        "country": (
            "{name} is a city in {value}.",
            "{name} lies in {value}.",
            "The city of {name} belongs to {value}.",
        ),
        "founded": (
            "{name} was founded in {value}.",
            "The founding year of {name} is {value}.",
            "In {value}, the city of {name} was founded.",
        ),
        "population": (
            "{name} has a population of {value}.",
            "About {value} people live in {name}.",
            "The population of {name} is {value}.",
        ),
        "river": (
            "{name} stands on the {value} river.",
            "The {value} river flows through {name}.",
            "{name} was built on the banks of the {value}.",
        ),
        "notable_native": (
            "{value} was born in {name}.",
            "{name} is the birthplace of {value}.",
            "Among the natives of {name} is {value}.",
        ),
    },
    "element": {
        "symbol": (
            "The chemical symbol of {name} is {value}.",
            "{name} has the symbol {value}.",
            "In formulas, {name} is written {value}.",
        ),
        "atomic_number": (
            "{name} has atomic number {value}.",
            "The atomic number of {name} is {value}.",
            "Element number {value} is {name}.",
        ),
        "discoverer": (
            "{name} was discovered by {value}.",
            "{value} discovered {name}.",
            "The discoverer of {name} was {value}.",
        ),
        "discovery_year": (
            "{name} was discovered in {value}.",
            "{name} was first isolated in {value}.",
            "The discovery of {name} dates to {value}.",
        ),
        "colour": (
            "{name} is {value} in colour.",
            "Pure {name} has a {value} colour.",
            "Samples of {name} look {value}.",
        ),
        "state": (
            "At room temperature, {name} is a {value}.",
            "{name} is a {value} under normal conditions.",
            "Under normal conditions, {name} is a {value}.",
        ),
    },
}


@dataclasses.dataclass(frozen=True)
class Entity:
    """A person, city or element, with its facts as attribute -> rendered value."""

    kind: str
    name: str
    facts: dict[str, str]


def build_world(seed: int) -> list[Entity]:
    """The fictional world for ``seed``: people, then cities, then elements."""
    rng = np.random.default_rng([seed, 0x776F726C64])  # "world"
    names = _NameMaker(rng)
    countries = [names.make(2, suffix="ia") for _ in range(NUM_COUNTRIES)]
    city_names = [names.make(2) for _ in range(NUM_CITIES)]
    element_names = [names.make(2, suffix="ium") for _ in range(NUM_ELEMENTS)]
    first_names = [names.make(2) for _ in range(NUM_FIRST_NAMES)]
    surnames = [names.make(3) for _ in range(NUM_SURNAMES)]
    people_names = _unique_pairs(rng, first_names, surnames, NUM_PEOPLE)

    birth_years = rng.integers(1700, 1981, NUM_PEOPLE)
    people = []
    for i in range(NUM_PEOPLE):
        people.append({
            "birthplace": city_names[rng.integers(NUM_CITIES)],
            "birth_year": str(birth_years[i]),
            "occupation": _OCCUPATIONS[rng.integers(len(_OCCUPATIONS))],
            "residence": city_names[rng.integers(NUM_CITIES)],
            "mentor": people_names[(i + 1 + rng.integers(NUM_PEOPLE - 1)) % NUM_PEOPLE],
        })

    elements = []
    symbols = _unique_symbols(element_names)
    atomic_numbers = 119 + rng.permutation(3 * NUM_ELEMENTS)[:NUM_ELEMENTS]
    discoverers = rng.choice(NUM_PEOPLE, NUM_ELEMENTS, replace=False)
    for i, element in enumerate(element_names):
        person = int(discoverers[i])
        people[person]["discovered"] = element
        elements.append({
            "symbol": symbols[i],
            "atomic_number": str(atomic_numbers[i]),
            "discoverer": people_names[person],
            "discovery_year": str(birth_years[person] + rng.integers(25, 61)),
            "colour": _COLOURS[rng.integers(len(_COLOURS))],
            "state": _STATES[rng.integers(len(_STATES))],
        })

    cities = []
    natives = {}
    for i, person in enumerate(people):
        natives.setdefault(person["birthplace"], people_names[i])
    for city in city_names:
        facts = {
            "country": countries[rng.integers(NUM_COUNTRIES)],
            "founded": str(rng.integers(600, 1901)),
            "population": f"{int(rng.integers(1_000, 2_500_000)):,}",
            "river": _RIVERS[rng.integers(len(_RIVERS))],
        }
        if city in natives:
            facts["notable_native"] = natives[city]
        cities.append(facts)

    return (
        [Entity("person", n, f) for n, f in zip(people_names, people)]
        + [Entity("city", n, f) for n, f in zip(city_names, cities)]
        + [Entity("element", n, f) for n, f in zip(element_names, elements)]
    )


def describe(entity: Entity, rng: np.random.Generator) -> str:
    """A paragraph of three or more of ``entity``'s facts, in random order and wording."""
    attributes = list(entity.facts)
    count = int(rng.integers(min(3, len(attributes)), len(attributes) + 1))
    sentences = []
    for a in rng.permutation(len(attributes))[:count]:
        attribute = attributes[a]
        templates = TEMPLATES[entity.kind][attribute]
        template = templates[rng.integers(len(templates))]
        sentences.append(template.format(name=entity.name, value=entity.facts[attribute]))
    return " ".join(sentences)


def knowledge_documents(seed: int, target_chars: int) -> list[str]:
    """Paragraphs about the entities of ``build_world(seed)`` until ``target_chars`` are reached.

    Entities are visited in a fresh random order on each pass, so every entity is described
    about equally often. A paragraph identical to an earlier one is dropped, so held-out
    documents restate known facts but never repeat a training document verbatim.
    """
    world = build_world(seed)
    rng = np.random.default_rng([seed, 0x666163747378])  # "factsx"
    documents: list[str] = []
    seen: set[str] = set()
    total = 0
    while total < target_chars:
        for index in rng.permutation(len(world)):
            document = describe(world[index], rng)
            if document in seen:
                continue
            documents.append(document)
            seen.add(document)
            total += len(document)
            if total >= target_chars:
                break
    return documents


class _NameMaker:
    """Distinct capitalised names built from random syllables."""

    def __init__(self, rng: np.random.Generator):
        self._rng = rng
        self._used: set[str] = set()

    def make(self, syllables: int, suffix: str = "") -> str:
        for _ in range(_MAX_ATTEMPTS):
            parts = self._rng.choice(len(_SYLLABLES), syllables)
            name = ("".join(_SYLLABLES[p] for p in parts) + suffix).capitalize()
            if name not in self._used:
                self._used.add(name)
                return name
        raise RuntimeError(f"no unused {syllables}-syllable name left after {_MAX_ATTEMPTS} tries")


def _unique_pairs(
    rng: np.random.Generator, firsts: list[str], lasts: list[str], count: int
) -> list[str]:
    """``count`` distinct "First Last" names drawn from the two pools."""
    if count > len(firsts) * len(lasts):
        raise ValueError(f"cannot make {count} distinct names from {len(firsts)}x{len(lasts)}")
    pairs = rng.permutation(len(firsts) * len(lasts))[:count]
    return [f"{firsts[p // len(lasts)]} {lasts[p % len(lasts)]}" for p in pairs]


def _unique_symbols(names: list[str]) -> list[str]:
    """A distinct chemical symbol per name: its initial plus the first free later letter."""
    used: set[str] = set()
    symbols = []
    for name in names:
        tails = name[1:].lower() + string.ascii_lowercase
        candidates = [name[0] + t for t in tails] + [name[0] + a + b for a in tails for b in tails]
        symbols.append(next(c for c in candidates if c not in used))
        used.add(symbols[-1])
    return symbols
