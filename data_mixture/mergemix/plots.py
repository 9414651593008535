"""MergeMix plots: best score against merges evaluated, the proxy's score surface, and the rank
consistency scatter (matplotlib, files only)."""

from __future__ import annotations

import itertools
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from data_mixture.plots import _plt


def _save(fig, path: str | os.PathLike) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _plt().close(fig)
    return path


def common_objective(results: Mapping[str, Any]):
    """The calibrated objective every curve is rescored with: the mergemix search's (calibrated on
    its seed design) if there is one, else the first result's."""
    return (results.get("mergemix") or next(iter(results.values()))).objective


def search_curves(results: Mapping[str, Any], path: str | os.PathLike) -> Path:
    """Best evaluated score so far against merges evaluated, one line per search, in one objective's
    units (:func:`common_objective`)."""
    plt = _plt()
    objective = common_objective(results)
    fig, ax = plt.subplots(figsize=(4.8, 3.4))
    for method, res in results.items():
        curve = res.best_so_far(objective)
        ax.plot(np.arange(1, len(curve) + 1), curve, label=f"{method} (best {curve[-1]:.3f})")
        if method == "mergemix":
            seeds = sum(t["phase"] == "seed" for t in res.trace)
            ax.axvline(seeds + 0.5, color="grey", lw=0.6, ls=":")
    ax.set_xlabel("merges evaluated")
    ax.set_ylabel("best objective so far")
    ax.legend(fontsize=8)
    return _save(fig, path)


def surface(result, path: str | os.PathLike, *, grid: int = 41, lo_k: np.ndarray | None = None,
            free: float = 1.0) -> Path:
    """The merge proxy's objective over pairs of domains: one panel per pair (i, j), the plane
    ``alpha_i = a, alpha_j = b`` with the remaining mass ``1 - a - b`` split equally over the other
    domains, coloured by the LightGBM surrogate fitted (as the search fits it) to every evaluated
    merge of ``result``; the evaluated merges are drawn at their (alpha_i, alpha_j), the best one
    as a star. A search run over ``beta`` with floors (``alpha = lo_k + free * beta``, see
    ``pipeline.lower_bounded``) is drawn in merge weights alpha: pass ``lo_k`` and ``free``."""
    from data_mixture.mergemix.search import fit_regressors, predict_score

    plt = _plt()
    objective, domains = result.objective, result.domains
    k = len(domains)
    lo_k = np.zeros(k) if lo_k is None else np.asarray(lo_k, np.float64)
    alpha_nk = np.array([t["alpha"] for t in result.trace])
    terms = [objective.normalised_terms(t["metrics"]) for t in result.trace]
    boosters = fit_regressors(alpha_nk, {key: np.array([t[key] for t in terms]) for key in terms[0]}, seed=0)
    scores = np.array([t["score"] for t in result.trace])
    pairs = list(itertools.combinations(range(k), 2)) if k > 2 else [(0, 1)]
    cols = min(3, len(pairs))
    rows = -(-len(pairs) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 3.2 * rows), squeeze=False)
    a_g = np.linspace(0.0, 1.0, grid)
    aa, bb = np.meshgrid(a_g, a_g, indexing="xy")
    inside = aa + bb <= 1.0 + 1e-9
    for ax, (i, j) in zip(axes.flat, pairs):
        plane = np.zeros((inside.sum(), k))
        plane[:, i], plane[:, j] = aa[inside], bb[inside]
        others = [m for m in range(k) if m not in (i, j)]
        if others:
            plane[:, others] = ((1.0 - plane[:, i] - plane[:, j]) / len(others))[:, None]
        z = np.full(aa.shape, np.nan)
        z[inside] = predict_score(boosters, objective, plane)
        shown_i, shown_j = lo_k[i] + free * alpha_nk[:, i], lo_k[j] + free * alpha_nk[:, j]
        mesh = ax.pcolormesh(lo_k[i] + free * aa, lo_k[j] + free * bb, z, shading="auto", cmap="viridis")
        ax.scatter(shown_i, shown_j, c=scores, cmap="viridis", edgecolors="w", s=16, linewidths=0.5)
        best = int(np.argmax(scores))
        ax.scatter([shown_i[best]], [shown_j[best]], marker="*", s=120, c="r")
        ax.set_xlabel(f"alpha {domains[i]}")
        ax.set_ylabel(f"alpha {domains[j]}")
        fig.colorbar(mesh, ax=ax, shrink=0.8)
    for ax in list(axes.flat)[len(pairs):]:
        ax.axis("off")
    floors = f"; alpha >= {', '.join(f'{v:g}' for v in lo_k)}" if lo_k.any() else ""
    fig.suptitle(f"{result.method}: surrogate objective (others share the rest equally{floors})", fontsize=9)
    return _save(fig, path)


def rank_scatter(proxy: Mapping[str, float], trained: Mapping[str, float], path: str | os.PathLike, *,
                 xlabel: str, ylabel: str, title: str) -> Path:
    """One point per mixture: the proxy's value against the trained model's, labelled."""
    plt = _plt()
    names = sorted(set(proxy) & set(trained))
    fig, ax = plt.subplots(figsize=(4.2, 3.6))
    x, y = [proxy[n] for n in names], [trained[n] for n in names]
    ax.scatter(x, y, s=18)
    for n, xi, yi in zip(names, x, y):
        ax.annotate(n, (xi, yi), fontsize=6, xytext=(2, 2), textcoords="offset points")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    return _save(fig, path)
