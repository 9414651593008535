"""Repeated data: effective tokens of a domain with a fixed pool of unique tokens (Muennighoff et al. 2023).

A domain with U unique tokens trained on for D tokens repeats its pool R = D / U - 1 times
beyond the first epoch. "Scaling Data-Constrained Language Models" (Muennighoff et al. 2023,
arXiv 2305.16264, eq. 5) finds that repeated tokens are worth less and less, with the
*effective* tokens

    D' = min(D, U) + U R* (1 - exp(-R / R*)),        R = max(D / U - 1, 0)

R* is the number of repetitions after which repeated data has lost 1 - 1/e of its value;
their fit gives R* = 15.4 (:data:`R_STAR_DEFAULT`; a few epochs are worth almost as much as new
data, beyond R* they add little). Below one epoch D' = D; D' never exceeds U (1 + R*).

This module is the formula's one implementation (``jax.numpy``, differentiable in every
argument, so a law can fit R*). :func:`effective_mixture` applies it per training domain of a
mixture: D_i = r_i D tokens of domain i with pool U_i (``inf``: unlimited, D'_i = D_i), and
returns the effective total and shares, which the repetition-aware laws
(``data_mixture/laws/repeated.py``) put in place of D and r.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

R_STAR_DEFAULT = 15.4  # Muennighoff et al. 2023: fitted R* of repeated tokens
R_STAR_BOUNDS = (0.5, 100.0)  # what a fitted R* may take (repetitions)


def effective_tokens(d, u, r_star):
    """D' (same shape as ``d``): effective tokens of ``d`` tokens from a pool of ``u`` unique
    tokens (broadcast; ``u`` > 0 finite) with decay ``r_star`` > 0 (see the module docstring)."""
    d, u = jnp.asarray(d), jnp.asarray(u)
    rep = jnp.maximum(d / u - 1.0, 0.0)
    return jnp.minimum(d, u) + u * r_star * (1.0 - jnp.exp(-rep / r_star))


def effective_mixture(d_rm, u_rm, r_star):
    """(D'_total (R,), effective shares (R, M)) of per-domain tokens ``d_rm`` (R, M) with pools
    ``u_rm`` (R, M; ``inf`` or NaN where a domain is unlimited). Domains with no tokens stay 0."""
    d_rm, u_rm = jnp.asarray(d_rm), jnp.asarray(u_rm)
    limited = jnp.isfinite(u_rm) & (u_rm > 0)
    u_safe = jnp.where(limited, u_rm, 1.0)
    eff = jnp.where(limited, effective_tokens(d_rm, u_safe, r_star), d_rm)
    total = jnp.sum(eff, axis=-1)
    return total, eff / jnp.maximum(total, 1e-300)[..., None]


def epochs(d_rm: np.ndarray, u_rm: np.ndarray) -> np.ndarray:
    """Epochs D_i / U_i of each domain (0 where U_i is unlimited)."""
    d_rm, u_rm = np.asarray(d_rm, np.float64), np.asarray(u_rm, np.float64)
    ok = np.isfinite(u_rm) & (u_rm > 0)
    return np.where(ok, d_rm / np.where(ok, u_rm, 1.0), 0.0)
