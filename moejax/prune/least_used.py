"""Least-used: keep the K experts of a layer that receive the most top-k assignments on the
calibration tokens (routed as trained, balancing bias included). The baseline the other methods
must beat; the same rule as the masking study (:func:`moejax.eval.masking.least_used`, ties:
the lower expert id is pruned first)."""

from __future__ import annotations

import numpy as np

from moejax.eval.masking import least_used as _least_used_mask
from moejax.prune.calibration import LayerData


def expert_load(data: LayerData) -> np.ndarray:
    """Fraction of the layer's (token, choice) assignments each expert receives, float64 [E]."""
    counts_e = np.bincount(data.idx_tk.reshape(-1), minlength=data.num_experts).astype(np.float64)
    return counts_e / max(counts_e.sum(), 1.0)


def least_used_keep(data: LayerData, k: int) -> tuple[int, ...]:
    """The ``k`` most-used experts (sorted ids)."""
    masked_e = _least_used_mask(expert_load(data)[None], data.num_experts - k)[0]
    return tuple(int(e) for e in np.flatnonzero(~masked_e))
