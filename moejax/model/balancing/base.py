"""The balancing-objective interface, its static context and hyperparameter validation.

An objective is a frozen dataclass: its fields are its hyperparameters (declared with
:func:`hparam`, which carries the allowed range), plus the :class:`RoutingSetup` of the run. The
hyperparameters are checked when the objective is built, so a bad value is an error before
anything is compiled. All methods are pure functions of arrays, written for *one* MoE layer
(state leaves are float32 [E]); :class:`moejax.model.balancing.Balancer` maps them over layers.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, NamedTuple

import jax
import jax.numpy as jnp

from moejax.model.router import Routing
# The field helper is shared with the model's typed configs; re-exported for the objectives.
from moejax.schema import Check, checked_fields, hparam, is_real, number, one_of, positive_int_or_none  # noqa: F401

State = dict[str, jax.Array]  # one objective's state for one layer: name -> float32 [E]


class BalancingError(ValueError):
    """A bad balancing spec: unknown objective, bad hyperparameter, or an unsupported combination."""


class RoutingSetup(NamedTuple):
    """What an objective may need to know about the run; all static."""

    num_experts: int
    top_k: int
    score_func: str = "softmax"  # softmax | sigmoid
    backend: str = "dropless"  # dropless | capacity | expert_parallel
    micro_batches: int = 1  # gradient-accumulation micro-batches per optimizer step
    micro_batch_size: int = 1  # sequences per micro-batch (over all devices)

    @classmethod
    def from_config(cls, cfg) -> "RoutingSetup":
        moe, t = cfg.model.moe, cfg.train
        return cls(
            num_experts=moe.num_experts, top_k=moe.experts_per_token, score_func=moe.score_func,
            backend=moe.backend, micro_batches=t.grad_accum_steps,
            micro_batch_size=max(t.global_batch_size // t.grad_accum_steps, 1),
        )


class StepStats(NamedTuple):
    """Routing statistics of one optimizer step, over the global batch and all its micro-batches."""

    pbar_e: jax.Array  # float32 [E] mean routing probability
    load_e: jax.Array  # float32 [E] fraction of (token, choice) assignments (sums to 1)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Objective:
    """Base class: defaults are those of an objective with no state, no bias, no loss.

    Subclasses set ``name`` (its registry key) and declare hyperparameters with :func:`hparam`;
    they override only what they use:

    - ``init_state()``: float32 state for one layer, ``{}`` if stateless;
    - ``selection_bias(state)``: float32 [E] added to the router scores for top-k selection only
      (never to the combine weights), or None;
    - ``loss(routing, state)``: the weighted auxiliary loss of one micro-batch, float32 scalar;
      ``routing`` holds the full per-token logits, probabilities and choices [B, T, ...];
    - ``update(state, stats)``: the new state, once per optimizer step, after the parameter
      update, from :class:`StepStats` over the global batch;
    - ``metrics(state)``: float32 scalars to log (e.g. a bias norm);
    - ``check_setup()``: raise :class:`BalancingError` if the run cannot support the objective.
    """

    name: ClassVar[str]
    setup: RoutingSetup

    def __post_init__(self):
        for field in self.hparams():
            value = getattr(self, field.name)
            check: Check = field.metadata["check"]
            if not check.ok(value):
                raise BalancingError(
                    f"balancing objective {self.name!r}: hyperparameter {field.name!r} has value "
                    f"{value!r}; allowed: {check.allowed}."
                )
        self.check_setup()

    @classmethod
    def hparams(cls) -> tuple[dataclasses.Field, ...]:
        return checked_fields(cls)

    def check_setup(self) -> None:
        pass

    def init_state(self) -> State:
        return {}

    def selection_bias(self, state: State) -> jax.Array | None:
        return None

    def loss(self, routing: Routing, state: State) -> jax.Array:
        return jnp.zeros((), jnp.float32)

    def update(self, state: State, stats: StepStats) -> State:
        return state

    def metrics(self, state: State) -> dict[str, jax.Array]:
        return {}

    def fail(self, message: str) -> None:
        raise BalancingError(f"balancing objective {self.name!r}: {message}")


def mean_probs(routing: Routing) -> jax.Array:
    """P_e: the mean routing probability over all tokens of the micro-batch, float32 [E]."""
    return jnp.mean(routing.probs_bte, axis=(0, 1))
