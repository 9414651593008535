"""A dense SwiGLU MLP made into an MoE layer's parameters (numpy, one layer at a time).

Dense MLP of width D: ``y = W_down^T (silu(W_gate^T x) * W_up^T x)``, a sum over its D
intermediate units. Expert width F divides D into S = D / F *slices* of F consecutive units, and
the slices' outputs add up to the dense output exactly. Expert j holds slice ``j mod S``, so the
E experts (E a multiple of S) are E / S replicas of each slice; F = D (S = 1): every expert is the
whole MLP (Komatsuzaki et al. 2022).

``copy`` (function-preserving start, softmax router with top-k renormalisation):

- S = 1: a router drawn from N(0, router_std). Every expert computes the dense MLP and the
  renormalised weights of the chosen experts sum to 1, so the layer computes the dense MLP
  whatever the router chooses, for any top-k.
- S > 1: a zero router. Every score ties, ``jax.lax.top_k`` breaks ties by the lower index, so
  every token chooses experts 0..k-1: k / S replicas of each slice when S divides k, each with
  weight 1/k. Each down projection is multiplied by S, so each slice counts (k/S)(1/k)S = 1 and
  the layer computes the dense MLP. When S does not divide k the start is not the dense MLP
  (:func:`function_preserving` says so); the router learns from the first step either way.
- ``shared``: one shared expert, the whole dense MLP, always on; the shared and the routed down
  projections are halved, so shared + routed = dense (halving is exact in floating point).

``drop`` (Drop-Upcycling, Nakamura et al. 2025, following the authors' conversion code
``conversions/drop_upcycling.py``): each expert starts as ``copy`` makes it, then a share R of
its F intermediate units, drawn at random for each expert (so experts re-initialise different
units), is re-initialised: those units' rows of W_gate and W_up and their columns of W_down are
drawn from a normal with the mean and standard deviation of the original weights they replace,
per matrix. The router is N(0, router_std). R = 0 is ``copy`` with that router; R = 1 keeps only
the statistics. The start is not the dense MLP (by design: the experts differ).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from moejax.errors import ConfigError

METHODS = ("copy", "drop")


@dataclasses.dataclass(frozen=True)
class Plan:
    """How a dense model becomes an MoE (``moejax upcycle``'s options)."""

    experts: int  # routed experts per layer (E)
    top_k: int  # experts each token chooses (k)
    expert_width: int | None = None  # F; None: the dense MLP's width (every expert the whole MLP)
    shared_expert: bool = False  # one always-on shared expert (the whole dense MLP)
    method: str = "copy"  # copy | drop
    drop_ratio: float = 0.5  # drop: share R of each expert's units re-initialised
    seed: int = 0  # the router's and drop's random draws


def check_plan(plan: Plan, dense_width: int) -> int:
    """The expert width F the plan gives a dense MLP of width ``dense_width``; a ConfigError naming
    the option, its value and what is allowed if it does not fit."""
    width = plan.expert_width or dense_width
    if plan.method not in METHODS:
        raise ConfigError(f"--method {plan.method!r} is not a method; allowed: {', '.join(METHODS)}.")
    if plan.experts < 2:
        raise ConfigError(f"--experts {plan.experts}: an MoE needs at least 2 routed experts.")
    if not 1 <= plan.top_k <= plan.experts:
        raise ConfigError(f"--top-k {plan.top_k}: allowed 1..--experts ({plan.experts}).")
    if not 0 < width <= dense_width or dense_width % width:
        divisors = [f for f in range(1, dense_width + 1) if dense_width % f == 0]
        raise ConfigError(f"--expert-width {width} does not split the dense MLP's width {dense_width} into equal "
                          f"slices; allowed: a divisor of {dense_width} ({', '.join(map(str, divisors[-8:]))}, ...).")
    slices = dense_width // width
    if plan.experts % slices:
        raise ConfigError(f"--experts {plan.experts} does not hold a whole number of copies of the {slices} slices "
                          f"of width {width} the dense MLP (width {dense_width}) splits into; allowed: a multiple of "
                          f"{slices}.")
    if not 0.0 <= plan.drop_ratio <= 1.0:
        raise ConfigError(f"--drop-ratio {plan.drop_ratio}: allowed 0..1 (the share of units re-initialised).")
    return width


def function_preserving(plan: Plan, dense_width: int) -> bool:
    """Whether the upcycled layer computes the dense MLP at the start (see the module docstring)."""
    slices = dense_width // check_plan(plan, dense_width)
    return plan.method == "copy" and plan.top_k % slices == 0


def _redraw(rng: np.random.Generator, w: np.ndarray, units: np.ndarray, axis: int) -> np.ndarray:
    """``w`` with the given units (indices along ``axis``) drawn from N(mean, std) of their weights."""
    part = np.take(w, units, axis=axis).astype(np.float64)
    out = w.copy()
    index: list[Any] = [slice(None)] * w.ndim
    index[axis] = units
    out[tuple(index)] = rng.normal(part.mean(), part.std(), part.shape).astype(w.dtype)
    return out


def upcycle_layer(
    w_gate_df: np.ndarray, w_up_df: np.ndarray, w_down_fd: np.ndarray, plan: Plan, rng: np.random.Generator,
    router_std: float,
) -> dict[str, np.ndarray]:
    """One MoE layer's parameters (keys relative to the layer's ``mlp``: ``router/w_de``,
    ``w_gate_edf``, ``w_up_edf``, ``w_down_efd`` and, with a shared expert, ``shared/w_*``)."""
    d, dense_width = w_gate_df.shape
    width = check_plan(plan, dense_width)
    slices = dense_width // width
    scale = slices * (0.5 if plan.shared_expert else 1.0)
    gates, ups, downs = [], [], []
    for j in range(plan.experts):
        units = slice((j % slices) * width, (j % slices + 1) * width)
        gate_df, up_df, down_fd = w_gate_df[:, units], w_up_df[:, units], w_down_fd[units]
        if plan.method == "drop":
            dropped = rng.choice(width, size=int(width * plan.drop_ratio), replace=False)
            gate_df = _redraw(rng, gate_df, dropped, 1)
            up_df = _redraw(rng, up_df, dropped, 1)
            down_fd = _redraw(rng, down_fd, dropped, 0)
        gates.append(gate_df)
        ups.append(up_df)
        downs.append(down_fd * np.asarray(scale, down_fd.dtype))
    if plan.method == "copy" and slices > 1:
        w_de = np.zeros((d, plan.experts), np.float32)
    else:
        w_de = rng.normal(0.0, router_std, (d, plan.experts)).astype(np.float32)
    out = {"router/w_de": w_de, "w_gate_edf": np.stack(gates), "w_up_edf": np.stack(ups),
           "w_down_efd": np.stack(downs)}
    if plan.shared_expert:
        out.update({"shared/w_gate_df": w_gate_df, "shared/w_up_df": w_up_df,
                    "shared/w_down_fd": w_down_fd * np.asarray(0.5, w_down_fd.dtype)})
    return out
