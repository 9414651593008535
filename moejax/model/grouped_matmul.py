"""Grouped (ragged) matmuls for dropless Mixture-of-Experts.

The rows of ``x_md`` are sorted by expert: the first ``group_sizes_e[0]`` rows belong to expert 0,
the next ``group_sizes_e[1]`` to expert 1, and so on. A grouped matmul multiplies each row by its
own expert's weight matrix. Rows past ``sum(group_sizes_e)`` belong to no expert and give zeros.

The implementations, chosen by ``impl``:

- ``"ragged"``: ``jax.lax.ragged_dot``. XLA lowers it to a grouped kernel on GPU and TPU, but on
  CPU it computes every expert densely over all rows (against a batched per-expert einsum:
  experiments/benchmarks/LOG.md, section 3 (c)).
- ``"tiled"``: for CPU. Each expert's rows (contiguous, since they are sorted) are cut into tiles
  of ``tile_size`` rows, and a ``fori_loop`` over the tiles in use multiplies each tile, sliced
  from ``x_md`` in place, by its expert's weight matrix (:func:`row_tile_loop`). Its work is that
  of the rows in use, with static shapes under ``jax.jit``: no padded copy of the rows and nothing
  computed for the tiles the static bound allows but the routing does not use.
- ``"hybrid"``: for CPU. Each expert's first ``c = hybrid_capacity(m, e)`` rows (an even share
  ``m / e``, rounded up to 8) go through one batched matmul ``[e, c, d] x [e, d, f]``, large
  matmuls that XLA:CPU runs near its peak; the rows past ``c`` of an expert that got more than
  that go through the ``"tiled"`` loop. Nothing is dropped and every row is multiplied by its own
  expert once, so it equals ``"tiled"`` up to float reassociation. Memory: about ``m`` rows of
  expert activations for the batched part (``e * c``) plus the loop's tiles (recomputed in its
  backward pass), like ``"tiled"``.
- ``"tokamax"``: ``tokamax.ragged_dot`` (the optional ``kernels`` extra: Google's Pallas kernel
  library, Apache-2.0), which picks its kernel from the device it is traced on: Mosaic GPU on
  Hopper/Blackwell, Triton on NVIDIA GPUs from Ampere, Mosaic TPU from TPU v5, else its XLA reference
  (``jax.lax.ragged_dot_general``, which is what it computes on CPU).
- ``"auto"``: on GPU/TPU ``"tokamax"`` when it is installed and the step runs on one device
  (:func:`one_device`), else ``"ragged"``; on CPU
  ``"hybrid"``, or ``"tiled"`` when an even share of rows per expert is under
  ``HYBRID_MIN_SHARE`` (256) rows, where the batched part no longer pays for its gathers
  (:func:`resolve_impl`; the platform is :func:`moejax.model.platform.current`, which a
  cross-platform lowering sets).

All are differentiable with respect to the rows and the weights and agree to float tolerance.

Why a loop over tiles. A batched einsum over tiles (``einsum('ntd,ndf->ntf')`` with each tile's
weights gathered into ``w_ndf``) is memory-bound on the 2-core CPU machines: the [n, d, f] gather
costs as much as the matmuls, its gradient is a scatter-add of the same size, and every tile of
the static bound is computed. The loop slices one expert's weights per tile (they stay in cache)
and runs only the tiles in use, forward and backward (a hand-written VJP that recomputes each
tile's forward), so a loop with few tiles in use costs almost nothing: the hybrid's overflow is
usually a few tiles or none out of a static bound of ``m - c`` rows. Reverse mode only
(``jax.grad``/``jax.vjp``), which is what training needs. It replaced block-padded tiles, whose
gathers and activations spanned the whole static bound (the A/B of the whole train step:
experiments/benchmarks/LOG.md, section 2, change 5).

Tile size trades the last, partly filled tile of each expert (its masked rows are still
multiplied) against per-tile loop overhead; the default, 64, is the best of the sizes compared
in LOG.md, change 5.

Dimension letters: m sorted rows, e experts, d input dim, f output dim, n tiles, t rows per tile,
c rows per expert of the hybrid's batched part.
"""

from __future__ import annotations

import importlib.util

import jax
import jax.numpy as jnp
from jax import lax

