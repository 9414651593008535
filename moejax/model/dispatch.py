"""MoE dispatch backends: send each token to its selected experts and combine their outputs.

The router has already chosen, for every token, k experts (``idx_gtk``) and their combine weights
(``w_gtk``, float32, normalised/scaled by the router). :func:`dispatch` computes

    y[g, t] = sum_k w_gtk[g, t, k] * FFN_{idx_gtk[g, t, k]}(x_gtd[g, t])

with the SwiGLU expert ``FFN_e(x) = (silu(x @ w_gate[e]) * (x @ w_up[e])) @ w_down[e]``, through one
of three backends:

- ``"capacity"`` (GShard/Switch): every expert has a fixed buffer of C slots per group; the
  assignments that do not fit are dropped (they contribute nothing). Tokens are gathered into a
  static [g, e, c, d] slot buffer and the outputs gathered back; static shapes, cheap to shard over
  experts; wastes compute on empty slots and loses tokens when routing is unbalanced.
- ``"dropless"``: sort all assignments by expert and run a grouped matmul
  (:mod:`moejax.model.grouped_matmul`) over the variable-size groups. Never drops; compute is
  proportional to the real assignments (plus tile padding on CPU).
- ``"expert_parallel"``: the experts are split over the mesh's expert axis and each token travels
  (``shard_map`` with all_to_all or all_gather collectives) to the devices that hold its experts,
  into a bounded receive buffer, and back (:mod:`moejax.model.expert_parallel`). Without a mesh,
  with an expert axis of size 1, or with groups that do not split evenly over the batch axes, it
  computes as ``"dropless"``.

Dimension letters: g groups (one per sequence), t tokens per group, d model dim, f expert ffn dim,
e experts, k experts per token, c capacity slots, q assignments of a group in priority order
(k * t, choice-major), s flattened tokens (g * t), a flattened assignments in (g, t, k) order,
m the same assignments sorted by expert.
"""

from __future__ import annotations

import fractions
import math

import jax
import jax.numpy as jnp

from moejax.model.expert_parallel import expert_parallel_dispatch, splits_experts
from moejax.model.grouped_matmul import batched_ffn, grouped_ffn
from moejax.model.llep import rank_within
from moejax.schema import BACKENDS, DispatchConfig  # noqa: F401 (BACKENDS: the backends' names, exported)


def expert_capacity(
    tokens_per_group: int, num_experts: int, top_k: int, capacity_factor: float
) -> int:
    """Slots per expert and group: ``C = ceil(capacity_factor * T * k / E)``, at least 1.

    ``capacity_factor = 1`` gives exactly enough slots for perfectly balanced routing;
    ``capacity_factor >= E / k`` gives C >= T, so nothing can be dropped. The product is taken on
    the factor's decimal value, so 1.1 * 10 tokens gives 11 slots, not 12 from float rounding.
    """
    exact = fractions.Fraction(str(capacity_factor)) * tokens_per_group * top_k / num_experts
    return max(1, math.ceil(exact))


def _swiglu_gecd(x_gecd, w_gate_edf, w_up_edf, w_down_efd):
    """Each expert's SwiGLU over its slots of every group, as one [e, g * c] row block per expert.

    Expert-major ([e, g * c, d], one batched matmul per weight) rather than an einsum batched over
    g and e, which XLA:CPU runs slower (the peer-architecture capacity step is faster with this
    layout, identical loss; experiments/benchmarks/LOG.md, section 2, change 4).
    """
    g, e, c, d = x_gecd.shape
    x_ecd = x_gecd.transpose(1, 0, 2, 3).reshape(e, g * c, d)
    y_ecd = batched_ffn(x_ecd, w_gate_edf, w_up_edf, w_down_efd)
    return y_ecd.reshape(e, g, c, d).transpose(1, 0, 2, 3)


# Experts from which the capacity slots come from a stable sort per group rather than a one-hot
# [g, q, e] cumsum, whose cost grows with e: the same slots; at 16 x 256 tokens the cumsum took
# 0.7 ms against 3.3 for the sort at 16 experts top-2, 77 against 12 ms at 128 top-8 (per layer,
# experiments/benchmarks/capacity_slots.py; LOG.md section 7). The crossover between was not measured.
SORTED_SLOTS_FROM_EXPERTS = 64


def _capacity_slots(idx_gtk: jax.Array, e: int) -> jax.Array:
    """int [g, t, k]: each assignment's rank among the earlier assignments (choice-major) to its
    expert in its group."""
    g, t, k = idx_gtk.shape
    if e >= SORTED_SLOTS_FROM_EXPERTS:
        expert_gq = jnp.swapaxes(idx_gtk, 1, 2).reshape(g, k * t).astype(jnp.int32)
        slot_gkt = jax.vmap(lambda expert_q: rank_within(expert_q, e))(expert_gq).reshape(g, k, t)
    else:
        expert_gqe = jnp.swapaxes(jax.nn.one_hot(idx_gtk, e, dtype=jnp.int32), 1, 2).reshape(g, k * t, e)
        earlier_gqe = jnp.cumsum(expert_gqe, axis=1) - expert_gqe
        slot_gkt = jnp.sum(earlier_gqe * expert_gqe, axis=-1).reshape(g, k, t)
    return jnp.swapaxes(slot_gkt, 1, 2)


