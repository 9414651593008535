"""What pruning one MoE layer costs: the experts' outputs on the calibration tokens, the
quadratic reconstruction objective Schur-A* minimises, and the error of the pruned layer itself.

The objective (the one :mod:`moejax.prune.schur_astar` minimises exactly). With ``Y`` (T x d) the
routed part of the layer's output (``sum_k w_tk f_{i_tk}(x_t)``; the shared experts are not pruned
and cancel), ``p_te`` the routing probability of expert e for token t and ``A_e = p_e * f_e(X)``
(expert e's output on *every* token, weighted by how much the router wants it there), flattened to
a T*d vector,

    D(S) = min_c || Y - sum_{e in S} c_e A_e ||^2 = ||Y||^2 - b_S^T G_SS^{-1} b_S,

with ``G = A^T A`` (E x E Gram) and ``b = A^T Y``: the best reconstruction of the layer's output
from the kept experts alone when one combine coefficient per kept expert is re-solved. It is the
Schur complement of ``G_SS`` in the bordered Gram ``[[G_SS, b_S], [b_S^T, ||Y||^2]]``. Why this
form: it is a quadratic in the coefficients, so every subset has a closed-form optimum and the
relaxation bounds of the search are exact least-squares values; re-solving the coefficients lets a
kept expert stand in for a pruned one whose outputs resemble its own (redundancy counts, not only
size). The coefficients only *select* the subset: the pruned checkpoint keeps the experts' weights
as they are and its router routes top-k over the kept experts (``c`` would be a global rescaling
that the router's per-token weights do not reproduce). What the pruned layer really loses is
measured by :func:`pruned_layer_error`, on the same footing for every method.

``D`` is non-increasing in S (a larger set of columns never fits worse), which makes the
relaxation bound of the search admissible.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from moejax.prune.calibration import LayerData

# Relative ridge added to the Gram's diagonal, so that exactly collinear experts (e.g. two copies)
# still give a solvable system; far below the float32 noise of the Gram itself.
RIDGE = 1e-9


@jax.jit
def expert_outputs(x_td, w_gate_edf, w_up_edf, w_down_efd):
    """Every expert's SwiGLU output on every token, float32 [E, T, d]."""
    h_etf = jax.nn.silu(jnp.einsum("td,edf->etf", x_td, w_gate_edf)) * jnp.einsum("td,edf->etf", x_td, w_up_edf)
    return jnp.einsum("etf,efd->etd", h_etf, w_down_efd)


@jax.jit
def routed_output(f_etd, idx_tk, weight_tk):
    """The routed part of the layer's output: sum_k weight_tk f_{idx_tk}(x_t), [T, d]."""
    t = jnp.arange(idx_tk.shape[0])[:, None]
    return jnp.einsum("tk,tkd->td", weight_tk, f_etd[idx_tk, t])


@dataclasses.dataclass(frozen=True)
class Quadratic:
    """The objective's sufficient statistics, float64: ``gram_ee`` (A^T A), ``b_e`` (A^T Y), ``yy``."""

    gram_ee: np.ndarray
    b_e: np.ndarray
    yy: float

    @property
    def num_experts(self) -> int:
        return int(self.b_e.shape[0])

    def distortion(self, subset) -> float:
        """D(S) = ||Y||^2 - b_S^T G_SS^{-1} b_S (0-size S: ||Y||^2); never below 0."""
        s = np.asarray(sorted(subset), int)
        if s.size == 0:
            return self.yy
        g = self.gram_ee[np.ix_(s, s)]
        g = g + RIDGE * np.trace(g) / s.size * np.eye(s.size)
        b = self.b_e[s]
        return max(self.yy - float(b @ np.linalg.solve(g, b)), 0.0)

    def relative(self, subset) -> float:
        """D(S) / ||Y||^2: 0 perfect, 1 as bad as dropping the routed output."""
        return self.distortion(subset) / max(self.yy, 1e-30)


