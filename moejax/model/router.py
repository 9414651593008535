"""Token-choice top-k router, in float32 whatever the compute dtype, and routing statistics.

The balancing objectives that act on the routing live in :mod:`moejax.model.balancing`; the router
only accepts their optional *selection bias*, which moves the top-k choice and nothing else.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from moejax.model.layers import linear, param
from moejax.schema import MoEConfig


class Routing(NamedTuple):
    idx_btk: jax.Array  # int32 selected experts
    weight_btk: jax.Array  # float32 combine weights (renormalised and scaled as configured)
    probs_bte: jax.Array  # float32 routing distribution per token (sums to 1 over experts)
    logits_bte: jax.Array  # float32 raw router logits


class Router(nnx.Module):
    """Scores = softmax or sigmoid of x W_r (float32); top-k; optional renormalisation; scaling.

    For sigmoid scores (DeepSeek-V3), ``probs_bte`` is the scores normalised to sum to 1, which is
    what the balancing objectives use.

    Selection biases are added to the scores for the top-k *selection only*: the combine weights
    are the unbiased scores of the selected experts, and no gradient flows into a bias. Two add up:
    ``bias_e`` passed in by the caller (the balancing objectives' state, e.g. loss-free) and, with
    ``router_bias``, the router's own parameter ``select_bias_e`` (float32 [E]; an imported
    DeepSeek-V3 ``e_score_correction_bias``). ``select_bias_e`` gets no gradient and is never
    decayed, so AdamW leaves it exactly as loaded; further loss-free balancing adds on top of it.

    With ``num_groups > 1`` (DeepSeek-V3 group-limited routing) the experts form equal contiguous
    groups, each group is scored by the sum of its two highest biased scores, and only the experts
    of the ``topk_groups`` best groups may be selected.
    """

    def __init__(self, d: int, moe_cfg: MoEConfig, *, std: float, rngs: nnx.Rngs):
        e = moe_cfg.num_experts
        self.w_de = param(rngs, (d, e), ("embed", "router_experts"), std, jnp.float32)
        self.select_bias_e = (
            nnx.Param(jnp.zeros((e,), jnp.float32), axes=("router_experts",)) if moe_cfg.router_bias else None
        )
        self.k = moe_cfg.experts_per_token
        self.score_func = moe_cfg.score_func
        self.renormalize = moe_cfg.renormalize
        self.scaling = moe_cfg.routed_scaling
        self.num_groups = moe_cfg.num_groups
        self.topk_groups = moe_cfg.topk_groups

    def __call__(self, x_btd: jax.Array, bias_e: jax.Array | None = None) -> Routing:
        logits_bte = linear(x_btd.astype(jnp.float32), self.w_de[...].astype(jnp.float32))
        if self.score_func == "softmax":
            scores_bte = jax.nn.softmax(logits_bte, axis=-1)
            probs_bte = scores_bte
        else:
            scores_bte = jax.nn.sigmoid(logits_bte)
            probs_bte = scores_bte / jnp.sum(scores_bte, axis=-1, keepdims=True)
        choice_bte = scores_bte
        if bias_e is not None:
            choice_bte = choice_bte + jax.lax.stop_gradient(bias_e.astype(jnp.float32))
        if self.select_bias_e is not None:
            choice_bte = choice_bte + jax.lax.stop_gradient(self.select_bias_e[...])
        if self.num_groups > 1:
            choice_bte = limit_to_top_groups(choice_bte, self.num_groups, self.topk_groups)
        _, idx_btk = jax.lax.top_k(choice_bte, self.k)
        weight_btk = jnp.take_along_axis(scores_bte, idx_btk, axis=-1)
        if self.renormalize:
            weight_btk = weight_btk / jnp.sum(weight_btk, axis=-1, keepdims=True)
        return Routing(idx_btk.astype(jnp.int32), weight_btk * self.scaling, probs_bte, logits_bte)


def limit_to_top_groups(choice_bte: jax.Array, num_groups: int, topk_groups: int) -> jax.Array:
    """Masks (to -inf) every expert outside the ``topk_groups`` groups with the best top-2 sums.

    Group-limited routing (DeepSeek-V3): bounds how many expert groups (devices, nodes) one token
    reaches. ``u`` indexes the expert groups (``g`` is taken: token groups), ``x`` the experts within
    a group, ``j`` the kept groups.
    """
    b, t, e = choice_bte.shape
    choice_btux = choice_bte.reshape(b, t, num_groups, e // num_groups)
    group_score_btu = jnp.sum(jax.lax.top_k(choice_btux, 2)[0], axis=-1)
    _, top_groups_btj = jax.lax.top_k(group_score_btu, topk_groups)
    keep_btu = jnp.any(jax.nn.one_hot(top_groups_btj, num_groups, dtype=bool), axis=-2)
    return jnp.where(keep_btu[..., None], choice_btux, -jnp.inf).reshape(b, t, e)


def expert_load(idx_btk: jax.Array, num_experts: int) -> jax.Array:
    """Fraction of (token, choice) assignments that go to each expert, float32 [E] (sums to 1)."""
    counts_e = jnp.zeros((num_experts,), jnp.float32).at[idx_btk.reshape(-1)].add(1.0)
    return counts_e / idx_btk.size


def sequence_counts(idx_btk: jax.Array, num_experts: int) -> jax.Array:
    """Assignments per sequence and expert, float32 [B, E] (each row sums to T * k)."""
    return jnp.sum(jax.nn.one_hot(idx_btk, num_experts, dtype=jnp.float32), axis=(1, 2))


def routing_entropy(probs_bte: jax.Array) -> jax.Array:
    """Mean over tokens of the entropy (nats) of the routing distribution, float32 scalar.

    log(E) for uniform routing, 0 for one-hot routing: how confident the router is.
    """
    return jnp.mean(jnp.sum(jax.scipy.special.entr(probs_bte), axis=-1))


def z_loss(logits: jax.Array) -> jax.Array:
    """mean(logsumexp(logits)^2) (ST-MoE router z-loss; also used on the output logits)."""
    return jnp.mean(jnp.square(jax.nn.logsumexp(logits.astype(jnp.float32), axis=-1)))
