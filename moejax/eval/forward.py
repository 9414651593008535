"""The jitted evaluation forward: per-row log-likelihoods and, optionally, every MoE layer's routing.

Expert co-occurrence needs each token's top-k choices, which the model returns, stacked over MoE
layers, when called with ``with_routing=True``; the forward is the model's own ``__call__``, so
what is measured is exactly what training computes.

Rows are packed examples (``moejax.data.packing`` fields): ``loss_mask`` selects the scored targets
and ``segment_ids > 0`` the real tokens whose routing is counted, so padding never counts.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from moejax.model.balancing import Balancer
from moejax.model.router import Routing
from moejax.train.state import Run, to_global


def routing_sums(routing: Routing | None, weight_bt: jax.Array, num_experts: int) -> dict[str, jax.Array]:
    """Per MoE layer, summed over the weighted tokens: assignments per expert ``counts_le``,
    tokens choosing both experts ``cooc_lee`` (diagonal: tokens choosing the expert), routing
    entropy ``entropy_l`` (nats), and the token count ``tokens``."""
    if routing is None:  # a dense model
        return {"counts_le": jnp.zeros((0, num_experts)), "cooc_lee": jnp.zeros((0, num_experts, num_experts)),
                "entropy_l": jnp.zeros((0,)), "tokens": jnp.sum(weight_bt)}
    chosen_lbte = jnp.sum(jax.nn.one_hot(routing.idx_btk, num_experts, dtype=jnp.float32), axis=3)
    probs_lbte = routing.probs_bte
    weighted_lbte = chosen_lbte * weight_bt[None, :, :, None]
    return {
        "counts_le": jnp.sum(weighted_lbte, axis=(1, 2)),
        "cooc_lee": jnp.einsum("lbte,lbtf->lef", weighted_lbte, chosen_lbte),
        "entropy_l": jnp.einsum("lbte,bt->l", jax.scipy.special.entr(probs_lbte), weight_bt),
        "tokens": jnp.sum(weight_bt),
    }


class Scorer:
    """``scorer(params, balance, batch)``: per-row sums of target log-probabilities and scored
    tokens, and whether every scored target is the model's most probable token; with ``routing=True`` also the :func:`routing_sums` of the real tokens. One compile
    per batch shape, reused across checkpoints (parameters are arguments)."""

    def __init__(self, run: Run, balancer: Balancer | None, num_experts: int):
        self.run = run
        replicated = NamedSharding(run.mesh, P())
        self._batch_sharding = run.batch_sharding(accum=False)
        self._jitted = {
            with_routing: jax.jit(
                functools.partial(
                    _score, graphdef=run.graphdef, balancer=balancer, num_experts=num_experts,
                    with_routing=with_routing,
                ),
                in_shardings=(run.state_shardings["params"], replicated, self._batch_sharding),
                out_shardings=replicated,
            )
            for with_routing in (False, True)
        }

    def __call__(self, params, balance: dict, batch: dict[str, np.ndarray], routing: bool = False) -> dict:
        with jax.set_mesh(self.run.mesh):
            out = self._jitted[routing](params, balance, to_global(batch, self._batch_sharding, None))
        return jax.device_get(out)


def _score(params, balance, batch, *, graphdef, balancer, num_experts, with_routing) -> dict[str, Any]:
    model = nnx.merge(graphdef, params)
    logits_btv, aux = model(
        batch["inputs"], batch["positions"], batch["segment_ids"],
        balancer=balancer if balance else None, balance_state=balance, with_routing=with_routing,
    )
    logprob_bt = -optax.softmax_cross_entropy_with_integer_labels(logits_btv, batch["targets"])
    mask_bt = batch["loss_mask"]
    greedy_bt = (jnp.argmax(logits_btv, axis=-1) == batch["targets"]) | (mask_bt == 0)
    out = {"logprob_b": jnp.sum(logprob_bt * mask_bt, axis=-1), "tokens_b": jnp.sum(mask_bt, axis=-1),
           "greedy_b": jnp.all(greedy_bt, axis=-1)}
    if with_routing:
        weight_bt = (batch["segment_ids"] > 0).astype(jnp.float32)
        out["routing"] = routing_sums(aux.get("routing"), weight_bt, num_experts)
    return out
