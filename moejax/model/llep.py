"""Least-Loaded Expert Parallelism (LLEP): the plan that spreads overloaded experts' work.

With ``model.moe.ep_balance = "llep"`` the expert-parallel dispatch
(:mod:`moejax.model.expert_parallel`) does not drop what an overloaded device cannot hold: the
excess assignments of its overloaded experts, and those experts' weights, go to the least-loaded
devices of the expert axis (after Nguyen et al. 2026, "Least-Loaded Expert Parallelism",
arXiv 2601.17111). This module is the planning half: a pure function of the expert ids of every
assignment in the expert group (the P devices of one expert axis), so every device computes the
same plan from the same all-gathered ids, with static shapes throughout.

Buffers (static, set by the config and the batch, never by the routing). q = s * k is one device's
assignments (s local tokens, k choices), u = P * q the group's, q the balanced load per device.

- Native rows ``n = min(u, ceil(ep_capacity_factor * q))`` per device, for its own experts.
- ``S = ep_spill_slots`` spill slots per device; each hosts at most one expert's weights (a copy of
  a foreign expert, or of its own) and ``c = min(u, ceil(ep_spill_capacity_factor * q))`` rows.

A device's buffer has ``n + S * c`` rows: rows ``[0, n)`` are native, rows ``[n + j * c,
n + (j + 1) * c)`` belong to spill slot j.

The plan (:func:`plan`), in the group's priority order (choice-major: every token's first choice,
in (device, token) order, before any second choice, so a first choice is the last to be dropped):

1. Native. A device computes the first n assignments to its own experts; the rest of each expert's
   assignments are its excess.
2. Spill, one slot at a time, at most P * S times (:func:`_allocate_slots`): take the expert with
   the largest remaining excess (ties: lowest id); give the next ``min(excess, c)`` of its excess
   assignments (in priority order) to a free spill slot of the least-loaded device (load = rows
   planned so far; ties: lowest id; a device hosts at most S experts). Stop when no excess is
   left; unused slots stay empty.
3. What is still excess after P * S slots is dropped (contributes zero; counted in drop_rate).

Why this rule. Every slot has the same size, so the slot given to the largest remaining excess
places ``min(excess, c)`` assignments, the most any slot can place next, and each expert's gains
from successive slots do not grow (c, c, ..., remainder): this greedy places the most excess
assignments that P * S slots of c rows can hold (fewest drops, for the native rows as fixed in
step 1). Least-loaded placement then decides only where the work runs, which is what balances the
devices' compute. A slot on the expert's own device is allowed (it is just more rows there; no
weight moves); the least-loaded rule picks it only when that device is the least loaded.

Balance: a slot goes to the device with the least planned load, at most the mean (<= q) at that
moment, so no device ends above ``max(n, q + c)`` rows.

Nothing is dropped for any routing when ``S >= E / P + 1 / ep_spill_capacity_factor``: an expert
with excess needs ``ceil(excess / c)`` slots, at most ``excess / c + 1``, and the group's excess is
at most u = P * q <= P * c / ep_spill_capacity_factor, so P * S slots suffice. (Also when
``ep_capacity_factor >= P``: everything is native.) Concentrated routing needs far fewer: every
token on one expert needs ``ceil((u - n) / c)`` slots in all.

Cost of planning: argsorts over the u ids, a ``fori_loop`` of P * S small steps, and a [u, P * S]
comparison that finds each excess assignment's slot (u * P * S booleans).

Dimension letters: w assignments of the group in priority order (u of them), p devices of the
expert axis, e experts per device, x experts of the group (E = p * e), n spill slots of the group
(p * S, slot j of device i is n = i * S + j).
"""

from __future__ import annotations

import fractions
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from moejax.schema import BALANCES  # noqa: F401 (declared with the dispatch config)


class Plan(NamedTuple):
    """Where every assignment of the expert group is computed (see the module docstring)."""

    device_w: jax.Array  # int [u]: the device that computes assignment w; p if dropped
    row_w: jax.Array  # int [u]: its row in that device's buffer; n + S * c if dropped
    slot_expert_ps: jax.Array  # int [p, S]: the expert each spill slot hosts; E if unused
    load_p: jax.Array  # int [p]: rows each device computes (native + spill)


def buffer_rows(assignments_per_device: int, peers: int, factor: float) -> int:
    """``min(P * q, ceil(factor * q))``, at least 1: rows of a native buffer or a spill slot.

    q is one device's assignments, the balanced load per device; P * q is every assignment of the
    expert group, more than any buffer can need. The product is taken on the factor's decimal
    value (1.1 * 10 is 11, not 12 from float rounding).
    """
    exact = fractions.Fraction(str(factor)) * assignments_per_device
    return min(peers * assignments_per_device, max(1, math.ceil(exact)))


