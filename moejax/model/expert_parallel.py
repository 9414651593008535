"""Expert-parallel MoE dispatch: tokens travel to the devices that hold their experts, and back.

Layout. The expert weights are split over the mesh's expert axis (``sharding.RULES["experts"]``):
peer i of that axis holds experts ``[i * e, (i + 1) * e)``, e = num_experts / P local experts. The
tokens are split over the batch axes (data, fsdp, expert), so the P peers along the expert axis
hold different tokens, and each (token, choice) assignment has to be computed on the peer that
owns its expert. Everything below runs per device under ``jax.shard_map``; collectives over the
expert axis move the tokens, and the other mesh axes never exchange tokens.

Per device:

1. Slots. The device's q = s * k assignments (s local tokens) are put in priority order,
   choice-major as in the capacity backend (every token's first choice, in token order, before
   any second choice). The device reserves c slots for each destination peer,
   ``c = min(q, ceil(ep_capacity_factor * q / P))`` (:func:`pair_capacity`); q / P is what one
   source sends one destination under perfect balance. An assignment takes the next free slot of
   its destination; once a destination's c slots are full, its further assignments are dropped
   and contribute zero. ``ep_capacity_factor >= P`` gives c = q: exactly dropless.
2. Send, in one of two communication forms (``comm``):

   - ``"all_to_all"``: a send buffer of r = P * c rows (row ``i * c + j`` holds the token in
     slot j to peer i, zeros if the slot is free) and the local expert id of each row go through
     ``lax.all_to_all`` over the expert axis. The receive buffer has the same r rows: c from
     each source, in source order.
   - ``"all_gather"``: the tokens, combine weights, expert ids and slots are all-gathered over
     the expert axis; every device picks the assignments in its own slots and builds, from the
     gathered tokens, the same r-row buffer as the all_to_all form receives.

3. Compute. The r rows are sorted by local expert and run through the grouped SwiGLU
   (:func:`moejax.model.grouped_matmul.grouped_ffn`); free slots sort last and give zeros.
4. Return. ``"all_to_all"``: the rows travel back with the same all_to_all; each source reads
   every kept assignment's result from its slot and combines over k with the weights.
   ``"all_gather"``: each device weights its rows and adds them into the gathered tokens' rows;
   a ``psum_scatter`` (reduce-scatter) over the expert axis sums the peers' partial outputs and
   hands every device its own tokens.

Per device, the all_to_all form moves ``factor * q * d`` values each way, the all_gather form
``P * s * d`` (all P peers' tokens in, their partial outputs out): all_to_all moves less while
``factor < P / k`` and is the default. Both give the same numbers, drops included, because the
expert computation sees identical buffers.

Sharded weights. Inside ``shard_map`` the weights are blocks: the model dim split over fsdp
(``RULES["embed"]``) is all-gathered before use (FSDP; the transpose, a reduce-scatter, sums the
weight gradients of the fsdp shards). The ffn dim split over tensor (``RULES["expert_mlp"]``) is
kept split: SwiGLU is elementwise in f, so each tensor shard computes the down projection of its
f slice, a partial sum of the output, and one ``psum`` over tensor of the [s, d] output (the
smallest array on the way, after the combine) completes it; gathering the weights over tensor
instead would multiply expert weight memory and compute by the tensor size.

Memory under imbalance. Every buffer has a static shape set by c, never by the routing: if every
token picks the same expert, its owner still receives at most c rows from each source, the rest
is dropped and counted, and memory stays what the factor allows.

Least-loaded spilling (``ep_balance="llep"``, :func:`_llep_device_dispatch`). Instead of dropping,
the excess assignments of overloaded experts go, with those experts' weights, to spill slots on the
least-loaded devices of the expert axis, by a plan every device computes identically from the
all-gathered expert ids (:mod:`moejax.model.llep`). Tokens travel in the all_gather form; each
device's buffer has native rows for its own experts plus one block of rows per spill slot; the
hosted experts' weights arrive over a ring of ``ppermute`` steps (:func:`_ring_spill_weights`), and
their gradients return to the owners by autodiff of the ring. All shapes are static. It spills only
when some expert group's largest device load reaches ``llep_threshold`` times the mean (or standard
EP's buffers would drop, :func:`llep_engages`); otherwise the layer takes standard EP's exchange.
Both branches are compiled (``lax.cond``), one decision for the whole mesh.

Statistics are global: ``drop_rate`` is the number of dropped assignments over the number of
assignments, both summed over all devices; ``tokens_per_expert_e`` counts assignments before
dropping, summed over all devices.

Dimension letters (per-device sizes inside ``shard_map``): g groups, t tokens per group, d model
dim, f expert ffn dim (this device's slice), e local experts, k experts per token, s local tokens
(g * t), q local assignments in priority order (k * s, choice-major), p expert-axis peers (P), c slots
per (source, destination) pair, r buffer rows (p * c), m buffer rows sorted by expert, u gathered
assignments (p * q), v gathered tokens (p * s).
"""