def capacity_dispatch(x_gtd, idx_gtk, w_gtk, w_gate_edf, w_up_edf, w_down_efd, capacity_factor):
    g, t, k = idx_gtk.shape
    e = w_gate_edf.shape[0]
    c = expert_capacity(t, e, k, capacity_factor)

    # Priority is choice-major: every token's first choice, in token order, claims a slot before
    # any second choice. An assignment's slot is the number of earlier assignments to its expert.
    slot_gtk = _capacity_slots(idx_gtk, e)
    kept_gtk = slot_gtk < c

    # The token in each slot (t, out of range, for an empty slot: reads zero); a dropped
    # assignment (slot >= c) writes nothing. Gathers, not one-hot [g, t, e, c] einsums: a faster
    # peer-architecture capacity step, the same loss (experiments/benchmarks/LOG.md, section 2, change 4).
    g_gtk = jnp.broadcast_to(jnp.arange(g)[:, None, None], idx_gtk.shape)
    t_gtk = jnp.broadcast_to(jnp.arange(t)[None, :, None], idx_gtk.shape)
    src_gec = jnp.full((g, e, c), t, jnp.int32).at[g_gtk, idx_gtk, slot_gtk].set(t_gtk, mode="drop")
    x_gecd = jax.vmap(lambda x_td, src_ec: jnp.take(x_td, src_ec, axis=0, mode="fill", fill_value=0))(x_gtd, src_gec)
    y_gecd = _swiglu_gecd(x_gecd, w_gate_edf, w_up_edf, w_down_efd)
    y_gtkd = y_gecd[g_gtk, idx_gtk, jnp.minimum(slot_gtk, c - 1)]
    y_gtd = jnp.einsum("gtk,gtkd->gtd", jnp.where(kept_gtk, w_gtk, 0).astype(y_gtkd.dtype), y_gtkd)
    stats = dict(
        drop_rate=1.0 - jnp.mean(kept_gtk, dtype=jnp.float32),
        tokens_per_expert_e=jnp.bincount(idx_gtk.reshape(-1), length=e).astype(jnp.float32),
    )
    return y_gtd, stats


