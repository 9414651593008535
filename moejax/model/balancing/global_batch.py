"""``global_batch``: the Switch loss with expert loads counted over the whole optimizer step."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from moejax.model.balancing.base import Objective, State, StepStats, hparam, mean_probs, number
from moejax.model.router import Routing, expert_load


@dataclasses.dataclass(frozen=True, kw_only=True)
class GlobalBatchLoss(Objective):
    """L = weight * E * sum_e f_e P_e with f_e over the *global* batch (Qiu et al. 2025, "Demons in
    the Detail: On Implementing Load Balancing Loss for Training Specialized Mixture-of-Expert
    Models", arXiv:2501.11873).

    Counting over the global batch lets a domain-specialised expert be busy in one sequence and
    idle in another, as long as the whole batch is balanced.

    Synchronisation. Over data-parallel devices it is free: under SPMD jit the micro-batch mean is
    already global. Over A gradient-accumulation micro-batches the loads of the micro-batches not
    yet run are unknown when micro-batch m computes its loss, so

        f_e = (load_e(micro-batch m) + (A - 1) * load_e(previous step)) / A,

    the current micro-batch's own loads plus the previous step's global loads standing in for the
    other A - 1 micro-batches (uniform 1/E before the first step). With A = 1 this is the exact
    global-batch count; with A > 1 it costs nothing (no extra router pass) and lags by one step on
    the (A - 1)/A share that is estimated. f carries no gradient; P_e is the micro-batch's mean
    routing probability, so the accumulated gradient is that of sum_e f_e P_e(global batch).

    State: ``load_e``, the last step's global assignment fractions.
    """

    name = "global_batch"
    weight: float = hparam(check=number(0), doc="loss weight alpha")

    def init_state(self) -> State:
        e = self.setup.num_experts
        return {"load_e": jnp.full((e,), 1.0 / e, jnp.float32)}

    def loss(self, routing: Routing, state: State) -> jax.Array:
        e, a = self.setup.num_experts, self.setup.micro_batches
        load_e = (expert_load(routing.idx_btk, e) + (a - 1) * state["load_e"]) / a
        return self.weight * e * jnp.sum(jax.lax.stop_gradient(load_e) * mean_probs(routing))

    def update(self, state: State, stats: StepStats) -> State:
        return {"load_e": stats.load_e.astype(jnp.float32)}
