"""The built-in benchmarks of the built-in corpus: versioned, deterministic JSONL tasks.

Versions (:data:`VERSIONS`, one module each, registered in :mod:`.registry`):

- ``benchmarks-v1`` (:mod:`.v1`): one task per domain, named after the domain (``code``,
  ``prose``, ``math``, ``knowledge``);
- ``benchmarks-v2`` (:mod:`.v2`): graded tasks that carry signal for sweep-sized models
  (``code_chars``, ..., ``know_type``, ``math_copy``), the default of ``data.benchmarks``.

Both stay buildable and never change once results depend on them (``tests/test_benchmarks.py``
pins their items by hash): ``load_benchmarks(seed, cache_dir, version)``. :mod:`.builders` holds
what both build with (seeded task generators, multiple-choice assembly); :mod:`.cache` the cache.

Item formats (one JSON object per line, ``id`` is ``"<task>/<n>"``):

- multiple choice: ``{"id", "context", "choices", "gold"}``; score a model by the
  log-likelihood of each ``context + choice`` continuation and pick the highest (``gold`` is the
  index of the right choice; choices start with the separator they need, e.g. a space).
- exact match: ``{"id", "prompt", "answer"}``; greedy-decode after ``prompt`` and compare the
  text, up to the first newline, with ``answer``.

Benchmarks derive from the corpus of the same seed and from their own seeded generators, so the
same seed and interpreter give the same files. ``load_benchmarks`` caches them under
``<cache_dir>/<version>-seed<seed>/`` with a ``manifest.json`` holding each file's sha256,
the corpus hashes they derive from and one combined ``sha256``; compare it across machines.
The corpus itself is :mod:`moejax.data.corpus`; scoring is :mod:`moejax.eval.harness`.
"""

from moejax.eval.benchmarks.cache import Benchmarks, load_benchmarks
from moejax.eval.benchmarks.registry import REGISTRY, VERSIONS, BenchmarkVersion, get_version, task_names

__all__ = ["REGISTRY", "VERSIONS", "BenchmarkVersion", "Benchmarks", "get_version", "load_benchmarks", "task_names"]