def dropless_dispatch(x_gtd, idx_gtk, w_gtk, w_gate_edf, w_up_edf, w_down_efd, impl, tile_size):
    g, t, k = idx_gtk.shape
    e = w_gate_edf.shape[0]
    d = x_gtd.shape[-1]

    expert_a = idx_gtk.reshape(g * t * k)
    order_m = jnp.argsort(expert_a, stable=True)
    x_md = x_gtd.reshape(g * t, d)[order_m // k]
    group_sizes_e = jnp.bincount(expert_a, length=e).astype(jnp.int32)

    y_md = grouped_ffn(
        x_md, w_gate_edf, w_up_edf, w_down_efd, group_sizes_e, impl=impl, tile_size=tile_size
    )
    # Unsort by gathering with the inverse permutation: assignment a sits at row rank_a[a].
    rank_a = jnp.zeros_like(order_m).at[order_m].set(jnp.arange(g * t * k, dtype=order_m.dtype))
    y_gtkd = y_md[rank_a].reshape(g, t, k, d)
    y_gtd = jnp.einsum("gtk,gtkd->gtd", w_gtk.astype(y_gtkd.dtype), y_gtkd)
    stats = dict(
        drop_rate=jnp.zeros((), jnp.float32),
        tokens_per_expert_e=group_sizes_e.astype(jnp.float32),
    )
    return y_gtd, stats


def _check_dispatch_args(x_gtd, idx_gtk, w_gtk, w_gate_edf, w_up_edf, w_down_efd):
    if x_gtd.ndim != 3:
        raise ValueError(f"x_gtd must be 3-D [groups, tokens, d_model], got shape {x_gtd.shape}")
    g, t, d = x_gtd.shape
    if idx_gtk.ndim != 3 or idx_gtk.shape[:2] != (g, t):
        raise ValueError(f"idx_gtk must have shape ({g}, {t}, k), got {idx_gtk.shape}")
    if not jnp.issubdtype(idx_gtk.dtype, jnp.integer):
        raise ValueError(f"idx_gtk must hold integer expert ids, got dtype {idx_gtk.dtype}")
    if w_gtk.shape != idx_gtk.shape:
        raise ValueError(f"w_gtk must have the shape of idx_gtk {idx_gtk.shape}, got {w_gtk.shape}")
    if w_gate_edf.ndim != 3 or w_gate_edf.shape[1] != d:
        raise ValueError(f"w_gate_edf must have shape (e, {d}, f), got {w_gate_edf.shape}")
    e, _, f = w_gate_edf.shape
    if w_up_edf.shape != (e, d, f):
        raise ValueError(f"w_up_edf must have shape {(e, d, f)}, got {w_up_edf.shape}")
    if w_down_efd.shape != (e, f, d):
        raise ValueError(f"w_down_efd must have shape {(e, f, d)}, got {w_down_efd.shape}")
    if idx_gtk.shape[2] > e:
        raise ValueError(f"top-k ({idx_gtk.shape[2]}) must be at most the number of experts ({e})")


def dispatch(
    x_gtd: jax.Array,
    idx_gtk: jax.Array,
    w_gtk: jax.Array,
    w_gate_edf: jax.Array,
    w_up_edf: jax.Array,
    w_down_efd: jax.Array,
    *,
    cfg: DispatchConfig,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Run every token through its selected experts and combine: the MoE layer after the router.

    Args:
      x_gtd: [g, t, d] tokens, one group per sequence (capacity is allotted per group).
      idx_gtk: int [g, t, k] selected experts, each in [0, e), distinct within a token.
      w_gtk: [g, t, k] combine weights, float32; cast to x's dtype only at the combine.
      w_gate_edf, w_up_edf: [e, d, f] expert weights, in compute dtype.
      w_down_efd: [e, f, d] expert weights, in compute dtype.
      cfg: the backend and its knobs (:class:`moejax.schema.DispatchConfig`, checked when built):

        - ``backend``: ``"capacity"``, ``"dropless"`` or ``"expert_parallel"`` (see the module
          docstring);
        - ``capacity_factor``: ``"capacity"`` only; slots per expert and group are
          ``max(1, ceil(capacity_factor * t * k / e))`` (:func:`expert_capacity`);
        - ``impl``: ``"dropless"`` and ``"expert_parallel"``; grouped matmul implementation,
          ``"auto"``, ``"ragged"``, ``"tiled"`` or ``"hybrid"``
          (:func:`moejax.model.grouped_matmul.grouped_matmul`); config key ``model.moe.grouped_matmul``;
        - ``tile_size``: with ``"tiled"`` and ``"hybrid"`` (its overflow rows) only; rows per tile;
        - ``ep_comm``: ``"expert_parallel"`` only; ``"all_to_all"`` or ``"all_gather"``, how tokens
          travel (:mod:`moejax.model.expert_parallel`);
        - ``ep_capacity_factor``: ``"expert_parallel"`` only; each device reserves
          ``min(q, ceil(ep_capacity_factor * q / P))`` slots for each of the P devices of the
          expert axis, q its own assignments (:func:`moejax.model.expert_parallel.pair_capacity`);
          ``ep_capacity_factor >= P`` is exactly dropless. With ``ep_balance="llep"`` it sizes each
          device's native buffer instead: ``ceil(ep_capacity_factor * q)`` rows;
        - ``ep_balance``: ``"expert_parallel"`` only; ``"drop"`` drops what the buffers cannot hold,
          ``"llep"`` spills it with the experts' weights to the least-loaded devices
          (:mod:`moejax.model.llep`);
        - ``ep_spill_slots``, ``ep_spill_capacity_factor``: ``"llep"`` only; extra experts a device
          may host, and each slot's rows, ``ceil(ep_spill_capacity_factor * q)``;
        - ``ep_llep_threshold``: ``"llep"`` only; the step spills when an expert group's largest
          device load reaches this multiple of the mean load (or when standard EP's buffers would
          drop); otherwise it takes standard EP's exchange, with this threshold as its
          ``ep_capacity_factor``. ``<= 1``: always spill.

    Returns:
      y_gtd: [g, t, d] in x's dtype.
      stats: ``drop_rate``, float32 scalar, the fraction of (token, choice) assignments dropped
        (0 for dropless); ``tokens_per_expert_e``, float32 [e], assignments per expert before
        dropping, summed over groups (over all devices for expert_parallel too); with
        ``ep_balance="llep"`` also ``llep_engaged``, float32 scalar, 1.0 when the layer spilled.
    """
    _check_dispatch_args(x_gtd, idx_gtk, w_gtk, w_gate_edf, w_up_edf, w_down_efd)

    if cfg.backend == "capacity":
        y_gtd, stats = capacity_dispatch(
            x_gtd, idx_gtk, w_gtk, w_gate_edf, w_up_edf, w_down_efd, cfg.capacity_factor
        )
    elif cfg.backend == "expert_parallel" and splits_experts(x_gtd.shape[0]):
        y_gtd, stats = expert_parallel_dispatch(
            x_gtd, idx_gtk, w_gtk, w_gate_edf, w_up_edf, w_down_efd, comm=cfg.ep_comm,
            capacity_factor=cfg.ep_capacity_factor, impl=cfg.impl, tile_size=cfg.tile_size,
            balance=cfg.ep_balance, spill_slots=cfg.ep_spill_slots,
            spill_capacity_factor=cfg.ep_spill_capacity_factor, llep_threshold=cfg.ep_llep_threshold,
        )
    else:  # dropless, or expert_parallel with no expert axis to spread the experts over
        y_gtd, stats = dropless_dispatch(
            x_gtd, idx_gtk, w_gtk, w_gate_edf, w_up_edf, w_down_efd, cfg.impl, cfg.tile_size
        )
    return y_gtd.astype(x_gtd.dtype), stats
