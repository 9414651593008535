"""Masking experts out of the routing, for pruning studies, without touching the model code.

A masked expert gets a very negative *selection bias*: the router adds it to the scores for the
top-k choice only (:class:`moejax.model.router.Router`), so the router picks its k experts among
the remaining ones, and their combine weights stay the unbiased scores (renormalised over the k
chosen when ``model.moe.renormalize``; otherwise the masked experts' probability mass is simply
lost, as it would be in a pruned model). The bias travels as one more balancing objective,
:class:`ExpertMask`, whose state is the bias, so it reaches every MoE layer through the path the
loss-free bias already takes, in the full forward and in cached decoding alike, and composes with
the run's own objectives.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from moejax.model.balancing import Balancer, Objective, RoutingSetup

MASKED_BIAS = -1e9  # far below any score (softmax or sigmoid scores lie in [0, 1])


@dataclasses.dataclass(frozen=True, kw_only=True)
class ExpertMask(Objective):
    """A fixed selection bias per expert (state ``bias_e``): no loss, never updated."""

    name = "expert_mask"

    def selection_bias(self, state) -> jax.Array:
        return state["bias_e"]


def masked_balancer(balancer: Balancer | None, setup: RoutingSetup) -> Balancer:
    """The run's balancer plus :class:`ExpertMask`."""
    return Balancer((*(balancer.objectives if balancer else ()), ExpertMask(setup=setup)))


def mask_state(balance: dict, masked_le: np.ndarray, top_k: int) -> dict:
    """The balancing state plus the mask ``masked_le`` (bool [MoE layers, E], True = masked).

    Every layer must keep at least ``top_k`` experts, or the top-k would have to pick masked ones.
    """
    masked_le = np.asarray(masked_le, bool)
    kept_l = (~masked_le).sum(axis=1)
    if (kept_l < top_k).any():
        layer = int(np.argmin(kept_l))
        raise ValueError(
            f"MoE layer {layer} would keep {kept_l[layer]} experts, fewer than the {top_k} each token "
            "chooses; mask fewer experts."
        )
    bias_le = jnp.asarray(np.where(masked_le, MASKED_BIAS, 0.0), jnp.float32)
    return {**balance, ExpertMask.name: {"bias_e": bias_le}}


def least_used(load_le: np.ndarray, count: int) -> np.ndarray:
    """bool [L, E]: the ``count`` experts of each layer with the lowest load (ties: lower id)."""
    order_le = np.argsort(load_le, axis=1, kind="stable")
    masked_le = np.zeros(load_le.shape, bool)
    np.put_along_axis(masked_le, order_le[:, :count], True, axis=1)
    return masked_le