from moejax.errors import ConfigError
from moejax.model import platform
from moejax.schema import IMPLS  # declared with the dispatch config

# "auto" on CPU: "hybrid" when an even share of rows per expert is at least this many, else
# "tiled": with few rows per expert the batched part's gathers cost more than its larger matmuls
# save (the shares compared: experiments/benchmarks/LOG.md, section 3, "Latest (2026-12-02, after
# the tile loop ...)").
HYBRID_MIN_SHARE = 256
DEFAULT_TILE_SIZE = 64


def tokamax_installed() -> bool:
    """Whether the ``tokamax`` package (the ``kernels`` extra) can be imported."""
    return importlib.util.find_spec("tokamax") is not None


def one_device() -> bool:
    """Whether the computation being traced runs on one device (no mesh, or every axis of size 1).

    tokamax 0.0.12's kernels serve only there: a Pallas kernel has no sharding rule (XLA:TPU refuses
    to partition it, "Mosaic kernels cannot be automatically partitioned"; XLA:GPU would gather
    its operands onto every device), and inside expert parallelism's ``shard_map`` its kernels'
    output shapes carry no mesh-axis types, which ``shard_map``'s type check rejects
    (experiments/tools/lower_check.py finds both).
    """
    mesh = jax.sharding.get_abstract_mesh()
    return mesh.empty or all(size == 1 for size in mesh.shape.values())


def check_config(model_cfg, mesh_shape: dict[str, int]) -> None:
    """Raise ConfigError when ``model.moe.grouped_matmul="tokamax"`` cannot serve: the package is
    not installed, or the mesh has more than one device (:func:`one_device`)."""
    moe = model_cfg.moe
    if moe.grouped_matmul != "tokamax":
        return
    others = ", ".join(i for i in IMPLS if i != "tokamax")
    if not tokamax_installed():
        raise ConfigError(
            "config key 'model.moe.grouped_matmul' has value 'tokamax', but the tokamax package is not installed; "
            f'install the kernels extra (pip install -c constraints.txt -e ".[kernels]") or choose one of {others}'
        )
    devices = 1
    for size in mesh_shape.values():
        devices *= size
    if devices > 1:
        raise ConfigError(
            f"config key 'model.moe.grouped_matmul' has value 'tokamax' on a mesh of {devices} devices; allowed "
            "on one device only: tokamax's kernels have no sharding rule (XLA:TPU cannot partition them, XLA:GPU "
            "would gather every row onto every device) and fail shard_map's type check inside expert "
            "parallelism. Choose grouped_matmul 'auto' (it takes ragged_dot on several devices)."
        )


