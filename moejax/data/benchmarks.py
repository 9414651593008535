"""Moved to :mod:`moejax.eval.benchmarks` (the benchmarks-v1 tasks: :mod:`moejax.eval.benchmarks.v1`).

This module only keeps old imports working (with a ``DeprecationWarning``); it imports nothing
from :mod:`moejax.eval` until a name is asked for, so :mod:`moejax.data` does not depend on it.
"""

import importlib
import warnings
from typing import Any

_PACKAGE = ("Benchmarks", "VERSIONS", "load_benchmarks", "task_names")  # the rest is benchmarks-v1's
_V1 = ("VERSION", "ITEMS_PER_DOMAIN", "NUM_CHOICES", "CODE_CONTEXT_CHARS", "PROSE_CONTEXT_CHARS", "KINDS",
       "build_benchmarks")
__all__ = [*_PACKAGE, *_V1]


def __getattr__(name: str) -> Any:
    if name not in (*_PACKAGE, *_V1):
        raise AttributeError(f"module 'moejax.data.benchmarks' has no attribute {name!r}")
    where = "moejax.eval.benchmarks" if name in _PACKAGE else "moejax.eval.benchmarks.v1"
    warnings.warn(f"moejax.data.benchmarks.{name} moved to {where}.{name}", DeprecationWarning, stacklevel=2)
    return getattr(importlib.import_module(where), name)