from __future__ import annotations

import fractions
import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

from moejax.model import llep
from moejax.model.grouped_matmul import grouped_ffn
from moejax.schema import COMMS  # declared with the dispatch config
from moejax.sharding import RULES


class _Axes(NamedTuple):
    """Mesh axes (of size > 1) of each role; an empty tuple means not split."""

    batch: tuple[str, ...]  # the tokens' batch dim
    expert: tuple[str, ...]  # the experts: the peers that exchange tokens
    embed: tuple[str, ...]  # the weights' model dim (all-gathered)
    ffn: tuple[str, ...]  # the weights' ffn dim (partial sums, psum)


def _mesh_axes(logical: str, mesh) -> tuple[str, ...]:
    axes = RULES[logical]
    axes = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
    return tuple(a for a in axes if a in mesh.axis_names and mesh.shape[a] > 1)


def _axes(mesh) -> _Axes:
    return _Axes(*(_mesh_axes(name, mesh) for name in ("batch", "experts", "embed", "expert_mlp")))


def _ways(mesh, names: tuple[str, ...]) -> int:
    return math.prod(mesh.shape[a] for a in names)


def splits_experts(num_groups: int) -> bool:
    """Whether the mesh set by ``jax.set_mesh`` splits the experts and ``num_groups`` groups evenly.

    False without a mesh, with an expert axis of size 1, or when the groups cannot be split over
    the batch axes (e.g. decoding fewer sequences than devices): then there is nothing to
    exchange, and :func:`moejax.model.dispatch.dispatch` computes as dropless.
    """
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return False
    axes = _axes(mesh)
    return _ways(mesh, axes.expert) > 1 and num_groups % _ways(mesh, axes.batch) == 0


def pair_capacity(assignments_per_device: int, peers: int, capacity_factor: float) -> int:
    """Slots c a device reserves for each destination: ``min(q, ceil(factor * q / P))``, >= 1.

    q / P is what one source sends one destination under perfect balance, so the receive buffer
    is ``P * c ~ factor * q`` rows; ``factor >= P`` gives c = q (exactly dropless). The product is
    taken on the factor's decimal value (1.1 * 10 is 11, not 12 from float rounding).
    """
    exact = fractions.Fraction(str(capacity_factor)) * assignments_per_device / peers
    return min(assignments_per_device, max(1, math.ceil(exact)))


def _slots(dest_q: jax.Array, p: int, c: int) -> jax.Array:
    """Each assignment's row ``dest * c + rank`` in the send buffer, or p * c when dropped.

    The rank is the number of earlier assignments (in priority order) to the same destination.
    """
    q = dest_q.shape[0]
    order_q = jnp.argsort(dest_q, stable=True)
    count_p = jnp.bincount(dest_q, length=p)
    start_p = jnp.cumsum(count_p) - count_p
    rank_sorted_q = jnp.arange(q, dtype=jnp.int32) - start_p[dest_q[order_q]]
    rank_q = jnp.zeros_like(dest_q).at[order_q].set(rank_sorted_q.astype(dest_q.dtype))
    return jnp.where(rank_q < c, dest_q * c + rank_q, p * c)


def _fill_rows(row_u: jax.Array, r: int) -> jax.Array:
    """Inverse of a partial row assignment: the entry u that sits in each of r rows, or len(u)."""
    u = row_u.shape[0]
    return jnp.full((r,), u, jnp.int32).at[row_u].set(jnp.arange(u, dtype=jnp.int32), mode="drop")


