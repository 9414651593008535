"""``phi``: phi-balancing, a priced balance loss against an EMA of the population routing."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from moejax.model.balancing.base import (
    Check, Objective, State, StepStats, is_real, hparam, mean_probs, number, one_of,
)
from moejax.model.router import Routing

POTENTIALS = ("neg_entropy", "sq_l2", "tsallis")


def price(potential: str, m_e: jax.Array, tsallis_q: float = 1.5) -> jax.Array:
    """q = grad phi(m) for a routing distribution m (float32 [E], sums to 1).

    Each potential phi is convex and symmetric, and scaled so that its curvature at the uniform
    m = 1/E is E, like the negative entropy's (1/m): the same alpha pushes equally hard near
    balance, whatever the potential.

    - ``neg_entropy``: phi(m) = sum m log m,                       q = log m + 1
    - ``sq_l2``:       phi(m) = E/2 sum m^2,                       q = E m
    - ``tsallis``:     phi(m) = sum (E m)^s / (E s (s - 1)),       q = (E m)^(s-1) / (s - 1)
      (s = ``tsallis_q``; s -> 1 recovers neg_entropy up to a constant, s = 2 is sq_l2 up to one)

    Constants in q do not matter: the loss multiplies q by a distribution that sums to 1.
    """
    e = m_e.shape[-1]
    m_e = jnp.maximum(m_e.astype(jnp.float32), jnp.finfo(jnp.float32).tiny)
    if potential == "neg_entropy":
        return jnp.log(m_e) + 1.0
    if potential == "sq_l2":
        return e * m_e
    if potential == "tsallis":
        return (e * m_e) ** (tsallis_q - 1.0) / (tsallis_q - 1.0)
    raise ValueError(f"unknown potential {potential!r}; choose one of {POTENTIALS}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class PhiBalancing(Objective):
    """phi-balancing (Chen, Li, et al. 2026, "phi-Balancing for Mixture-of-Experts Training",
    arXiv:2605.15403): minimise a convex potential phi of the *population* routing distribution
    by online mirror descent instead of penalising noisy mini-batch counts.

    State m_e: an EMA of pbar_e, the mean routing probability over the global batch,

        m <- (1 - eta) m + eta * pbar          (once per optimizer step; m = 1/E at start)

    and the loss of a micro-batch, with the price q = grad phi(m) of the state *before* the step:

        L = alpha * sum_e stop_grad(q_e - mean(q)) * pbar_e(micro-batch)

    (centring q changes no gradient, since sum_e pbar_e = 1, and makes L read 0 at uniform
    routing).

    The gradient pushes routing probability from overpriced (overused) experts to cheap ones.
    Because q is a constant of the step and the loss is linear in pbar, summing micro-batch
    gradients gives exactly the global-batch gradient. Cost: one [E] vector per layer.
    """

    name = "phi"
    alpha: float = hparam(check=number(0), doc="loss weight")
    eta: float = hparam(0.65, check=number(0, 1), doc="EMA rate of m (paper: about 0.6-0.7)")
    potential: str = hparam("neg_entropy", check=one_of(*POTENTIALS), doc="the potential phi")
    tsallis_q: float = hparam(
        1.5,
        check=Check(lambda s: is_real(s) and s > 0 and s != 1, "a number > 0 other than 1 (1 is 'neg_entropy')"),
        doc="exponent of the Tsallis potential (only with potential='tsallis')",
    )

    def init_state(self) -> State:
        e = self.setup.num_experts
        return {"m_e": jnp.full((e,), 1.0 / e, jnp.float32)}

    def loss(self, routing: Routing, state: State) -> jax.Array:
        q_e = jax.lax.stop_gradient(price(self.potential, state["m_e"], self.tsallis_q))
        # Centred: the value reads 0 at uniform routing; no gradient changes, as sum_e pbar_e = 1.
        return self.alpha * jnp.sum((q_e - jnp.mean(q_e)) * mean_probs(routing))

    def update(self, state: State, stats: StepStats) -> State:
        pbar_e = stats.pbar_e.astype(jnp.float32)
        return {"m_e": (1.0 - self.eta) * state["m_e"] + self.eta * pbar_e}

    def metrics(self, state: State) -> dict[str, jax.Array]:
        m_e = state["m_e"]
        return {"ema_max_vio": m_e.shape[-1] * jnp.max(m_e) - 1.0}
