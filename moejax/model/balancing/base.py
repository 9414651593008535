"""The balancing-objective interface, its static context and hyperparameter validation.

An objective is a frozen dataclass: its fields are its hyperparameters (declared with
:func:`hparam`, which carries the allowed range), plus the :class:`RoutingSetup` of the run. The
hyperparameters are checked when the objective is built, so a bad value is an error before
anything is compiled. All methods are pure functions of arrays, written for *one* MoE layer
(state leaves are float32 [E]); :class:`moejax.model.balancing.Balancer` maps them over layers.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any, Callable, ClassVar, NamedTuple

import jax
import jax.numpy as jnp

from moejax.model.router import Routing

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


@dataclasses.dataclass(frozen=True)
class Check:
    """A predicate on a hyperparameter value and the words that say what it allows."""

    ok: Callable[[Any], bool]
    allowed: str


def is_real(x: Any) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)


def number(lo: float, hi: float = math.inf, *, lo_open: bool = True, hi_open: bool = False) -> Check:
    """A finite real in the interval from ``lo`` to ``hi`` (open or closed at each end)."""
    above = (lambda x: x > lo) if lo_open else (lambda x: x >= lo)
    below = (lambda x: x < hi) if hi_open or hi == math.inf else (lambda x: x <= hi)
    if hi == math.inf:
        allowed = f"a number {'>' if lo_open else '>='} {lo:g}"
    else:
        allowed = f"a number in {'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"
    return Check(lambda x: is_real(x) and above(x) and below(x), allowed)


def one_of(*choices: str) -> Check:
    return Check(lambda x: x in choices, " | ".join(repr(c) for c in choices))


def positive_int_or_none() -> Check:
    ok = lambda x: x is None or (isinstance(x, int) and not isinstance(x, bool) and x > 0)
    return Check(ok, "a positive integer, or None")


def hparam(default: Any = dataclasses.MISSING, *, check: Check, doc: str) -> Any:
    """Declares a hyperparameter field; without ``default`` it is required."""
    return dataclasses.field(default=default, metadata={"check": check, "doc": doc})


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
        return tuple(f for f in dataclasses.fields(cls) if "check" in f.metadata)

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
