"""The platform the model is traced for: the one JAX runs on, or the one a cross-platform lowering names.

Two choices in the model depend on the platform and are made while tracing, in Python: the
grouped matmul that ``model.moe.grouped_matmul="auto"`` resolves to
(:func:`moejax.model.grouped_matmul.resolve_impl`) and the attention kernel
(:class:`moejax.model.layers.Attention`). Both ask :func:`current`, which is
``jax.default_backend()`` unless a :func:`lowering_for` block says otherwise. That block is how a
CPU-only machine traces the step a GPU or TPU would run, to lower it for that platform
(``jax.jit(f).trace(...).lower(lowering_platforms=("cuda",))``; experiments/tools/lower_check.py)
and check that every op has a lowering there.

JAX's trace caches do not know this setting (a function traced for one platform would be served
again, for the same input shapes, to a trace for another), so entering and leaving the block
clears them (``jax.clear_caches()``; compiled programs are recompiled on their next call, from the
persistent compilation cache where one is set).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import jax

# JAX's lowering platform names -> the backend family jax.default_backend() reports.
FAMILIES = {"cpu": "cpu", "cuda": "gpu", "rocm": "gpu", "gpu": "gpu", "tpu": "tpu"}

_TARGET: contextvars.ContextVar[str | None] = contextvars.ContextVar("moejax_target_platform", default=None)


def current() -> str:
    """``"cpu"``, ``"gpu"`` or ``"tpu"``: the backend the model is being traced for."""
    return _TARGET.get() or jax.default_backend()


@contextlib.contextmanager
def lowering_for(platform: str) -> Iterator[None]:
    """Trace the model inside this block as it would be traced on ``platform`` (``"cpu"``,
    ``"cuda"``, ``"rocm"``, ``"gpu"`` or ``"tpu"``)."""
    if platform not in FAMILIES:
        raise ValueError(f"platform must be one of {sorted(FAMILIES)}, got {platform!r}")
    jax.clear_caches()
    token = _TARGET.set(FAMILIES[platform])
    try:
        yield
    finally:
        _TARGET.reset(token)
        jax.clear_caches()
