"""Moved to :mod:`moejax.eval.benchmarks.v2` (benchmarks-v2).

This module only keeps old imports working (with a ``DeprecationWarning``); it imports nothing
from :mod:`moejax.eval` until a name is asked for, so :mod:`moejax.data` does not depend on it.
"""

import importlib
import warnings
from typing import Any

_NAMES = ("VERSION", "ITEMS_PER_TASK", "SPAN_CHARS", "CONTEXT_CHARS", "SWAPS", "MIN_MENTIONS", "TEXTURE_DOMAINS",
          "KINDS", "build_benchmarks", "fact_mentions")  # the public names of benchmarks-v2
__all__ = list(_NAMES)


def __getattr__(name: str) -> Any:
    if name not in _NAMES:
        raise AttributeError(f"module 'moejax.data.benchmarks_v2' has no attribute {name!r}")
    warnings.warn(f"moejax.data.benchmarks_v2.{name} moved to moejax.eval.benchmarks.v2.{name}", DeprecationWarning,
                  stacklevel=2)
    return getattr(importlib.import_module("moejax.eval.benchmarks.v2"), name)
