"""Grouped (ragged) matmuls for dropless Mixture-of-Experts.

The rows of ``x_md`` are sorted by expert: the first ``group_sizes_e[0]`` rows belong to expert 0,
the next ``group_sizes_e[1]`` to expert 1, and so on. A grouped matmul multiplies each row by its
own expert's weight matrix. Rows past ``sum(group_sizes_e)`` belong to no expert and give zeros.

Three implementations, chosen by ``impl``:

- ``"ragged"``: ``jax.lax.ragged_dot``. XLA lowers it to a grouped kernel on GPU and TPU, but on
  CPU it computes every expert densely over all rows (measured: about 48x slower than a batched
  per-expert einsum at 64 experts).
- ``"tiled"``: a block-padded grouped matmul, for CPU. Each expert's group is padded to a multiple
  of ``tile_size`` rows (:class:`TileLayout`), so every tile belongs to exactly one expert, and each
  tile is multiplied by its expert's weight matrix. Shapes are static: the number of tiles is
  bounded by ``m + min(e, m) * (tile_size - 1)`` padded rows, so it works under ``jax.jit``.
- ``"hybrid"``: for CPU. Each expert's first ``c = hybrid_capacity(m, e)`` rows (1.25x an even
  share, rounded up to 8) go through one batched einsum ``[e, c, d] x [e, d, f]``, large matmuls
  that XLA:CPU runs near its peak; the rows past ``c`` of an expert that got more than that go
  through ``"tiled"`` (with balanced routing, few or none). Nothing is dropped and every row is
  multiplied by its own expert once, so it equals ``"tiled"`` up to float reassociation. Measured
  (SwiGLU fwd+bwd, idle 2-core machine): 1.44x ``"tiled"`` at m 16384, d 256, f 512, 16 experts
  with near-even groups, 1.20x with uneven ones (Dirichlet(5) shares), 1.08x at the tiny
  config's m 8192, d 128, f 256, 8 experts. The price is memory: its expert activations span
  about ``2.25 m`` rows (``e * c`` batched plus the static bound of the overflow's tiles) against
  ``m + e * tile_size`` for ``"tiled"``; choose ``"tiled"`` where that matters on CPU.
- ``"auto"``: ``"ragged"`` on GPU/TPU, ``"hybrid"`` on CPU (``jax.default_backend()``).

All are differentiable with respect to the rows and the weights and agree to float tolerance.

Why a loop over tiles rather than one batched einsum. The obvious tiled kernel gathers each
tile's weights into ``w_ndf`` and runs ``einsum('ntd,ndf->ntf')``. On the 2-core CPU machines
that gather is memory-bound (an [n, d, f] copy costs as much as the matmuls themselves), its
gradient is a scatter-add of the same size, and every tile of the static bound is computed,
including the ones that are pure padding (up to half of them). :func:`tile_matmul` instead runs a
``fori_loop`` over the tiles actually used, slicing one expert's weights per tile (it stays in
cache), with a hand-written VJP that does the same for ``dx`` and ``dw``: 2-5x faster forward and
backward at m=8192, d=256, f=512. It is reverse-mode only (``jax.grad``/``jax.vjp``), which is
what training needs.

Tile size trades padding (up to ``tile_size - 1`` wasted rows per expert) against per-tile loop
overhead. ``experiments/benchmarks/grouped_matmul.py`` (m=8192, d=256, f=512, e in {8, 64}, equal
and random group sizes; four runs on a busy 2-core machine) gave 64 the best worst case in three:
65-165 GFLOP/s (the load varied), against 85-245 for the dense per-expert einsum ceiling and
2-18 for ``ragged_dot``. 128 is 10-25% faster with about 1000 rows per expert but 15-30% slower with about
128 rows per expert of random size, where its padding bites; 32 rarely helps.

Dimension letters: m sorted rows, e experts, d input dim, f output dim, n tiles, t rows per tile,
p padded rows (p = n * t), c rows per expert of the hybrid's batched part, j its overflow rows.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from jax import lax

IMPLS = ("auto", "ragged", "tiled", "hybrid")
# "hybrid": the rows per expert of its batched part, as a multiple of an even share (see hybrid_capacity).
HYBRID_CAPACITY_FACTOR = 1.25
DEFAULT_TILE_SIZE = 64


def resolve_impl(impl: str) -> str:
    """Map ``impl`` to a concrete implementation: ``"auto"`` picks by ``jax.default_backend()``."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if impl == "auto":
        return "hybrid" if jax.default_backend() == "cpu" else "ragged"
    return impl


