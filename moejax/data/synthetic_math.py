"""Generated arithmetic and algebra problems with worked answers (the ``math`` domain).

A document is a short worksheet: 3 to 8 problems separated by blank lines. Problem kinds:
sums and differences, products, exact quotients, remainders, squares, percentages, linear
equations, bracketed expressions evaluated step by step, and two-step word problems. Every
answer is exact and checkable, so a model's loss on the answers measures arithmetic skill.

Generation is driven by one seeded ``numpy`` generator; each problem consumes one row of
uniform draws, so the output depends only on the seed and the target size.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Final, TypeVar

import numpy as np

_T = TypeVar("_T")
_DRAWS_PER_ROW: Final = 10
_ROWS_PER_BLOCK: Final = 4096

_NAMES: Final = (
    "Ana", "Ben", "Chloe", "Dev", "Elif", "Femi", "Grace", "Hiro", "Ines", "Jonas", "Kemal",
    "Lena", "Mateo", "Nadia", "Oskar", "Priya", "Quinn", "Rosa", "Sami", "Tomas", "Uma", "Wen",
)
_ITEMS: Final = (
    "apples", "marbles", "stickers", "books", "coins", "pencils", "stamps", "shells", "cards",
    "beads", "tickets", "cookies",
)
_CONTAINERS: Final = ("bags", "boxes", "packs", "jars", "crates")


def _pick(u: float, options: Sequence[_T]) -> _T:
    return options[min(int(u * len(options)), len(options) - 1)]


def _int(u: float, low: int, high: int) -> int:
    """An integer in [low, high] from a uniform draw ``u`` in [0, 1)."""
    return min(low + int(u * (high - low + 1)), high)


def _sum_or_difference(u: list[float]) -> str:
    digits = _int(u[0], 1, 5)
    a, b = _int(u[1], 0, 10**digits), _int(u[2], 0, 10**digits)
    if u[3] < 0.5:
        return f"Q: What is {a} + {b}?\nA: {a + b}"
    return f"Q: What is {a} - {b}?\nA: {a - b}"


def _product(u: list[float]) -> str:
    a, b = _int(u[0], 2, 10 ** _int(u[2], 1, 3)), _int(u[1], 2, 99)
    question = f"What is {a} * {b}?" if u[3] < 0.5 else f"Calculate {a} times {b}."
    return f"Q: {question}\nA: {a * b}"


def _quotient(u: list[float]) -> str:
    divisor, quotient = _int(u[0], 2, 40), _int(u[1], 2, 500)
    return f"Q: What is {divisor * quotient} / {divisor}?\nA: {quotient}"


def _remainder(u: list[float]) -> str:
    dividend, divisor = _int(u[0], 10, 2000), _int(u[1], 2, 30)
    return (
        f"Q: What is the remainder when {dividend} is divided by {divisor}?\n"
        f"A: {dividend} = {dividend // divisor} * {divisor} + {dividend % divisor}, "
        f"so the remainder is {dividend % divisor}."
    )


def _square(u: list[float]) -> str:
    n = _int(u[0], 2, 99)
    return f"Q: What is {n} squared?\nA: {n} * {n} = {n * n}"


def _percentage(u: list[float]) -> str:
    percent, base = 5 * _int(u[0], 1, 19), 20 * _int(u[1], 1, 50)
    answer = percent * base // 100
    return f"Q: What is {percent}% of {base}?\nA: {percent} / 100 * {base} = {answer}"


def _linear_equation(u: list[float]) -> str:
    a, x, b = _int(u[0], 2, 12), _int(u[1], -20, 20), _int(u[2], 1, 50)
    sign, c = ("+", a * x + b) if u[3] < 0.5 else ("-", a * x - b)
    inverse = "-" if sign == "+" else "+"
    return (
        f"Solve for x: {a}x {sign} {b} = {c}.\n"
        f"{a}x = {c} {inverse} {b} = {a * x}, so x = {a * x} / {a}. x = {x}"
    )


def _bracketed_expression(u: list[float]) -> str:
    a, b, c, d = _int(u[0], 1, 50), _int(u[1], 1, 50), _int(u[2], 2, 9), _int(u[3], 1, 40)
    inner = a + b if u[4] < 0.5 else a - b
    op = "+" if u[4] < 0.5 else "-"
    product = inner * c
    return (
        f"Q: Evaluate ({a} {op} {b}) * {c} - {d}.\n"
        f"A: ({a} {op} {b}) * {c} - {d} = {inner} * {c} - {d} = {product} - {d} = {product - d}"
    )


def _word_problem(u: list[float]) -> str:
    name, friend = _pick(u[0], _NAMES), _pick(u[1], _NAMES)
    if friend == name:
        friend = _NAMES[(_NAMES.index(name) + 1) % len(_NAMES)]
    item, container = _pick(u[2], _ITEMS), _pick(u[3], _CONTAINERS)
    start, groups, per_group = _int(u[4], 0, 60), _int(u[5], 2, 9), _int(u[6], 2, 15)
    total = start + groups * per_group
    if u[7] < 0.5:
        given = _int(u[8], 1, total)
        return (
            f"Q: {name} has {start} {item}. {name} buys {groups} {container} with {per_group} "
            f"{item} each, then gives {given} {item} to {friend}. "
            f"How many {item} does {name} have now?\n"
            f"A: {start} + {groups} * {per_group} = {total}. {total} - {given} = {total - given}. "
            f"The answer is {total - given}."
        )
    people = _int(u[8], 2, 6)
    start += -total % people  # Make the share exact.
    total = start + groups * per_group
    return (
        f"Q: {name} has {start} {item} and buys {groups} {container} with {per_group} {item} "
        f"each, then shares all of them equally among {people} children. "
        f"How many {item} does each child get?\n"
        f"A: {start} + {groups} * {per_group} = {total}. {total} / {people} = {total // people}. "
        f"The answer is {total // people}."
    )


_PROBLEM_KINDS: Final[tuple[Callable[[list[float]], str], ...]] = (
    _sum_or_difference,
    _product,
    _quotient,
    _remainder,
    _square,
    _percentage,
    _linear_equation,
    _bracketed_expression,
    _word_problem,
)


def uniform_rows(rng: np.random.Generator, width: int) -> Iterator[list[float]]:
    """Rows of ``width`` uniform draws in [0, 1), drawn from ``rng`` in blocks, forever."""
    while True:
        yield from rng.random((_ROWS_PER_BLOCK, width)).tolist()


def math_documents(seed: int, target_chars: int) -> list[str]:
    """Worksheets of problems, generated from ``seed`` until ``target_chars`` are reached."""
    rows = uniform_rows(np.random.default_rng([seed, 0x6D617468]), _DRAWS_PER_ROW)  # "math"
    documents: list[str] = []
    total = 0
    while total < target_chars:
        problems = []
        for _ in range(_int(next(rows)[0], 3, 8)):
            row = next(rows)
            problems.append(_pick(row[0], _PROBLEM_KINDS)(row[1:]))
        documents.append("\n\n".join(problems))
        total += len(documents[-1])
    return documents


# Problem kinds whose whole answer is one number right after "A: " (for exact-match scoring).
_EXACT_ANSWER_KINDS: Final = (_sum_or_difference, _product, _quotient)


def exact_answer_problems(seed: int, count: int) -> list[tuple[str, str]]:
    """``count`` distinct ``(prompt, answer)`` pairs in the training format, for evaluation.

    The prompt ends with ``"A:"`` and the answer is ``" <number>"``. Drawn from a generator
    stream separate from ``math_documents``, so the problems are fresh draws of the kinds seen
    in training (a few short sums recur by chance).
    """
    rows = uniform_rows(np.random.default_rng([seed, 0x6D617468, 0x6576616C]), _DRAWS_PER_ROW)
    problems: dict[str, str] = {}
    while len(problems) < count:
        row = next(rows)
        question, answer = _pick(row[0], _EXACT_ANSWER_KINDS)(row[1:]).split("\nA: ")
        problems.setdefault(f"{question}\nA:", f" {answer}")
    return list(problems.items())
