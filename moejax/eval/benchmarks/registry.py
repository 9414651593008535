"""Benchmarks versions: one module each, one line each in :data:`REGISTRY` (name -> version).

A version module has ``VERSION`` (its name, also the cache directory's prefix), ``KINDS`` (task ->
``"multiple_choice"`` | ``"exact_match"``, in file order) and ``build_benchmarks(corpus, seed)``
(task -> items, deterministic). Task names of different versions never clash, so a built-in task
name alone says which version holds it (:func:`moejax.eval.tasks.builtin_task_versions`).

Versions are never changed once results depend on them: a new set of tasks is a new version.
``moejax.config.BENCHMARK_VERSIONS`` (the values of ``data.benchmarks``) lists the same names; the
config imports no package of moejax, so a test keeps the two lists equal.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from moejax.data.corpus import TokenizedCorpus
from moejax.eval.benchmarks import v1, v2


@dataclasses.dataclass(frozen=True)
class BenchmarkVersion:
    """One version of the built-in benchmarks."""

    name: str  # e.g. "benchmarks-v1"
    build: Callable[[TokenizedCorpus, int], dict[str, list[dict[str, Any]]]]  # (corpus, seed) -> task -> items
    kinds: Mapping[str, str]  # task -> kind, in file order


REGISTRY: dict[str, BenchmarkVersion] = {
    version.name: version
    for version in (
        BenchmarkVersion(v1.VERSION, v1.build_benchmarks, v1.KINDS),
        BenchmarkVersion(v2.VERSION, v2.build_benchmarks, v2.KINDS),
    )
}
VERSIONS: tuple[str, ...] = tuple(REGISTRY)


def get_version(version: str) -> BenchmarkVersion:
    """The registered ``version``; ValueError naming the allowed versions otherwise."""
    if version not in REGISTRY:
        raise ValueError(f"unknown benchmarks version {version!r}; allowed: {', '.join(VERSIONS)}")
    return REGISTRY[version]


def task_names(version: str) -> tuple[str, ...]:
    """The built-in task names of ``version`` (v1: the domains), in file order."""
    return tuple(get_version(version).kinds)