def _local_experts(x_rd, expert_r, w_gate_edf, w_up_edf, w_down_efd, impl, tile_size):
    """Each buffer row through its local expert; rows with expert id e (free slots) give zeros."""
    e = w_gate_edf.shape[0]
    order_m = jnp.argsort(expert_r, stable=True)
    group_sizes_e = jnp.bincount(expert_r, length=e).astype(jnp.int32)
    y_md = grouped_ffn(
        x_rd[order_m], w_gate_edf, w_up_edf, w_down_efd, group_sizes_e, impl=impl, tile_size=tile_size
    )
    r = x_rd.shape[0]
    rank_r = jnp.zeros_like(order_m).at[order_m].set(jnp.arange(r, dtype=order_m.dtype))
    return y_md[rank_r]


def _all_to_all_exchange(x_sd, expert_q, w_q, slot_q, experts, *, axes, p, c):
    """Send buffer -> all_to_all -> local experts -> all_to_all back -> combine: y_sd [s, d]."""
    s, d = x_sd.shape
    q = expert_q.shape[0]
    e = experts.num_local
    assign_r = _fill_rows(slot_q, p * c)
    token_r = jnp.where(assign_r < q, assign_r % s, s)
    x_rd = jnp.take(x_sd, token_r, axis=0, mode="fill", fill_value=0)
    expert_r = jnp.take(expert_q % e, assign_r, mode="fill", fill_value=e)

    swap = functools.partial(lax.all_to_all, axis_name=axes.expert, split_axis=0, concat_axis=0, tiled=True)
    y_rd = swap(experts(swap(x_rd), swap(expert_r)))
    y_qd = jnp.take(y_rd, slot_q, axis=0, mode="fill", fill_value=0)
    y_ksd = y_qd.reshape(q // s, s, d)
    return jnp.einsum("ks,ksd->sd", w_q.reshape(q // s, s).astype(y_ksd.dtype), y_ksd)


def _all_gather_exchange(x_sd, expert_q, w_q, slot_q, experts, *, axes, p, c):
    """All-gather -> this device's buffer -> local experts -> weighted rows -> reduce-scatter."""
    s, d = x_sd.shape
    q = expert_q.shape[0]
    e = experts.num_local
    gather = functools.partial(lax.all_gather, axis_name=axes.expert, axis=0, tiled=True)
    x_vd, expert_u, w_u, slot_u = gather(x_sd), gather(expert_q), gather(w_q), gather(slot_q)

    # Gathered assignment u came from peer u // q; it is this device's if its slot is here.
    # Its buffer row is then (source peer) * c + (its rank): the all_to_all form's receive layout.
    me = lax.axis_index(axes.expert)
    source_u = jnp.arange(p * q, dtype=jnp.int32) // q
    row_u = jnp.where(slot_u // c == me, source_u * c + slot_u % c, p * c)
    assign_r = _fill_rows(row_u, p * c)
    token_r = jnp.where(assign_r < p * q, (assign_r // q) * s + assign_r % q % s, p * s)
    x_rd = jnp.take(x_vd, token_r, axis=0, mode="fill", fill_value=0)
    expert_r = jnp.take(expert_u % e, assign_r, mode="fill", fill_value=e)

    y_rd = experts(x_rd, expert_r)
    w_r = jnp.take(w_u, assign_r, mode="fill", fill_value=0).astype(y_rd.dtype)
    y_vd = jnp.zeros((p * s, d), y_rd.dtype).at[token_r].add(w_r[:, None] * y_rd, mode="drop")
    return lax.psum_scatter(y_vd, axes.expert, scatter_dimension=0, tiled=True)


_EXCHANGES = {"all_to_all": _all_to_all_exchange, "all_gather": _all_gather_exchange}


class _LocalExperts(NamedTuple):
    """This device's expert weights (model dim gathered) and how to run rows through them."""

    weights: tuple[jax.Array, jax.Array, jax.Array]
    impl: str
    tile_size: int

    @property
    def num_local(self) -> int:
        return self.weights[0].shape[0]

    def __call__(self, x_rd, expert_r):
        return _local_experts(x_rd, expert_r, *self.weights, self.impl, self.tile_size)


def _gather_model_dim(w_gate_edf, w_up_edf, w_down_efd, embed_axes):
    if not embed_axes:
        return w_gate_edf, w_up_edf, w_down_efd
    gather = functools.partial(lax.all_gather, axis_name=embed_axes, tiled=True)
    return gather(w_gate_edf, axis=1), gather(w_up_edf, axis=1), gather(w_down_efd, axis=2)


def _stats_from_kept(kept, expert_q, num_experts, batch_axes):
    """Global drop_rate and tokens_per_expert_e from this device's kept count and its assignments."""
    tokens_per_expert_e = jnp.bincount(expert_q, length=num_experts).astype(jnp.int32)
    kept, tokens_per_expert_e = lax.psum((kept, tokens_per_expert_e), batch_axes)
    assigned = jnp.sum(tokens_per_expert_e)
    return dict(
        drop_rate=(assigned - kept).astype(jnp.float32) / assigned.astype(jnp.float32),
        tokens_per_expert_e=tokens_per_expert_e.astype(jnp.float32),
    )


def _choice_major(idx_gtk, w_gtk):
    """This device's assignments in priority order (choice-major): expert_q [q] int32, w_q [q]."""
    g, t, k = idx_gtk.shape
    expert_q = jnp.swapaxes(idx_gtk.reshape(g * t, k), 0, 1).reshape(g * t * k).astype(jnp.int32)
    return expert_q, jnp.swapaxes(w_gtk.reshape(g * t, k), 0, 1).reshape(g * t * k)


def _standard_exchange(x_sd, expert_q, w_q, experts, *, axes, comm, p, c):
    """Standard EP's slots and exchange: the combined y_sd [s, d] (before the tensor psum) and the
    number of this device's assignments kept."""
    slot_q = _slots(expert_q // experts.num_local, p, c)
    y_sd = _EXCHANGES[comm](x_sd, expert_q, w_q, slot_q, experts, axes=axes, p=p, c=c)
    return y_sd, jnp.sum(slot_q < p * c, dtype=jnp.int32)


def _device_dispatch(
    x_gtd, idx_gtk, w_gtk, w_gate_edf, w_up_edf, w_down_efd, *, axes, num_experts, comm,
    capacity_factor, impl, tile_size,
):
    """The per-device body under ``shard_map``: slots, exchange, local experts, combine."""
    g, t, k = idx_gtk.shape
    d = x_gtd.shape[-1]
    s, q = g * t, g * t * k
    e = w_gate_edf.shape[0]
    p = num_experts // e
    c = pair_capacity(q, p, capacity_factor)

    expert_q, w_q = _choice_major(idx_gtk, w_gtk)
    experts = _LocalExperts(
        _gather_model_dim(w_gate_edf, w_up_edf, w_down_efd, axes.embed), impl, tile_size
    )
    y_sd, kept = _standard_exchange(x_gtd.reshape(s, d), expert_q, w_q, experts, axes=axes, comm=comm, p=p, c=c)
    if axes.ffn:
        y_sd = lax.psum(y_sd, axes.ffn)
    return y_sd.reshape(g, t, d), _stats_from_kept(kept, expert_q, num_experts, axes.batch)


def _ring_spill_weights(local_weights, slot_expert_ps, me, expert_axes):
    """The weights of the experts this device's spill slots host: [S, ...] per weight array of
    ``local_weights`` (each [e, ...]), zeros where a slot is unused.

    A ring over the expert axis: the local experts travel one peer onward per step (``ppermute``,
    P - 1 steps of a ``lax.scan``), and after step j every device holds owner ``me - j``'s experts,
    from which each slot hosting one of them takes its copy. Memory stays one travelling block (e
    experts) plus the S slots, whatever P and S; traffic is (P - 1) * e experts per device. Autodiff
    transposes the ring: the helpers' weight gradients travel back the other way and add into the
    owners' gradients. (A single ``all_to_all`` of a [P, S, ...] send buffer, the owners' copies for
    every slot, is simpler and moves P * S experts, but holds them all at once; the two are compared
    in docs/expert_parallel.md, "Memory formula".)
    """
    e = local_weights[0].shape[0]
    p = slot_expert_ps.shape[0]
    mine_s = jnp.take(slot_expert_ps, me, axis=0)
    owner_s, local_s = mine_s // e, mine_s % e  # owner p: the slot is unused
    onward = [(i, (i + 1) % p) for i in range(p)]

    def take_from(owner, block, spill):
        hit_s = owner_s == owner
        return tuple(
            jnp.where(hit_s.reshape(-1, *[1] * (w.ndim - 1)), jnp.take(w, local_s, axis=0), old)
            for w, old in zip(block, spill)
        )

    def step(carry, j):
        block, spill = carry
        block = lax.ppermute(block, expert_axes, onward)
        return (block, take_from((me - j) % p, block, spill)), None

    empty = tuple(jnp.zeros_like(jnp.take(w, local_s, axis=0)) for w in local_weights)
    spill = take_from(me, local_weights, empty)
    (_, spill), _ = lax.scan(step, (tuple(local_weights), spill), jnp.arange(1, p, dtype=jnp.int32))
    return spill


def _llep_spill(x_sd, idx_gtk, w_gtk, local, *, axes, p, n, spill_slots, c, impl, tile_size):
    """LLEP's spilling exchange (the plan of :mod:`moejax.model.llep`): the combined y_sd [s, d]
    (before the tensor psum) and the number of this device's assignments the plan keeps.

    Tokens travel as in the all_gather form: every device of the expert group sees the group's
    tokens and expert ids, computes the same plan, builds its buffer of n + S * c rows (native rows
    for its own experts, then one block per spill slot) from the gathered tokens, runs them through
    its e experts and the S hosted ones, adds the weighted rows into the gathered tokens' rows, and a
    reduce-scatter returns every token's combined output to its home.
    """
    s, d = x_sd.shape
    k = idx_gtk.shape[-1]
    q = s * k
    e = local[0].shape[0]
    r = n + spill_slots * c
    u, v = p * q, p * s

    gather = functools.partial(lax.all_gather, axis_name=axes.expert, axis=0, tiled=True)
    x_vd = gather(x_sd)
    # Priority order w = (choice, source device, token): choice-major over the whole group.
    expert_w = gather(idx_gtk.reshape(s, k).astype(jnp.int32)).T.reshape(u)
    weight_w = gather(w_gtk.reshape(s, k)).T.reshape(u)
    the_plan = llep.plan(
        expert_w, peers=p, local_experts=e, native_rows=n, spill_slots=spill_slots, spill_rows=c
    )

    me = lax.axis_index(axes.expert)
    assign_r = _fill_rows(jnp.where(the_plan.device_w == me, the_plan.row_w, r), r)
    token_r = jnp.where(assign_r < u, assign_r % v, v)
    x_rd = jnp.take(x_vd, token_r, axis=0, mode="fill", fill_value=0)
    # Local expert ids: native rows their expert's local id, spill slot j's rows e + j, free e + S.
    row_r = jnp.arange(r, dtype=jnp.int32)
    expert_r = jnp.where(row_r < n, jnp.take(expert_w, assign_r, mode="fill", fill_value=0) % e,
                         e + (row_r - n) // c)
    expert_r = jnp.where(assign_r < u, expert_r, e + spill_slots)

    spill = _ring_spill_weights(local, the_plan.slot_expert_ps, me, axes.expert)
    hosted = tuple(jnp.concatenate([w, w_spill]) for w, w_spill in zip(local, spill))
    y_rd = _LocalExperts(hosted, impl, tile_size)(x_rd, expert_r)
    w_r = jnp.take(weight_w, assign_r, mode="fill", fill_value=0).astype(y_rd.dtype)
    y_vd = jnp.zeros((v, d), y_rd.dtype).at[token_r].add(w_r[:, None] * y_rd, mode="drop")
    y_sd = lax.psum_scatter(y_vd, axes.expert, scatter_dimension=0, tiled=True)

    # This device's own assignments (source me) that the plan keeps.
    source_w = jnp.arange(u, dtype=jnp.int32) % v // s
    return y_sd, jnp.sum((the_plan.device_w < p) & (source_w == me), dtype=jnp.int32)


def llep_engages(expert_q, *, axes, p, e, pair_slots, threshold):
    """Whether LLEP spills: bool, the same on every device of the mesh.

    An expert group asks for it when its imbalance, the largest device load over the mean load
    (loads as standard EP would ask them, :func:`moejax.model.llep.standard_ep_load`), reaches
    ``threshold``, or when standard EP's per-pair buffers (``pair_slots`` rows per source and
    destination) would drop an assignment: below the threshold the standard path must still be
    exact. The mean load is q, every device's own assignment count. The decision is taken for the
    whole mesh (any group asking): the two branches run different collectives, which every device
    must enter alike (XLA:CPU aborts when expert groups take different branches).
    """
    q = expert_q.shape[0]
    count_p = jnp.bincount(expert_q // e, length=p)
    load_p, overflow = lax.psum((count_p, jnp.sum(count_p > pair_slots, dtype=jnp.int32)), axes.expert)
    asks = ((jnp.max(load_p).astype(jnp.float32) >= threshold * q) | (overflow > 0)).astype(jnp.int32)
    groups = tuple(a for a in axes.batch if a not in axes.expert)
    return (lax.psum(asks, groups) if groups else asks) > 0


def _llep_device_dispatch(
    x_gtd, idx_gtk, w_gtk, w_gate_edf, w_up_edf, w_down_efd, *, axes, num_experts, comm,
    capacity_factor, spill_slots, spill_capacity_factor, threshold, impl, tile_size,
):
    """The per-device body with ``ep_balance="llep"`` (:mod:`moejax.model.llep`).

    Under the imbalance threshold (:func:`llep_engages`) the group takes standard EP's exchange
    (``comm``, per-pair slots of ``ceil(threshold * q / P)``: the most a device can be asked for
    under the threshold), which then drops nothing; at or above it,
    the spilling exchange (:func:`_llep_spill`); one decision for the whole mesh. Both branches
    are compiled (``lax.cond``); a ``threshold <= 1`` always spills (no branch). ``llep_engaged``
    in the statistics is 1.0 when it spilled, 0.0 when not.
    """
    g, t, k = idx_gtk.shape
    d = x_gtd.shape[-1]
    s, q = g * t, g * t * k
    e = w_gate_edf.shape[0]
    p = num_experts // e
    x_sd = x_gtd.reshape(s, d)
    expert_q, w_q = _choice_major(idx_gtk, w_gtk)
    local = _gather_model_dim(w_gate_edf, w_up_edf, w_down_efd, axes.embed)

    def spill():
        return _llep_spill(
            x_sd, idx_gtk, w_gtk, local, axes=axes, p=p, n=llep.buffer_rows(q, p, capacity_factor),
            spill_slots=spill_slots, c=llep.buffer_rows(q, p, spill_capacity_factor), impl=impl,
            tile_size=tile_size,
        )

    # Under the threshold no device is asked for more than threshold * q rows in all: standard EP's
    # buffers of that size (per pair ceil(threshold * q / P)) are what the standard branch needs.
    c_pair = pair_capacity(q, p, threshold)

    def standard_exchange(x_sd, expert_q, w_q, local):
        experts = _LocalExperts(local, impl, tile_size)
        return _standard_exchange(x_sd, expert_q, w_q, experts, axes=axes, comm=comm, p=p, c=c_pair)

    def standard():
        # Rematerialised: JAX differentiates a cond by keeping the residuals of both branches, so
        # the standard branch keeps only its inputs and recomputes its forward in the backward
        # pass: less memory beside the spill's residuals, and faster on CPU too (A/B in
        # experiments/benchmarks/LOG.md, section 7).
        return jax.checkpoint(standard_exchange)(x_sd, expert_q, w_q, local)

    if threshold <= 1:
        engaged = jnp.ones((), bool)
        y_sd, kept = spill()
    else:
        engaged = llep_engages(expert_q, axes=axes, p=p, e=e, pair_slots=c_pair, threshold=threshold)
        y_sd, kept = lax.cond(engaged, spill, standard)
    if axes.ffn:
        y_sd = lax.psum(y_sd, axes.ffn)
    stats = _stats_from_kept(kept, expert_q, num_experts, axes.batch)
    stats["llep_engaged"] = engaged.astype(jnp.float32)
    return y_sd.reshape(g, t, d), stats


def _check_divisible(x_gtd, w_gate_edf, mesh, axes: _Axes) -> None:
    g, (e, d, f) = x_gtd.shape[0], w_gate_edf.shape
    for what, size, names in (
        ("groups (batch)", g, axes.batch), ("experts", e, axes.expert),
        ("model dim", d, axes.embed), ("expert ffn dim", f, axes.ffn),
    ):
        if size % _ways(mesh, names):
            raise ValueError(
                f"expert_parallel: {what} of size {size} cannot be split {_ways(mesh, names)} "
                f"ways over mesh axes {names}"
            )


def expert_parallel_dispatch(
    x_gtd: jax.Array,
    idx_gtk: jax.Array,
    w_gtk: jax.Array,
    w_gate_edf: jax.Array,
    w_up_edf: jax.Array,
    w_down_efd: jax.Array,
    *,
    comm: str,
    capacity_factor: float,
    impl: str,
    tile_size: int,
    balance: str = "drop",
    spill_slots: int = 2,
    spill_capacity_factor: float = 1.0,
    llep_threshold: float = 1.3,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Expert-parallel dispatch over the mesh set by ``jax.set_mesh`` (see the module docstring).

    Arguments are global arrays, as for :func:`moejax.model.dispatch.dispatch`; ``comm`` is one of
    :data:`COMMS`, ``capacity_factor`` sets the slots per (source, destination) pair
    (:func:`pair_capacity`), ``impl`` a grouped matmul implementation (``"auto"`` resolves per device). The mesh must
    split the experts and the groups (:func:`splits_experts`). Returns ``y_gtd`` and the global
    ``drop_rate`` and ``tokens_per_expert_e``.

    ``balance="llep"`` (:mod:`moejax.model.llep`) spills overloaded experts' excess assignments and
    weights to the least-loaded devices instead of dropping them: ``capacity_factor`` then sizes
    each device's native buffer (``ceil(factor * q)`` rows, not per pair), ``spill_slots`` is the
    number of extra experts a device may host and ``spill_capacity_factor`` sizes each slot's rows
    (:func:`moejax.model.llep.buffer_rows`). It spills only when an expert group's imbalance
    (largest device load over the mean) reaches ``llep_threshold`` or its standard exchange would
    drop (:func:`llep_engages`); otherwise the step takes standard EP's exchange in the ``comm``
    form, with ``llep_threshold`` as its capacity factor. The statistics add ``llep_engaged`` (1.0
    when it spilled). The spilling exchange moves tokens in the all_gather form whatever ``comm`` is.
    """
    if comm not in COMMS:
        raise ValueError(f"ep_comm must be one of {COMMS}, got {comm!r}")
    if balance not in llep.BALANCES:
        raise ValueError(f"ep_balance must be one of {llep.BALANCES}, got {balance!r}")
    if balance == "llep":
        if not (isinstance(llep_threshold, (int, float)) and 0 < llep_threshold < math.inf):
            raise ValueError(f"ep_llep_threshold must be a finite number > 0, got {llep_threshold!r}")
        if not (isinstance(spill_slots, int) and not isinstance(spill_slots, bool) and spill_slots >= 1):
            raise ValueError(f"ep_spill_slots must be an int >= 1 (experts a device may host), got {spill_slots!r}")
        if not (isinstance(spill_capacity_factor, (int, float)) and 0 < spill_capacity_factor < math.inf):
            raise ValueError(f"ep_spill_capacity_factor must be a finite number > 0, got {spill_capacity_factor!r}")
    mesh = jax.sharding.get_abstract_mesh()
    axes = _axes(mesh)
    _check_divisible(x_gtd, w_gate_edf, mesh, axes)
    or_none = lambda names: names or None
    tokens = P(or_none(axes.batch))
    w_in = P(or_none(axes.expert), or_none(axes.embed), or_none(axes.ffn))
    w_out = P(or_none(axes.expert), or_none(axes.ffn), or_none(axes.embed))
    if balance == "llep":
        body = functools.partial(
            _llep_device_dispatch, axes=axes, num_experts=w_gate_edf.shape[0], comm=comm,
            capacity_factor=capacity_factor, spill_slots=spill_slots,
            spill_capacity_factor=spill_capacity_factor, threshold=llep_threshold, impl=impl,
            tile_size=tile_size,
        )
    else:
        body = functools.partial(
            _device_dispatch, axes=axes, num_experts=w_gate_edf.shape[0], comm=comm,
            capacity_factor=capacity_factor, impl=impl, tile_size=tile_size,
        )
    return jax.shard_map(
        body, mesh=mesh, in_specs=(tokens, tokens, tokens, w_in, w_in, w_out), out_specs=(tokens, P())
    )(x_gtd, idx_gtk, w_gtk, w_gate_edf, w_up_edf, w_down_efd)