def resolve_impl(impl: str, num_rows: int | None = None, num_experts: int | None = None) -> str:
    """Map ``impl`` to a concrete implementation. ``"auto"`` on GPU/TPU is ``"tokamax"`` when it
    is installed and the step runs on :func:`one_device`, else ``"ragged"``; on CPU it is
    ``"hybrid"``, or ``"tiled"`` when given ``num_rows`` sorted rows over ``num_experts`` experts
    whose even share is under ``HYBRID_MIN_SHARE`` rows."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if impl == "tokamax" and not tokamax_installed():
        raise ValueError('grouped_matmul "tokamax" needs the tokamax package: pip install -c constraints.txt '
                         '-e ".[kernels]" (or choose auto, ragged, tiled or hybrid)')
    if impl != "auto":
        return impl
    if platform.current() != "cpu":
        return "tokamax" if tokamax_installed() and one_device() else "ragged"
    if num_rows is not None and num_rows < HYBRID_MIN_SHARE * num_experts:
        return "tiled"
    return "hybrid"


def check_tile_size(tile_size: int) -> None:
    """Raise ValueError unless ``tile_size`` is a positive int."""
    if not isinstance(tile_size, int) or isinstance(tile_size, bool) or tile_size < 1:
        raise ValueError(f"tile_size must be a positive int, got {tile_size!r}")


def max_tiles(num_rows: int, num_experts: int, tile_size: int) -> int:
    """Static upper bound on the tiles that ``num_rows`` rows in ``num_experts`` groups can need.

    Each non-empty group (at most ``min(num_experts, num_rows)`` of them) leaves at most
    ``tile_size - 1`` rows of its last tile unused.
    """
    padded_rows = num_rows + min(num_experts, num_rows) * (tile_size - 1)
    return max(1, -(-padded_rows // tile_size))


def _vary_alike(*arrays: jax.Array) -> tuple[jax.Array, ...]:
    """Inside ``shard_map``, make every array vary over the union of their mesh axes.

    ``shard_map`` types record the mesh axes a value varies over. A custom VJP must return
    cotangents of its inputs' types, and a loop carry must keep its type, so :func:`row_tile_loop`
    unifies its operands first; JAX differentiates the cast (its transpose is a ``psum``).
    ``lax.full_like`` inherits its example's axes without reading it, so the zero scalars carry the
    union and adding one casts an array. Outside ``shard_map`` (and after XLA folds ``+ 0``) this
    is free.
    """
    probe = sum(lax.full_like(a, 0, jnp.int32, shape=()) for a in arrays)
    return tuple(a + lax.full_like(probe, 0, a.dtype, shape=()) for a in arrays)


def hybrid_capacity(num_rows: int, num_experts: int) -> int:
    """Rows per expert in the batched part of ``"hybrid"``: an even share m / e rounded up to a
    multiple of 8 (a larger share compared in LOG.md, section 2, change 5)."""
    return min(-(-num_rows // (8 * num_experts)) * 8, num_rows)


def row_tiles(group_sizes_e: jax.Array, num_rows: int, skip: int, tile_size: int):
    """The tiles of each expert's rows past its first ``skip``: (expert_n, row0_n, end_n, num_used).

    Expert e's rows past ``skip`` are the contiguous sorted rows ``[start_e + skip, start_e +
    size_e)``; they are cut into tiles of ``tile_size`` rows, and tile j covers rows
    ``[row0_n[j], end_n[j])`` of expert ``expert_n[j]``. The static bound n counts the tiles if
    every row past ``skip`` were in use (:func:`max_tiles`); only the first ``num_used`` are.
    """
    (e,) = group_sizes_e.shape
    start_e = jnp.cumsum(group_sizes_e) - group_sizes_e
    over_e = jnp.maximum(group_sizes_e - skip, 0)
    tiles_e = -(-over_e // tile_size)
    tile_end_e = jnp.cumsum(tiles_e)
    n = max_tiles(max(num_rows - skip, 1), e, tile_size)
    expert_n = jnp.minimum(jnp.searchsorted(tile_end_e, jnp.arange(n), side="right"), e - 1).astype(jnp.int32)
    row0_n = start_e[expert_n] + skip + (jnp.arange(n) - (tile_end_e - tiles_e)[expert_n]) * tile_size
    end_n = jnp.minimum(row0_n + tile_size, (start_e + group_sizes_e)[expert_n])
    return expert_n, row0_n.astype(jnp.int32), end_n.astype(jnp.int32), tile_end_e[-1]


def row_tile_loop(tile_fn, x_md: jax.Array, ws_e: tuple, tiles, tile_size: int) -> jax.Array:
    """``y_mf[i] = tile_fn(x_md[i], *(w[expert of i] for w in ws_e))`` on the rows of ``tiles``
    (:func:`row_tiles`), zeros elsewhere: a ``fori_loop`` over the used tiles only.

    Each tile reads a ``tile_size``-row slice of ``x_md`` in place (rows outside the tile masked to
    zero), applies ``tile_fn`` with its expert's weights and adds the result into the output
    slice, so the cost is that of the rows in use: no work over the static bound, no gathers and
    no activations of unused tiles (the hybrid's overflow is usually a few tiles or none, out of a
    bound of m - c rows). ``tile_fn`` must map zero rows to zero rows (a matmul or a SwiGLU does).
    The hand-written VJP runs the same loop, recomputing each tile's forward under ``jax.vjp``
    (only the inputs are kept), and accumulates each expert's weight gradient in at least float32.
    Reverse mode only.
    """
    m = x_md.shape[0]
    t = min(tile_size, m)

    def tile(j, x_md, tiles):
        """The clamped slice start of tile j and its rows of x (others zero)."""
        _, row0_n, end_n, _ = tiles
        s = jnp.minimum(row0_n[j], m - t)
        rows_t = s + jnp.arange(t)
        valid_t1 = ((rows_t >= row0_n[j]) & (rows_t < end_n[j]))[:, None]
        return s, valid_t1, jnp.where(valid_t1, lax.dynamic_slice_in_dim(x_md, s, t), 0)

    def add_rows(acc_md, s, rows_td):
        return lax.dynamic_update_slice_in_dim(acc_md, lax.dynamic_slice_in_dim(acc_md, s, t) + rows_td, s, 0)

    def expert_ws(j, ws_e, expert_n):
        return tuple(lax.dynamic_index_in_dim(w, expert_n[j], keepdims=False) for w in ws_e)

    # The tiles are explicit (integer) arguments, not closed over: they derive from the routing.
    @jax.custom_vjp
    def loop(x_md, ws_e, tiles):
        f = jax.eval_shape(tile_fn, x_md[:t], *(w[0] for w in ws_e)).shape[-1]
        y_mf = lax.full_like(x_md, 0, shape=(m, f))

        expert_n, _, _, num_used = tiles

        def body(j, y_mf):
            s, _, x_td = tile(j, x_md, tiles)
            return add_rows(y_mf, s, tile_fn(x_td, *expert_ws(j, ws_e, expert_n)).astype(y_mf.dtype))

        return lax.fori_loop(0, num_used, body, y_mf)

    def loop_fwd(x_md, ws_e, tiles):
        return loop(x_md, ws_e, tiles), (x_md, ws_e, tiles)

    def loop_bwd(residuals, dy_mf):
        x_md, ws_e, tiles = residuals
        expert_n, _, _, num_used = tiles
        acc = tuple(lax.full_like(w, 0, jnp.promote_types(w.dtype, jnp.float32)) for w in ws_e)

        def body(j, carry):
            dx_md, dws_e = carry
            s, valid_t1, x_td = tile(j, x_md, tiles)
            dy_tf = jnp.where(valid_t1, lax.dynamic_slice_in_dim(dy_mf, s, t), 0)
            _, tile_vjp = jax.vjp(tile_fn, x_td, *expert_ws(j, ws_e, expert_n))
            dx_td, *dw_tile = tile_vjp(dy_tf.astype(x_td.dtype))
            dws_e = tuple(
                lax.dynamic_update_index_in_dim(dw, dw[expert_n[j]] + g.astype(dw.dtype), expert_n[j], 0)
                for dw, g in zip(dws_e, dw_tile)
            )
            return add_rows(dx_md, s, dx_td.astype(dx_md.dtype)), dws_e

        dx_md, dws_e = lax.fori_loop(0, num_used, body, (lax.full_like(x_md, 0), acc))
        return dx_md, tuple(dw.astype(w.dtype) for dw, w in zip(dws_e, ws_e)), (None,) * 4

    loop.defvjp(loop_fwd, loop_bwd)
    k = len(ws_e)
    x_md, *rest = _vary_alike(x_md, *ws_e, *tiles)
    return loop(x_md, tuple(rest[:k]), tuple(rest[k:]))


def _tiled(x_md: jax.Array, group_sizes_e: jax.Array, tile_fn, ws_e: tuple, tile_size: int) -> jax.Array:
    """The ``"tiled"`` grouped op ``tile_fn(rows, *expert weights)``: every row through the loop."""
    tiles = row_tiles(group_sizes_e, x_md.shape[0], 0, tile_size)
    return row_tile_loop(tile_fn, x_md, ws_e, tiles, tile_size)


def _hybrid(x_md: jax.Array, group_sizes_e: jax.Array, tile_fn, ws_e: tuple, tile_size: int) -> jax.Array:
    """The ``"hybrid"`` grouped op ``tile_fn(rows, *expert weights)``: batched (``jax.vmap`` over
    experts) on each expert's first c rows, :func:`row_tile_loop` on the rows past c."""
    m = x_md.shape[0]
    (e,) = group_sizes_e.shape
    c = hybrid_capacity(m, e)
    start_e = jnp.cumsum(group_sizes_e) - group_sizes_e
    slot_c = jnp.arange(c, dtype=jnp.int32)
    # Row of slot (e, s), or m (out of range: reads zero, writes nothing) for an empty slot.
    src_ec = jnp.where(slot_c < group_sizes_e[:, None], start_e[:, None] + slot_c, m)
    y_ecf = jax.vmap(tile_fn)(jnp.take(x_md, src_ec, axis=0, mode="fill", fill_value=0), *ws_e)
    # full_like (not jnp.zeros): inside shard_map the result keeps y's mesh-axis type (see _vary_alike).
    f = y_ecf.shape[-1]
    y_mf = lax.full_like(y_ecf, 0, shape=(m, f)).at[src_ec.reshape(-1)].add(y_ecf.reshape(e * c, f), mode="drop")
    if c == m:  # no expert can hold more than c rows
        return y_mf
    tiles = row_tiles(group_sizes_e, m, c, tile_size)
    return y_mf + row_tile_loop(tile_fn, x_md, ws_e, tiles, tile_size).astype(y_mf.dtype)