def check_tile_size(tile_size: int) -> None:
    """Raise ValueError unless ``tile_size`` is a positive int."""
    if not isinstance(tile_size, int) or isinstance(tile_size, bool) or tile_size < 1:
        raise ValueError(f"tile_size must be a positive int, got {tile_size!r}")


def max_tiles(num_rows: int, num_experts: int, tile_size: int) -> int:
    """Static upper bound on the tiles that ``num_rows`` rows in ``num_experts`` groups can need.

    Each non-empty group (at most ``min(num_experts, num_rows)`` of them) wastes at most
    ``tile_size - 1`` rows of padding.
    """
    padded_rows = num_rows + min(num_experts, num_rows) * (tile_size - 1)
    return max(1, -(-padded_rows // tile_size))


def _vary_alike(*arrays: jax.Array) -> tuple[jax.Array, ...]:
    """Inside ``shard_map``, make every array vary over the union of their mesh axes.

    ``shard_map`` types record the mesh axes a value varies over. A custom VJP must return
    cotangents of its inputs' types, and a loop carry must keep its type, so :func:`tile_matmul`
    unifies its operands first; JAX differentiates the cast (its transpose is a ``psum``).
    ``lax.full_like`` inherits its example's axes without reading it, so the zero scalars carry the
    union and adding one casts an array. Outside ``shard_map`` (and after XLA folds ``+ 0``) this
    is free.
    """
    probe = sum(lax.full_like(a, 0, jnp.int32, shape=()) for a in arrays)
    return tuple(a + lax.full_like(probe, 0, a.dtype, shape=()) for a in arrays)


def tile_matmul(
    x_ntd: jax.Array, w_edf: jax.Array, tile_expert_n: jax.Array, num_used_tiles: jax.Array
) -> jax.Array:
    """``y_ntf[j] = x_ntd[j] @ w_edf[tile_expert_n[j]]`` for ``j < num_used_tiles``, else 0.

    A loop over the used tiles only; differentiable in reverse mode w.r.t. ``x_ntd`` and ``w_edf``.
    """
    return _tile_matmul(*_vary_alike(x_ntd, w_edf, tile_expert_n, num_used_tiles))


@jax.custom_vjp
def _tile_matmul(x_ntd, w_edf, tile_expert_n, num_used_tiles):
    n, t, _ = x_ntd.shape
    # full_like (not jnp.zeros) so the carry has the operands' shard_map type (see _vary_alike).
    y_ntf = lax.full_like(x_ntd, 0, jnp.result_type(x_ntd, w_edf), shape=(n, t, w_edf.shape[2]))

    def body(j, y_ntf):
        w_df = lax.dynamic_index_in_dim(w_edf, tile_expert_n[j], keepdims=False)
        x_td = lax.dynamic_index_in_dim(x_ntd, j, keepdims=False)
        return lax.dynamic_update_index_in_dim(y_ntf, x_td @ w_df, j, axis=0)

    return lax.fori_loop(0, num_used_tiles, body, y_ntf)


def _tile_matmul_fwd(x_ntd, w_edf, tile_expert_n, num_used_tiles):
    residuals = (x_ntd, w_edf, tile_expert_n, num_used_tiles)
    return _tile_matmul(x_ntd, w_edf, tile_expert_n, num_used_tiles), residuals


def _tile_matmul_bwd(residuals, dy_ntf):
    x_ntd, w_edf, tile_expert_n, num_used_tiles = residuals
    # Tiles of one expert add into the same dw slice: accumulate in at least float32.
    acc_dtype = jnp.promote_types(w_edf.dtype, jnp.float32)

    def body(j, carry):
        dx_ntd, dw_edf = carry
        e = tile_expert_n[j]
        w_df = lax.dynamic_index_in_dim(w_edf, e, keepdims=False)
        x_td = lax.dynamic_index_in_dim(x_ntd, j, keepdims=False)
        dy_tf = lax.dynamic_index_in_dim(dy_ntf, j, keepdims=False)
        dx_td = jnp.einsum("tf,df->td", dy_tf, w_df).astype(x_ntd.dtype)
        dx_ntd = lax.dynamic_update_index_in_dim(dx_ntd, dx_td, j, axis=0)
        dw_df = lax.dynamic_index_in_dim(dw_edf, e, keepdims=False) + jnp.einsum(
            "td,tf->df", x_td, dy_tf, preferred_element_type=acc_dtype
        )
        return dx_ntd, lax.dynamic_update_index_in_dim(dw_edf, dw_df, e, axis=0)

    init = (lax.full_like(x_ntd, 0), lax.full_like(w_edf, 0, acc_dtype))
    dx_ntd, dw_edf = lax.fori_loop(0, num_used_tiles, body, init)
    return dx_ntd, dw_edf.astype(w_edf.dtype), None, None


_tile_matmul.defvjp(_tile_matmul_fwd, _tile_matmul_bwd)


@dataclasses.dataclass(frozen=True)
class TileLayout:
    """Where each expert-sorted row goes when every group is padded to a multiple of a tile.

    Computed once from the group sizes and shared by every matmul over the same rows (the
    SwiGLU expert runs three): ``layout.from_tiles(layout.matmul(layout.to_tiles(x_md), w_edf))``
    is the grouped matmul. A pytree, so it can cross ``jax.jit`` boundaries.

    Attributes:
      src_p: int32 [n * tile_size]; the sorted row each padded row holds, or ``m`` (out of range,
        reads as zero) for a padding row.
      dest_m: int32 [m]; the padded row of each sorted row, or ``n * tile_size`` (out of range,
        reads as zero) for a row past ``sum(group_sizes_e)``.
      tile_expert_n: int32 [n]; the expert that owns each tile (trailing unused tiles get the
        last expert).
      num_used_tiles: int32 scalar; tiles that hold rows (the rest of the static bound is unused).
      tile_size: rows per tile (static).
    """

    src_p: jax.Array
    dest_m: jax.Array
    tile_expert_n: jax.Array
    num_used_tiles: jax.Array
    tile_size: int

    @classmethod
    def build(cls, group_sizes_e: jax.Array, num_rows: int, *, tile_size: int) -> TileLayout:
        """The layout of ``num_rows`` expert-sorted rows with ``group_sizes_e`` rows per expert."""
        check_tile_size(tile_size)
        group_sizes_e = jnp.asarray(group_sizes_e, jnp.int32)
        (num_experts,) = group_sizes_e.shape
        n = max_tiles(num_rows, num_experts, tile_size)
        p = n * tile_size

        start_e = jnp.cumsum(group_sizes_e) - group_sizes_e
        tiles_e = -(-group_sizes_e // tile_size)
        tile_end_e = jnp.cumsum(tiles_e)

        # Tile j belongs to the first expert whose tiles end after j.
        tile_expert_n = jnp.searchsorted(tile_end_e, jnp.arange(n, dtype=jnp.int32), side="right")
        tile_expert_n = jnp.minimum(tile_expert_n, num_experts - 1).astype(jnp.int32)

        expert_p = jnp.repeat(tile_expert_n, tile_size, total_repeat_length=p)
        padded_start_p = (tile_end_e - tiles_e)[expert_p] * tile_size
        offset_p = jnp.arange(p, dtype=jnp.int32) - padded_start_p
        is_row_p = offset_p < group_sizes_e[expert_p]
        src_p = jnp.where(is_row_p, start_e[expert_p] + offset_p, num_rows)

        # dest inverts src: padding rows (src_p == num_rows) are dropped by the scatter, and rows
        # that no padded row holds keep the out-of-range fill.
        dest_m = jnp.full((num_rows,), p, jnp.int32)
        dest_m = dest_m.at[src_p].set(jnp.arange(p, dtype=jnp.int32), mode="drop")
        return cls(
            src_p=src_p,
            dest_m=dest_m,
            tile_expert_n=tile_expert_n,
            num_used_tiles=tile_end_e[-1],
            tile_size=tile_size,
        )

    @property
    def num_tiles(self) -> int:
        """The static number of tiles n (an upper bound on ``num_used_tiles``)."""
        return self.tile_expert_n.shape[0]

    def to_tiles(self, x_md: jax.Array) -> jax.Array:
        """Sorted rows [m, d] -> tiles [n, tile_size, d]; padding rows are zero."""
        x_pd = jnp.take(x_md, self.src_p, axis=0, mode="fill", fill_value=0)
        return x_pd.reshape(self.num_tiles, self.tile_size, x_md.shape[-1])

    def from_tiles(self, y_ntf: jax.Array) -> jax.Array:
        """Tiles [n, tile_size, f] -> sorted rows [m, f]; rows past the groups' total are zero."""
        y_pf = y_ntf.reshape(self.num_tiles * self.tile_size, y_ntf.shape[-1])
        return jnp.take(y_pf, self.dest_m, axis=0, mode="fill", fill_value=0)

    def matmul(self, x_ntd: jax.Array, w_edf: jax.Array) -> jax.Array:
        """Each tile times its expert's weights: [n, t, d] x [e, d, f] -> [n, t, f]."""
        return tile_matmul(x_ntd, w_edf, self.tile_expert_n, self.num_used_tiles)


jax.tree_util.register_dataclass(
    TileLayout,
    data_fields=["src_p", "dest_m", "tile_expert_n", "num_used_tiles"],
    meta_fields=["tile_size"],
)


def hybrid_capacity(num_rows: int, num_experts: int) -> int:
    """Rows per expert in the batched part of ``"hybrid"``: 1.25x an even share, a multiple of 8."""
    even = HYBRID_CAPACITY_FACTOR * num_rows / num_experts
    return min(-(-math.ceil(even) // 8) * 8, num_rows)


def _hybrid(x_md: jax.Array, group_sizes_e: jax.Array, batched, tiled) -> jax.Array:
    """The ``"hybrid"`` grouped op: ``batched(x_ecd) -> y_ecf`` on each expert's first c rows,
    ``tiled(x_jd, over_e) -> y_jf`` on the rest (j: overflow rows, grouped by expert)."""
    m = x_md.shape[0]
    (e,) = group_sizes_e.shape
    c = hybrid_capacity(m, e)
    start_e = jnp.cumsum(group_sizes_e) - group_sizes_e
    slot_c = jnp.arange(c, dtype=jnp.int32)
    # Row of slot (e, s), or m (out of range: reads zero, writes nothing) for an empty slot.
    src_ec = jnp.where(slot_c < group_sizes_e[:, None], start_e[:, None] + slot_c, m)
    y_ecf = batched(jnp.take(x_md, src_ec, axis=0, mode="fill", fill_value=0))
    # full_like (not jnp.zeros): inside shard_map the result keeps y's mesh-axis type (see _vary_alike).
    f = y_ecf.shape[-1]
    y_mf = lax.full_like(y_ecf, 0, shape=(m, f)).at[src_ec.reshape(-1)].add(y_ecf.reshape(e * c, f), mode="drop")
    if c == m:  # no expert can hold more than c rows
        return y_mf
    # At most m - c rows overflow (all rows in one expert); overflow row j of expert e_j is that
    # expert's row c + (j - first overflow row of e_j).
    over_e = jnp.maximum(group_sizes_e - c, 0)
    over_end_e = jnp.cumsum(over_e)
    j = jnp.arange(m - c, dtype=jnp.int32)
    e_j = jnp.searchsorted(over_end_e, j, side="right").astype(jnp.int32)
    e_jc = jnp.minimum(e_j, e - 1)
    src_j = jnp.where(e_j < e, start_e[e_jc] + c + j - (over_end_e - over_e)[e_jc], m)
    y_jf = tiled(jnp.take(x_md, src_j, axis=0, mode="fill", fill_value=0), over_e)
    return y_mf.at[src_j].add(y_jf.astype(y_mf.dtype), mode="drop")


def _check_grouped_args(x_md: jax.Array, w_edf: jax.Array, group_sizes_e: jax.Array) -> None:
    if x_md.ndim != 2:
        raise ValueError(f"x_md must be 2-D [m, d], got shape {x_md.shape}")
    if w_edf.ndim != 3 or w_edf.shape[1] != x_md.shape[1]:
        raise ValueError(f"weights must be 3-D [e, d={x_md.shape[1]}, f], got shape {w_edf.shape}")
    if group_sizes_e.shape != (w_edf.shape[0],):
        raise ValueError(
            f"group_sizes_e must have shape ({w_edf.shape[0]},), one size per expert, "
            f"got {group_sizes_e.shape}"
        )


def grouped_matmul(
    x_md: jax.Array,
    w_edf: jax.Array,
    group_sizes_e: jax.Array,
    *,
    impl: str = "auto",
    tile_size: int = DEFAULT_TILE_SIZE,
) -> jax.Array:
    """Multiply each expert-sorted row of ``x_md`` by its expert's weights.

    Args:
      x_md: [m, d] rows sorted by expert.
      w_edf: [e, d, f] one weight matrix per expert.
      group_sizes_e: int [e] consecutive rows per expert; sums to at most m (rows past the sum
        give zeros).
      impl: ``"auto"``, ``"ragged"`` or ``"tiled"`` (see the module docstring).
      tile_size: rows per tile for ``"tiled"``.

    Returns:
      y_mf: [m, f], ``y_mf[i] = x_md[i] @ w_edf[expert of row i]``.
    """
    impl = resolve_impl(impl)
    check_tile_size(tile_size)
    group_sizes_e = jnp.asarray(group_sizes_e, jnp.int32)
    _check_grouped_args(x_md, w_edf, group_sizes_e)
    if impl == "ragged":
        return lax.ragged_dot(x_md, w_edf, group_sizes_e)
    if impl == "hybrid":
        tiled = lambda x_jd, over_e: grouped_matmul(x_jd, w_edf, over_e, impl="tiled", tile_size=tile_size)
        batched = lambda x_ecd: jnp.einsum("ecd,edf->ecf", x_ecd, w_edf)
        return _hybrid(x_md, group_sizes_e, batched, tiled)
    layout = TileLayout.build(group_sizes_e, x_md.shape[0], tile_size=tile_size)
    return layout.from_tiles(layout.matmul(layout.to_tiles(x_md), w_edf))


def batched_ffn(x_ecd: jax.Array, w_gate_edf: jax.Array, w_up_edf: jax.Array, w_down_efd: jax.Array) -> jax.Array:
    """Per-expert SwiGLU over equal row blocks: [e, c, d] -> [e, c, d], one batched matmul per
    weight (the hybrid's batched part; the capacity backend's experts)."""
    h_ecf = jax.nn.silu(jnp.einsum("ecd,edf->ecf", x_ecd, w_gate_edf)) * jnp.einsum("ecd,edf->ecf", x_ecd, w_up_edf)
    return jnp.einsum("ecf,efd->ecd", h_ecf, w_down_efd)


def grouped_ffn(
    x_md: jax.Array,
    w_gate_edf: jax.Array,
    w_up_edf: jax.Array,
    w_down_efd: jax.Array,
    group_sizes_e: jax.Array,
    *,
    impl: str = "auto",
    tile_size: int = DEFAULT_TILE_SIZE,
) -> jax.Array:
    """Per-expert SwiGLU over expert-sorted rows: ``(silu(x @ w_gate) * (x @ w_up)) @ w_down``.

    With ``impl="tiled"`` the rows are padded into tiles once and all three matmuls run on the
    tiles. Arguments are as for :func:`grouped_matmul`; returns y_md [m, d].
    """
    impl = resolve_impl(impl)
    check_tile_size(tile_size)
    group_sizes_e = jnp.asarray(group_sizes_e, jnp.int32)
    _check_grouped_args(x_md, w_gate_edf, group_sizes_e)
    if w_up_edf.shape != w_gate_edf.shape:
        raise ValueError(
            f"w_up_edf must have the shape of w_gate_edf {w_gate_edf.shape}, got {w_up_edf.shape}"
        )
    e, d, f = w_gate_edf.shape
    if w_down_efd.shape != (e, f, d):
        raise ValueError(f"w_down_efd must have shape {(e, f, d)}, got {w_down_efd.shape}")

    if impl == "ragged":
        gate_mf = lax.ragged_dot(x_md, w_gate_edf, group_sizes_e)
        up_mf = lax.ragged_dot(x_md, w_up_edf, group_sizes_e)
        return lax.ragged_dot(jax.nn.silu(gate_mf) * up_mf, w_down_efd, group_sizes_e)

    if impl == "hybrid":
        batched = lambda x_ecd: batched_ffn(x_ecd, w_gate_edf, w_up_edf, w_down_efd)
        tiled = lambda x_jd, over_e: grouped_ffn(
            x_jd, w_gate_edf, w_up_edf, w_down_efd, over_e, impl="tiled", tile_size=tile_size
        )
        return _hybrid(x_md, group_sizes_e, batched, tiled)

    layout = TileLayout.build(group_sizes_e, x_md.shape[0], tile_size=tile_size)
    x_ntd = layout.to_tiles(x_md)
    h_ntf = jax.nn.silu(layout.matmul(x_ntd, w_gate_edf)) * layout.matmul(x_ntd, w_up_edf)
    return layout.from_tiles(layout.matmul(h_ntf, w_down_efd))
