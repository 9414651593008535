"""``z_loss``: the ST-MoE router z-loss, keeping router logits small."""

from __future__ import annotations

import dataclasses

import jax

from moejax.model.balancing.base import Objective, State, hparam, number
from moejax.model.router import Routing, z_loss


@dataclasses.dataclass(frozen=True, kw_only=True)
class RouterZLoss(Objective):
    """L = weight * mean_{b,t} (log sum_e exp(logits_bte))^2  (Zoph et al. 2022, "ST-MoE",
    arXiv:2202.08906, eq. 5). Not a balancer: it stabilises the router (no large logits, so no
    round-off in the softmax) and composes with any balancing objective."""

    name = "z_loss"
    weight: float = hparam(check=number(0), doc="loss weight")

    def loss(self, routing: Routing, state: State) -> jax.Array:
        return self.weight * z_loss(routing.logits_bte)
