"""Hugging Face export of a pruned workdir: through the interop package's public export, after
refusing what a Hugging Face MoE config cannot say.

Standard Hugging Face MoE configs (Mixtral, Qwen2/3-MoE, dots1) hold one expert count for every
layer, so a pruned workdir with per-layer counts (``model.moe.layer_experts``) has no exact
Hugging Face form and is refused, naming why; one pruned to the same count in every layer exports
as any workdir does (its ``model.moe.num_experts`` is that count).
"""

from __future__ import annotations

import json
import os

from moejax.interop.hf import InteropError, export_from_workdir


def export_pruned(workdir: str, hf_dir: str, *, arch: str | None = None, dtype: str = "float32",
                  force: bool = False) -> str:
    """Exports ``workdir`` (pruned or not) to ``hf_dir``; returns the architecture written."""
    path = os.path.join(workdir, "config.json")
    if os.path.isfile(path):
        with open(path) as f:
            counts = tuple(json.load(f).get("model", {}).get("moe", {}).get("layer_experts", ()) or ())
        if counts and len(set(counts)) > 1:
            raise InteropError(
                f"{workdir} keeps a different number of experts per MoE layer (model.moe.layer_experts="
                f"{list(counts)}); Hugging Face MoE configs hold one expert count for all layers, so it has no "
                "exact Hugging Face form. Prune with the same --keep or --ratio in every layer to export."
            )
    return export_from_workdir(workdir, hf_dir, arch=arch, dtype=dtype, force=force)