def rank_within(group_w: jax.Array, num_groups: int) -> jax.Array:
    """Each entry's rank among the earlier entries of its group (0 for the first of a group): one
    stable sort, O(u log u) whatever ``num_groups`` is (the capacity backend's slots use it too)."""
    u = group_w.shape[0]
    order_w = jnp.argsort(group_w, stable=True)
    count_g = jnp.bincount(group_w, length=num_groups)
    start_g = jnp.cumsum(count_g) - count_g
    rank_sorted_w = jnp.arange(u, dtype=jnp.int32) - start_g[group_w[order_w]].astype(jnp.int32)
    return jnp.zeros_like(group_w).at[order_w].set(rank_sorted_w.astype(group_w.dtype))


def _allocate_slots(excess_x, load_p, spill_slots, spill_rows):
    """Step 2 of the plan: the expert, first excess rank and length of every spill slot.

    Returns ``slot_expert_ps`` (E where unused), ``slot_start_ps``, ``slot_len_ps`` and the
    devices' loads after spilling.
    """
    num_experts, p = excess_x.shape[0], load_p.shape[0]
    # lax.full_like keeps the inputs' shard_map type (the loop carry must keep its type).
    int_max = jnp.iinfo(load_p.dtype).max

    def body(_, carry):
        rem_x, offset_x, load_p, used_p, expert_ps, start_ps, len_ps = carry
        x = jnp.argmax(rem_x)  # largest remaining excess; the first (lowest id) of ties
        chunk = jnp.minimum(rem_x[x], spill_rows)
        dev = jnp.argmin(jnp.where(used_p < spill_slots, load_p, int_max))  # least loaded, free slot
        slot = used_p[dev]
        take = chunk > 0
        expert_ps = expert_ps.at[dev, slot].set(jnp.where(take, x, num_experts).astype(expert_ps.dtype))
        start_ps = start_ps.at[dev, slot].set(jnp.where(take, offset_x[x], 0))
        len_ps = len_ps.at[dev, slot].set(chunk)
        return (
            rem_x.at[x].add(-chunk), offset_x.at[x].add(chunk), load_p.at[dev].add(chunk),
            used_p.at[dev].add(take.astype(used_p.dtype)), expert_ps, start_ps, len_ps,
        )

    slots = (p, spill_slots)
    init = (
        excess_x, lax.full_like(excess_x, 0), load_p, lax.full_like(load_p, 0),
        lax.full_like(load_p, num_experts, shape=slots), lax.full_like(excess_x, 0, shape=slots),
        lax.full_like(excess_x, 0, shape=slots),
    )
    _, _, load_p, _, expert_ps, start_ps, len_ps = lax.fori_loop(0, p * spill_slots, body, init)
    return expert_ps, start_ps, len_ps, load_p


def plan(
    expert_w: jax.Array, *, peers: int, local_experts: int, native_rows: int, spill_slots: int,
    spill_rows: int,
) -> Plan:
    """The LLEP plan for the expert group's assignments ``expert_w`` (int [u], priority order).

    Pure and deterministic (only argsort/argmax/argmin with fixed tie rules), static shapes: the
    same ids give the same plan on every device. See the module docstring for the rule.
    """
    expert_w = expert_w.astype(jnp.int32)
    p, e, n, c = peers, local_experts, native_rows, spill_rows
    num_experts = p * e
    r = n + spill_slots * c  # buffer rows per device; r means "no row"

    home_w = expert_w // e
    native_rank_w = rank_within(home_w, p)
    native_w = native_rank_w < n
    # Excess assignments, ranked per expert in priority order; native ones go to group E.
    excess_group_w = jnp.where(native_w, num_experts, expert_w)
    excess_rank_w = rank_within(excess_group_w, num_experts + 1)
    excess_x = jnp.bincount(excess_group_w, length=num_experts + 1)[:num_experts].astype(jnp.int32)
    native_load_p = jnp.minimum(jnp.bincount(home_w, length=p), n).astype(jnp.int32)

    expert_ps, start_ps, len_ps, load_p = _allocate_slots(excess_x, native_load_p, spill_slots, c)
    expert_n, start_n, len_n = expert_ps.reshape(-1), start_ps.reshape(-1), len_ps.reshape(-1)
    rank_w1 = excess_rank_w[:, None]
    in_slot_wn = (
        (expert_w[:, None] == expert_n[None, :]) & (start_n <= rank_w1) & (rank_w1 < start_n + len_n)
        & ~native_w[:, None]
    )
    spilled_w = jnp.any(in_slot_wn, axis=1)
    slot_w = jnp.argmax(in_slot_wn, axis=1).astype(jnp.int32)  # the one matching slot (if any)
    spill_row_w = n + (slot_w % spill_slots) * c + excess_rank_w - start_n[slot_w]
    device_w = jnp.where(native_w, home_w, jnp.where(spilled_w, slot_w // spill_slots, p))
    row_w = jnp.where(native_w, native_rank_w, jnp.where(spilled_w, spill_row_w, r))
    return Plan(device_w.astype(jnp.int32), row_w.astype(jnp.int32), expert_ps, load_p)


def standard_ep_load(expert_w: jax.Array, *, peers: int, local_experts: int) -> jax.Array:
    """Assignments each device's experts are asked for (int [p]): standard EP's compute per device
    before any drop, the load LLEP spreads."""
    return jnp.bincount(expert_w.astype(jnp.int32) // local_experts, length=peers)
