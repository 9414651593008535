"""Sparse upcycling: a dense model (a moejax workdir or a Hugging Face Llama/Qwen2/Qwen3 directory)
made into an MoE that starts where the dense model stood (docs/upcycling.md).

    moejax upcycle --from DENSE --workdir OUT --experts E --top-k K [--shared-expert]
        [--method copy|drop] [--drop-ratio R] [--expert-width F] [--seed S]

==============  =====================================================================
``experts``     one dense MLP -> one MoE layer's parameters (copy, drop, fine-grained)
``workdir``     read the dense source, write the upcycled workdir
``cli``         ``python -m moejax.upcycle`` / ``moejax upcycle``
==============  =====================================================================
"""

from typing import Any

from moejax.upcycle.experts import METHODS, Plan, check_plan, function_preserving, upcycle_layer

_WORKDIR_NAMES = ("RECORD_FILE", "upcycle", "upcycled_config", "upcycled_params")


def __getattr__(name: str) -> Any:
    """The workdir functions, imported on first use (they need JAX; ``--help`` does not)."""
    if name in _WORKDIR_NAMES:
        from moejax.upcycle import workdir

        return getattr(workdir, name)
    raise AttributeError(f"module 'moejax.upcycle' has no attribute {name!r}")

__all__ = ["METHODS", "Plan", "RECORD_FILE", "check_plan", "function_preserving", "upcycle", "upcycle_layer",
           "upcycled_config", "upcycled_params"]
