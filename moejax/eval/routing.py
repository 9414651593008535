"""Routing statistics of a checkpoint per MoE layer, from the sums of :func:`forward.routing_sums`.

Per layer: ``load`` (fraction of top-k assignments per expert, sums to 1), ``max_vio``
(max load / mean load - 1), ``gini`` of the loads, ``entropy`` (mean per-token routing entropy,
nats; log E is uniform), and ``cooccurrence`` [E][E]: the fraction of tokens whose top-k holds
both experts (diagonal: the fraction of tokens choosing the expert at all), so an off-diagonal
mass far from what independent choices would give shows experts that come as a pair.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from moejax.train.metrics import gini, max_vio


def add_sums(total: dict[str, np.ndarray] | None, sums: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Accumulate the routing sums of another batch."""
    sums = {k: np.asarray(v, np.float64) for k, v in sums.items()}
    return sums if total is None else {k: total[k] + sums[k] for k in total}


def summarize(sums: dict[str, np.ndarray], moe_layers: list[int]) -> dict[str, Any]:
    """The JSON section ``routing``: ``layers`` (one entry per MoE layer, ``layer`` is the block
    index) and over layers ``max_vio`` (max), ``gini`` (mean), ``entropy`` (mean)."""
    counts_le = sums["counts_le"]
    if counts_le.shape[0] == 0:
        return {"layers": []}
    tokens = max(float(sums["tokens"]), 1.0)
    load_le = counts_le / np.maximum(counts_le.sum(axis=1, keepdims=True), 1.0)
    vio_l, gini_l, entropy_l = max_vio(load_le), gini(load_le), sums["entropy_l"] / tokens
    layers = [
        {
            "layer": layer, "load": load_le[i].tolist(), "max_vio": float(vio_l[i]), "gini": float(gini_l[i]),
            "entropy": float(entropy_l[i]), "cooccurrence": (sums["cooc_lee"][i] / tokens).tolist(),
        }
        for i, layer in enumerate(moe_layers)
    ]
    return {
        "layers": layers, "tokens": int(tokens), "max_vio": float(vio_l.max()), "gini": float(gini_l.mean()),
        "entropy": float(entropy_l.mean()),
    }
