"""``seq_aux``: DeepSeek-V3's complementary sequence-wise balance loss."""

from __future__ import annotations

import dataclasses

import jax

from moejax.model.balancing.base import Objective, State, hparam, number
from moejax.model.balancing.switch import grouped_switch_loss
from moejax.model.router import Routing


@dataclasses.dataclass(frozen=True, kw_only=True)
class SequenceAuxLoss(Objective):
    """L = weight * mean_b sum_e f_be P_be  (DeepSeek-AI 2024, "DeepSeek-V3 Technical Report",
    arXiv:2412.19437, section 2.1.2, eqs. 17-20), with

        f_be = E / (K T) * #{t : e in TopK(t)},   P_be = 1/T sum_t s'_bte,

    per sequence b of T tokens; s' are the routing scores normalised to sum to 1 (``probs_bte``).
    This is the Switch loss with every sequence its own group. A "sequence" is one packed training
    window (as in DeepSeek-V3), not one document. Meant with a small weight (DeepSeek-V3: 1e-4)
    next to ``loss_free``, to stop any single sequence from being extremely unbalanced.
    """

    name = "seq_aux"
    weight: float = hparam(check=number(0), doc="loss weight alpha")

    def loss(self, routing: Routing, state: State) -> jax.Array:
        return self.weight * grouped_switch_loss(routing, group_size=1)
