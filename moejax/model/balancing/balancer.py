"""The composition of the configured objectives, applied to every MoE layer."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from moejax.model.balancing.base import Objective, State, StepStats
from moejax.model.router import Routing

# The whole balancing state: objective name -> that objective's state, leaves float32 [L, E]
# (L = MoE layers). Only objectives with state appear.
BalanceState = dict[str, State]


@dataclasses.dataclass(frozen=True)
class Balancer:
    """Sums the objectives' losses and selection biases; updates each objective's own state.

    The per-layer methods (``selection_bias``, ``losses``) take one layer's state (leaves [E]);
    the per-step methods (``init_state``, ``update``, ``metrics``) take every layer's (leaves
    [L, E]) and map the objectives over layers. All are pure and jit-friendly; the Balancer itself
    is static (hashable, built once from the config).
    """

    objectives: tuple[Objective, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(o.name for o in self.objectives)

    def init_state(self, num_layers: int) -> BalanceState:
        out = {}
        for o in self.objectives:
            state = o.init_state()
            if state:
                out[o.name] = jax.tree.map(lambda x: jnp.tile(x[None], (num_layers,) + (1,) * x.ndim), state)
        return out

    def selection_bias(self, layer_state: BalanceState) -> jax.Array | None:
        """Sum of the objectives' selection biases for one layer (float32 [E]), or None."""
        biases = [o.selection_bias(layer_state.get(o.name, {})) for o in self.objectives]
        biases = [b for b in biases if b is not None]
        return sum(biases[1:], biases[0]) if biases else None

    def losses(self, routing: Routing, layer_state: BalanceState) -> dict[str, jax.Array]:
        """Weighted loss of each loss-bearing objective for one layer and micro-batch."""
        return {
            o.name: o.loss(routing, layer_state.get(o.name, {})).astype(jnp.float32)
            for o in self.objectives if type(o).loss is not Objective.loss
        }

    def update(self, state: BalanceState, stats_l: StepStats) -> BalanceState:
        """Every stateful objective's update, per layer; ``stats_l`` leaves are [L, E]."""
        by_name = {o.name: o for o in self.objectives}
        return {name: jax.vmap(by_name[name].update)(s, stats_l) for name, s in state.items()}

    def metrics(self, state: BalanceState) -> dict[str, jax.Array]:
        """``'<objective>/<metric>'`` -> float32 [L]."""
        by_name = {o.name: o for o in self.objectives}
        out = {}
        for name, s in state.items():
            for key, value_l in jax.vmap(by_name[name].metrics)(s).items():
                out[f"{name}/{key}"] = value_l
        return out