def _ragged_dot(impl: str):
    """``ragged_dot(x_md, w_edf, group_sizes_e)`` of ``"ragged"`` (XLA's) or ``"tokamax"``."""
    if impl == "ragged":
        return lax.ragged_dot
    import tokamax  # the kernels extra; imported only when chosen (it takes seconds)
    from absl import flags

    # tokamax reads its options as absl flags and, when no program has parsed them, parses
    # sys.argv itself, failing on a command's own arguments ("Unknown command line flag").
    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()
    return tokamax.ragged_dot


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
      impl: ``"auto"``, ``"ragged"``, ``"tokamax"``, ``"tiled"`` or ``"hybrid"`` (see the module docstring).
      tile_size: rows per tile for ``"tiled"``.

    Returns:
      y_mf: [m, f], ``y_mf[i] = x_md[i] @ w_edf[expert of row i]``.
    """
    impl = resolve_impl(impl, x_md.shape[0], w_edf.shape[0])
    check_tile_size(tile_size)
    group_sizes_e = jnp.asarray(group_sizes_e, jnp.int32)
    _check_grouped_args(x_md, w_edf, group_sizes_e)
    if impl in ("ragged", "tokamax"):
        return _ragged_dot(impl)(x_md, w_edf, group_sizes_e)
    if impl == "hybrid":
        return _hybrid(x_md, group_sizes_e, jnp.matmul, (w_edf,), tile_size)
    return _tiled(x_md, group_sizes_e, jnp.matmul, (w_edf,), tile_size)


def swiglu(x_td: jax.Array, w_gate_df: jax.Array, w_up_df: jax.Array, w_down_fd: jax.Array) -> jax.Array:
    """One expert's SwiGLU ``(silu(x @ w_gate) * (x @ w_up)) @ w_down`` on rows [t, d] -> [t, d]."""
    return (jax.nn.silu(x_td @ w_gate_df) * (x_td @ w_up_df)) @ w_down_fd


