"""Step: token-aware, loss-aware expert importance, and a knowledge-preserving refit.

Importance (token-aware, loss-aware). Each calibration token t is weighted by its own loss
``l_t`` (the unpruned model's next-token cross-entropy): tokens the model still gets wrong are the
ones whose computation pruning must not disturb, and easy tokens count little. An expert's
importance is the loss-weighted mean size of what it actually contributes:

    I_e = sum_t l_t * g_te * ||f_e(x_t)|| / sum_t l_t,

with ``g_te`` the combine weight the router gave expert e for token t (0 when e was not among its
top-k). The K most important experts of each layer are kept. (The alternative the method allows,
the loss increase when each expert is removed, costs one evaluation per expert and layer; the
loss-weighted contribution needs one forward pass, in keeping with a pruning budget of minutes.)

Knowledge-preserving step. Removing experts moves their tokens to other experts, which were not
trained to produce the removed experts' outputs. The pruned experts' knowledge is folded into the
kept experts by refitting the kept experts' down projections ``W_j`` (f x d), jointly, so that
the pruned layer -- routing top-k over the kept experts -- reproduces the unpruned layer's routed
output ``Y_t`` on the calibration tokens, tokens weighted by their loss:

    min_W  sum_t l_t || Y_t - sum_{j in top-k'(t)} g'_tj h_j(x_t) W_j ||^2 + lam sum_j ||W_j - W0_j||^2,

``h_j`` the kept expert's SwiGLU hidden activations (unchanged: the gate and up projections stay),
``g'`` the pruned router's weights. It is linear least squares in W (normal equations of size
K*f). The ridge pulls toward the trained weights; ``lam`` is chosen on every fifth calibration
token, held out of the fit, from a grid that includes "no refit" (lam = infinity), so the refit is
applied only where it lowers the held-out reconstruction error. Nothing else changes: the router
rows of the kept experts, and the gate and up projections, are the trained ones.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from moejax.prune.calibration import LayerData
from moejax.prune.objectives import expert_outputs, pruned_routing, routed_output

# Ridge strengths, relative to the mean diagonal of the normal matrix; inf keeps the trained weights.
RIDGE_GRID = (1e-3, 1e-2, 1e-1, 1.0, float("inf"))
HOLDOUT_EVERY = 5  # every fifth calibration token is held out to choose the ridge


def importance(data: LayerData, loss_t: np.ndarray) -> np.ndarray:
    """I_e, float64 [E] (see the module docstring)."""
    f_etd = expert_outputs(data.x_td, data.w_gate_edf, data.w_up_edf, data.w_down_efd)
    norm_et = np.asarray(jnp.linalg.norm(f_etd, axis=-1), np.float64)
    g_te = np.zeros((data.x_td.shape[0], data.num_experts))
    np.put_along_axis(g_te, data.idx_tk, data.weight_tk.astype(np.float64), axis=1)
    w_t = np.asarray(loss_t, np.float64)
    return np.einsum("t,te,et->e", w_t, g_te, norm_et) / max(w_t.sum(), 1e-30)


def step_keep(data: LayerData, loss_t: np.ndarray, k: int) -> tuple[int, ...]:
    """The ``k`` most important experts (sorted ids; ties: the lower id kept)."""
    order = np.argsort(-importance(data, loss_t), kind="stable")
    return tuple(sorted(int(e) for e in order[:k]))


@dataclasses.dataclass(frozen=True)
class Refit:
    """The refitted down projections of the kept experts ([E, f, d], original ids; pruned experts'
    rows unchanged), the ridge chosen (inf: no refit) and the held-out weighted errors per ridge."""

    w_down_efd: np.ndarray
    ridge: float
    heldout_error: dict[str, float]


def refit_down(data: LayerData, loss_t: np.ndarray, keep, *, top_k: int, renormalize: bool, scaling: float,
               score_func: str) -> Refit:
    """The knowledge-preserving refit of the kept experts' down projections (module docstring)."""
    keep = np.asarray(sorted(keep), int)
    t = data.x_td.shape[0]
    f_etd = expert_outputs(data.x_td, data.w_gate_edf, data.w_up_edf, data.w_down_efd)
    y_td = np.asarray(routed_output(f_etd, jnp.asarray(data.idx_tk), jnp.asarray(data.weight_tk)), np.float64)
    idx_tk, weight_tk = pruned_routing(data.probs_te, keep, top_k, renormalize, scaling, score_func)
    slot = {int(e): j for j, e in enumerate(keep)}
    g_tj = np.zeros((t, keep.size), np.float32)
    np.put_along_axis(g_tj, np.vectorize(slot.get)(idx_tk), weight_tk, axis=1)
    z_tx = np.asarray(_design(jnp.asarray(data.x_td), jnp.asarray(data.w_gate_edf[keep]),
                              jnp.asarray(data.w_up_edf[keep]), jnp.asarray(g_tj)), np.float64)
    w0_xd = data.w_down_efd[keep].reshape(-1, data.w_down_efd.shape[-1]).astype(np.float64)
    held = np.arange(t) % HOLDOUT_EVERY == HOLDOUT_EVERY - 1
    lw_t = np.asarray(loss_t, np.float64)
    fit, test = ~held, held
    zl = z_tx[fit] * lw_t[fit, None]
    normal_xx = z_tx[fit].T @ zl
    rhs_xd = zl.T @ y_td[fit]
    scale = np.trace(normal_xx) / normal_xx.shape[0]

    def heldout(w_xd):
        r_td = y_td[test] - z_tx[test] @ w_xd
        return float(np.sum(lw_t[test, None] * r_td ** 2) / max(np.sum(lw_t[test, None] * y_td[test] ** 2), 1e-30))

    errors, candidates = {}, {}
    for ridge in RIDGE_GRID:
        if np.isinf(ridge):
            w_xd = w0_xd
        else:
            lam = ridge * scale
            w_xd = np.linalg.solve(normal_xx + lam * np.eye(normal_xx.shape[0]), rhs_xd + lam * w0_xd)
        errors[repr(ridge)], candidates[ridge] = heldout(w_xd), w_xd
    best = min(RIDGE_GRID, key=lambda r: errors[repr(r)])
    w_down = data.w_down_efd.copy()
    w_down[keep] = candidates[best].reshape(keep.size, *data.w_down_efd.shape[1:]).astype(w_down.dtype)
    return Refit(w_down, best, errors)


@jax.jit
def _design(x_td, w_gate_jdf, w_up_jdf, g_tj):
    """Rows z_t = [g'_tj h_j(x_t)]_j, [T, K*f]."""
    h_jtf = jax.nn.silu(jnp.einsum("td,jdf->jtf", x_td, w_gate_jdf)) * jnp.einsum("td,jdf->jtf", x_td, w_up_jdf)
    z_tjf = jnp.transpose(h_jtf, (1, 0, 2)) * g_tj[:, :, None]
    return z_tjf.reshape(z_tjf.shape[0], -1)
