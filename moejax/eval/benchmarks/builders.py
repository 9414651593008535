"""What every benchmarks version builds its items with: seeded task generators, multiple-choice
assembly and the item-count check.

A version module (:mod:`.v1`, :mod:`.v2`) draws every random number of a task from the generator
:func:`task_rng` gives it, in a fixed order, so the same corpus and seed give the same items. These
functions are part of that order: changing what they draw changes every version's files, which
``tests/test_benchmarks.py`` pins by hash.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np


def task_rng(seed: int, task: str, version: str) -> np.random.Generator:
    """The generator of one task: seeded by the corpus seed and a hash of ``version/task``."""
    tag = int.from_bytes(hashlib.sha256(f"{version}/{task}".encode()).digest()[:8], "little")
    return np.random.default_rng([seed, tag])


def multiple_choice(context: str, gold: str, others: list[str], rng: np.random.Generator,
                    num_choices: int) -> dict[str, Any] | None:
    """An item with ``gold`` at a random position among ``num_choices - 1`` distinct ``others``
    (drawn without replacement); None when there are too few ``others`` or ``context`` is blank."""
    if len(others) < num_choices - 1 or not context.strip():
        return None
    picks = rng.choice(len(others), num_choices - 1, replace=False)
    choices = [others[i] for i in picks]
    position = int(rng.integers(num_choices))
    choices.insert(position, gold)
    return {"context": context, "choices": choices, "gold": position}


def exactly(items: list[dict[str, Any]], task: str, count: int) -> list[dict[str, Any]]:
    """The first ``count`` items; RuntimeError naming the task when fewer could be made."""
    if len(items) < count:
        raise RuntimeError(f"only {len(items)} {task} benchmark items could be made, {count} are needed")
    return items[:count]