def batched_ffn(x_ecd: jax.Array, w_gate_edf: jax.Array, w_up_edf: jax.Array, w_down_efd: jax.Array) -> jax.Array:
    """Per-expert SwiGLU over equal row blocks: [e, c, d] -> [e, c, d], one batched matmul per
    weight (the hybrid's batched part; the capacity backend's experts)."""
    return jax.vmap(swiglu)(x_ecd, w_gate_edf, w_up_edf, w_down_efd)


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

    ``"tiled"`` and ``"hybrid"`` run the whole SwiGLU per tile (or per expert block), so the
    activations of one tile never leave it. Arguments are as for :func:`grouped_matmul`; returns y_md [m, d].
    """
    impl = resolve_impl(impl, x_md.shape[0], w_gate_edf.shape[0])
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

    if impl in ("ragged", "tokamax"):
        ragged_dot = _ragged_dot(impl)
        gate_mf = ragged_dot(x_md, w_gate_edf, group_sizes_e)
        up_mf = ragged_dot(x_md, w_up_edf, group_sizes_e)
        return ragged_dot(jax.nn.silu(gate_mf) * up_mf, w_down_efd, group_sizes_e)

    if impl == "hybrid":
        return _hybrid(x_md, group_sizes_e, swiglu, (w_gate_edf, w_up_edf, w_down_efd), tile_size)

    return _tiled(x_md, group_sizes_e, swiglu, (w_gate_edf, w_up_edf, w_down_efd), tile_size)