def quadratic(data: LayerData, f_etd: jax.Array | None = None) -> Quadratic:
    """The :class:`Quadratic` of one layer on its calibration tokens."""
    f_etd = expert_outputs(data.x_td, data.w_gate_edf, data.w_up_edf, data.w_down_efd) if f_etd is None else f_etd
    gram_ee, b_e, yy = _stats(f_etd, jnp.asarray(data.probs_te), jnp.asarray(data.idx_tk), jnp.asarray(data.weight_tk))
    return Quadratic(np.asarray(gram_ee, np.float64), np.asarray(b_e, np.float64), float(yy))


@jax.jit
def _stats(f_etd, probs_te, idx_tk, weight_tk):
    y_td = routed_output(f_etd, idx_tk, weight_tk)
    a_etd = f_etd * probs_te.T[:, :, None]
    gram_ee = jnp.einsum("etd,gtd->eg", a_etd, a_etd)
    return gram_ee, jnp.einsum("etd,td->e", a_etd, y_td), jnp.sum(y_td * y_td)


def min_tokens(num_experts: int, d_model: int) -> int:
    """Calibration tokens the objective needs: the T*d-dimensional columns A_e must be able to be
    independent (T*d >= E) and each expert seen on a few tokens per choice: T >= 4 E."""
    return max(4 * num_experts, -(-num_experts // d_model))


def pruned_routing(probs_te: np.ndarray, keep, top_k: int, renormalize: bool, scaling: float, score_func: str,
                   scores_te: np.ndarray | None = None):
    """Top-k over the kept experts only, as the pruned model's router computes it.

    Softmax scores: the pruned router's softmax runs over the kept logits, i.e. the original
    probabilities renormalised over the kept experts. Sigmoid scores: ``probs_te`` is the scores
    normalised per token, which picks the same top-k; the weights match the pruned model's with
    ``renormalize`` and are off by that per-token factor without it. Selection biases (loss-free,
    ``router_bias``) are not applied unless passed in ``scores_te``. Returns
    (idx_tk into the *original* expert ids, weight_tk). ``scores_te`` (optional) replaces the
    scores that pick the top-k (e.g. with a selection bias added).
    """
    keep = np.asarray(sorted(keep), int)
    if score_func == "softmax":
        kept = probs_te[:, keep] / np.sum(probs_te[:, keep], axis=1, keepdims=True)
    else:
        kept = probs_te[:, keep]  # sigmoid: callers pass the raw scores as probs_te
    choice = kept if scores_te is None else scores_te[:, keep]
    order_tk = np.argsort(-choice, axis=1, kind="stable")[:, :top_k]
    weight_tk = np.take_along_axis(kept, order_tk, axis=1)
    if renormalize:
        weight_tk = weight_tk / np.sum(weight_tk, axis=1, keepdims=True)
    return keep[order_tk].astype(np.int32), (weight_tk * scaling).astype(np.float32)


def pruned_layer_error(data: LayerData, keep, *, top_k: int, renormalize: bool, scaling: float,
                       score_func: str, weights: dict[str, np.ndarray] | None = None) -> float:
    """||Y - Y_pruned||^2 / ||Y||^2 on the layer's tokens: the routed output of the pruned layer
    (top-k over the kept experts, :func:`pruned_routing`; with ``weights``, the kept experts'
    replaced weights, [E, ...] in original ids) against the unpruned layer's."""
    f_etd = expert_outputs(data.x_td, data.w_gate_edf, data.w_up_edf, data.w_down_efd)
    y_td = np.asarray(routed_output(f_etd, jnp.asarray(data.idx_tk), jnp.asarray(data.weight_tk)))
    if weights is not None:
        f_etd = expert_outputs(data.x_td, weights["w_gate_edf"], weights["w_up_edf"], weights["w_down_efd"])
    idx_tk, weight_tk = pruned_routing(data.probs_te, keep, top_k, renormalize, scaling, score_func)
    y2_td = np.asarray(routed_output(f_etd, jnp.asarray(idx_tk), jnp.asarray(weight_tk)))
    return float(np.sum((y_td - y2_td) ** 2) / max(float(np.sum(y_td ** 2)), 1e-30))
