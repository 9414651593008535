"""``dpsl``: Dirichlet-prior shaping of each expert's routing-probability distribution."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import scipy.special

from moejax.model.balancing.base import Objective, State, hparam, number
from moejax.model.router import Routing


@functools.lru_cache(maxsize=32)
def beta_quantiles(a: float, b: float, n: int) -> np.ndarray:
    """Quantiles of Beta(a, b) at the midpoints (i + 1/2) / n, i < n, float32 [n]."""
    levels = (np.arange(n, dtype=np.float64) + 0.5) / n
    return scipy.special.betaincinv(a, b, levels).astype(np.float32)


@dataclasses.dataclass(frozen=True, kw_only=True)
class DirichletPriorShaping(Objective):
    """Dirichlet-prior shaping loss (Mirvakhabova, Ehteshami Bejnordi, et al. 2025, "Dirichlet-Prior
    Shaping: Guiding Expert Specialization in Upcycled MoEs", arXiv:2510.01185).

    Prior: routing distributions p_t ~ Dirichlet(c, ..., c) over E experts, whose marginal for
    one expert is p_te ~ Beta(c, (E - 1) c). The loss matches, for every expert e, the empirical
    distribution of {p_te} over the micro-batch's N = B T tokens to that Beta marginal.

    The divergence (our concrete choice; the paper leaves room) is the squared 2-Wasserstein
    distance between the two 1-D distributions, computed exactly by the monotone coupling: sort
    the N samples and compare them with the Beta quantiles at the midpoints (i + 1/2)/N,

        L = weight * mean_e mean_i (E * (sort_t(p_te)_i - F^{-1}_{Beta(c,(E-1)c)}((i + 1/2)/N)))^2.

    The E scale makes values O(1) whatever E. Matching the whole distribution shapes both balance
    (every expert's mean is 1/E) and confidence: c < 1 asks for peaked routing (specialised
    experts), c > 1 for flatter routing. Cost: a sort of N values per expert and layer (under SPMD
    the micro-batch's probabilities of each expert are gathered), so this suits small and medium
    runs and fine-tuning, the paper's setting, more than very large batches.
    """

    name = "dpsl"
    weight: float = hparam(check=number(0), doc="loss weight")
    concentration: float = hparam(1.0, check=number(0), doc="symmetric Dirichlet concentration c")

    def loss(self, routing: Routing, state: State) -> jax.Array:
        e = routing.probs_bte.shape[-1]
        p_ne = routing.probs_bte.reshape(-1, e)
        c = float(self.concentration)
        target_n = jnp.asarray(beta_quantiles(c, (e - 1) * c, p_ne.shape[0]))
        gap_ne = jnp.sort(p_ne, axis=0) - target_n[:, None]
        return self.weight * jnp.mean(jnp.square(e * gap_ne))
