"""``switch``: the Switch Transformer load-balancing loss, per micro-batch or per group of sequences."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from moejax.model.balancing.base import Objective, State, hparam, number, positive_int_or_none
from moejax.model.router import Routing, sequence_counts


def grouped_switch_loss(routing: Routing, group_size: int | None) -> jax.Array:
    """mean over groups g of E * sum_e f_ge P_ge (unweighted; 1 when routing is uniform).

    A group is ``group_size`` consecutive sequences (None: the whole micro-batch). f_ge is the
    fraction of the group's (token, choice) assignments that go to expert e, P_ge the mean routing
    probability of expert e over the group's tokens. f carries no gradient (it counts choices);
    the gradient flows through P.
    """
    b, t, k = routing.idx_btk.shape
    e = routing.probs_bte.shape[-1]
    group_size = b if group_size is None else group_size
    groups = b // group_size
    counts_ge = jnp.sum(sequence_counts(routing.idx_btk, e).reshape(groups, group_size, e), axis=1)
    f_ge = counts_ge / (group_size * t * k)
    p_ge = jnp.mean(routing.probs_bte.reshape(groups, group_size * t, e), axis=1)
    return e * jnp.mean(jnp.sum(f_ge * p_ge, axis=-1))


@dataclasses.dataclass(frozen=True, kw_only=True)
class SwitchLoss(Objective):
    """L = weight * E * sum_e f_e P_e (Fedus et al. 2021, "Switch Transformers", arXiv:2101.03961,
    eq. 4; top-k as in GShard, Lepikhin et al. 2020, arXiv:2006.16668).

    f_e: fraction of (token, choice) assignments routed to expert e; P_e: mean router probability
    of expert e; both over one micro-batch, or over each group of ``group_size`` sequences and then
    averaged. Under SPMD jit the micro-batch statistics span all data-parallel devices; classic
    per-device Switch (statistics over one device's sequences) is ``group_size`` = the per-device
    micro-batch. For statistics over the whole optimizer step use ``global_batch``.
    """

    name = "switch"
    weight: float = hparam(check=number(0), doc="loss weight alpha")
    group_size: int | None = hparam(
        None, check=positive_int_or_none(), doc="sequences per balance group; None: the micro-batch"
    )

    def check_setup(self) -> None:
        size = self.setup.micro_batch_size
        if self.group_size is not None and size % self.group_size:
            self.fail(
                f"hyperparameter 'group_size' has value {self.group_size}; allowed: a divisor of the "
                f"micro-batch size {size} (train.global_batch_size / train.grad_accum_steps)."
            )

    def loss(self, routing: Routing, state: State) -> jax.Array:
        return self.weight * grouped_switch_loss(routing, self.group_size)
