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

from moejax.upcycle.experts import METHODS, Plan, check_plan, function_preserving, upcycle_layer
from moejax.upcycle.workdir import RECORD_FILE, upcycle, upcycled_config, upcycled_params

__all__ = ["METHODS", "Plan", "RECORD_FILE", "check_plan", "function_preserving", "upcycle", "upcycle_layer",
           "upcycled_config", "upcycled_params"]
