"""The dropless dispatch in dense per-expert blocks, for CPU (``model.moe.grouped_matmul="blocks"``).

Each expert's first ``c = hybrid_capacity(m, e)`` assignments (an even share of the m = tokens x k
assignments, rounded up to 8) are gathered straight from the tokens into one ``[e, c, d]`` block
and run through one batched SwiGLU; the assignments past ``c`` of an expert that got more (the
overflow) go through :func:`moejax.model.grouped_matmul.row_tile_loop` over the expert-sorted rows,
which costs only the tiles in use. Nothing is dropped and every assignment meets its own expert
once: the same computation as ``"hybrid"`` on sorted rows, so equal to it up to float
reassociation.

What differs from ``"hybrid"`` is the data movement around the matmuls. Every move of rows is a
gather whose transpose is a gather too (:func:`gather_rows`): the tokens into the blocks (and,
when an expert can overflow, into the sorted rows the loop reads), the blocks' and the loop's
outputs back to the assignments for the combine. XLA would transpose a gather into a scatter-add,
which XLA:CPU runs element by element; ``"hybrid"`` has four of them per layer and step (the sort's
gather, the blocks' gather and scatter, the unsort).

Dimension letters: s tokens (groups x tokens), k experts per token, a assignments (s x k, token-
major), m the same sorted by expert, e experts, c rows per expert block, j block rows (e x c), d
model width, f expert width.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from moejax.model.grouped_matmul import batched_ffn, hybrid_capacity, row_tile_loop, row_tiles, swiglu


@jax.custom_vjp
def gather_rows(x_nd: jax.Array, src_j: jax.Array, dst_nk: jax.Array) -> jax.Array:
    """``y_jd[j] = x_nd[src_j[j]]``, zeros where ``src_j[j] == n`` (out of range), with a gather for
    its transpose: ``dx_nd[i] = sum_k dy_jd[dst_nk[i, k]]``.

    ``dst_nk`` must list, for each row i of x, every j with ``src_j[j] == i`` (padded with
    ``len(src_j)``, out of range, which reads zero): each row is read at most k times. The
    transpose XLA would derive is a scatter-add over ``src_j``; this one reads instead of writes.
    Integer arguments get no cotangent. Reverse mode only.
    """
    return jnp.take(x_nd, src_j, axis=0, mode="fill", fill_value=0)


def _gather_rows_fwd(x_nd, src_j, dst_nk):
    return gather_rows(x_nd, src_j, dst_nk), (src_j, dst_nk)


def _gather_rows_bwd(residuals, dy_jd):
    src_j, dst_nk = residuals
    n, k = dst_nk.shape
    dx_nkd = jnp.take(dy_jd, dst_nk.reshape(n * k), axis=0, mode="fill", fill_value=0).reshape(n, k, -1)
    return jnp.sum(dx_nkd, axis=1) if k > 1 else dx_nkd[:, 0], None, None


gather_rows.defvjp(_gather_rows_fwd, _gather_rows_bwd)


def blocks_ffn(x_sd, idx_sk, w_gate_edf, w_up_edf, w_down_efd, tile_size):
    """Each token through its k experts: y_skd[s, i] = SwiGLU_{idx_sk[s, i]}(x_sd[s]).

    Args:
      x_sd: [s, d] tokens.
      idx_sk: int [s, k] selected experts, each in [0, e).
      w_gate_edf, w_up_edf, w_down_efd: the experts' SwiGLU weights.
      tile_size: rows per tile of the overflow loop.

    Returns:
      y_skd: [s, k, d] in x's dtype (uncombined), and group_sizes_e, int32 [e], assignments per expert.
    """
    s, k = idx_sk.shape
    e = w_gate_edf.shape[0]
    m = s * k
    c = hybrid_capacity(m, e)

    expert_a = idx_sk.reshape(m)
    order_m = jnp.argsort(expert_a, stable=True).astype(jnp.int32)
    sizes_e = jnp.bincount(expert_a, length=e).astype(jnp.int32)
    start_e = jnp.cumsum(sizes_e) - sizes_e
    rank_a = jnp.zeros((m,), jnp.int32).at[order_m].set(jnp.arange(m, dtype=jnp.int32))
    pos_a = rank_a - start_e[expert_a]  # the assignment's place among its expert's, in token order
    # Block row of each assignment (e * c, out of range, for one past its expert's c), and the
    # assignment in each block row (m, out of range, for an empty one).
    row_a = jnp.where(pos_a < c, expert_a * c + pos_a, e * c)
    slot_c = jnp.arange(c, dtype=jnp.int32)
    a_j = jnp.where(slot_c < sizes_e[:, None], order_m[jnp.minimum(start_e[:, None] + slot_c, m - 1)], m).reshape(e * c)

    x_jd = gather_rows(x_sd, jnp.where(a_j < m, a_j // k, s), row_a.reshape(s, k))
    y_jd = batched_ffn(x_jd.reshape(e, c, -1), w_gate_edf, w_up_edf, w_down_efd).reshape(e * c, -1)
    y_ad = gather_rows(y_jd, row_a, a_j[:, None])
    if c < m:  # an expert can get more than c rows: the overflow loop over the sorted rows
        x_md = gather_rows(x_sd, order_m // k, rank_a.reshape(s, k))
        tiles = row_tiles(sizes_e, m, c, tile_size)
        y_md = row_tile_loop(swiglu, x_md, (w_gate_edf, w_up_edf, w_down_efd), tiles, tile_size)
        y_ad = y_ad + gather_rows(y_md.astype(y_ad.dtype), rank_a, order_m[:, None])
    return y_ad.reshape(s, k, -1), sizes_e
