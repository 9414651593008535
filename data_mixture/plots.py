"""Plots for data_mixture (matplotlib, Agg backend: files only, no display needed)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np


def _plt():
    import sys

    import matplotlib

    if "MPLBACKEND" not in os.environ and "ipykernel" not in sys.modules:  # keep a notebook's inline backend
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _methods_with_predictions(report: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    laws = [(n, e) for n, e in report["laws"].items() if "predictions" in e]
    bases = [(f"{n} (baseline)", e) for n, e in report.get("baselines", {}).items() if "predictions" in e]
    return laws + bases


def plot_pred_vs_obs(report: Mapping[str, Any], path: str | os.PathLike) -> Path:
    """One panel per law and per baseline with a loss prediction (one hold-out of
    :func:`data_mixture.evaluate.evaluate_laws`): predicted vs observed held-out loss (cell means
    over seeds), one colour per validation domain, the diagonal for reference."""
    plt = _plt()
    methods = _methods_with_predictions(report)
    fig, axes = plt.subplots(1, max(1, len(methods)), figsize=(3.4 * max(1, len(methods)), 3.5), squeeze=False)
    for ax, (name, e) in zip(axes[0], methods):
        obs = np.asarray(e["predictions"]["observed"])
        pred = np.asarray(e["predictions"]["predicted"])
        for j, d in enumerate(report["loss_domains"]):
            ax.scatter(obs[:, j], pred[:, j], s=14, label=d)
        lo, hi = float(min(obs.min(), pred.min())), float(max(obs.max(), pred.max()))
        ax.plot([lo, hi], [lo, hi], color="k", lw=0.8)
        mre = e["mean"]["mre"]
        ax.set_title(f"{name}: MRE {mre:.3f}" if mre is not None else name, fontsize=9)
        ax.set_xlabel("observed loss")
    axes[0][0].set_ylabel("predicted loss")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"hold-out: {report['holdout']}", fontsize=9)
    return _save(fig, path)


def plot_decision_accuracy(report: Mapping[str, Any], path: str | os.PathLike) -> Path:
    """Decision accuracy on the mean loss with its bootstrap interval, one row per law and
    baseline, one panel per hold-out (a report of one hold-out or of ``holdout="each"``)."""
    plt = _plt()
    reports = report["holdouts"] if "holdouts" in report else [report]
    fig, axes = plt.subplots(1, len(reports), figsize=(4.6 * len(reports), 0.5 + 0.32 * 8), squeeze=False)
    for ax, r in zip(axes[0], reports):
        names, acc, lo, hi, colours = [], [], [], [], []
        for kind, colour in (("laws", "C0"), ("baselines", "C1")):
            for name, e in r[kind].items():
                d = e.get("decision") or {}
                if "skipped" in e or d.get("accuracy") is None:
                    continue
                names.append(name if kind == "laws" else f"{name} (baseline)")
                acc.append(d["accuracy"])
                lo.append(d["accuracy"] - (d["lo"] if d.get("lo") is not None else d["accuracy"]))
                hi.append((d["hi"] if d.get("hi") is not None else d["accuracy"]) - d["accuracy"])
                colours.append(colour)
        y = np.arange(len(names))
        for k in range(len(names)):
            ax.errorbar(acc[k], y[k], xerr=[[lo[k]], [hi[k]]], fmt="o", color=colours[k], capsize=3)
        ax.axvline(0.5, color="grey", lw=0.8, ls=":")
        ax.set_yticks(y, names, fontsize=7)
        ax.invert_yaxis()  # laws on top, in report order
        ax.set_xlim(-0.02, 1.02)
        ax.set_xlabel("decision accuracy (mean loss)")
        ax.set_title(f"held out {r['held_out_size']:.3g}: {r['decision']['mixtures']} mixtures, "
                     f"{r['decision']['pairs_decided']} decided pairs", fontsize=8)
    return _save(fig, path)


def plot_loss_vs_share(table, domain: str, mix_domain: str, path: str | os.PathLike, *, size_column: str = "params_total",
                       fit=None) -> Path:
    """Observed loss of validation ``domain`` against the share of training ``mix_domain``, one colour
    per model size (last checkpoint of each run); with a fit, its prediction along the line from
    the uniform mixture to the pure domain at each size's largest token count."""
    plt = _plt()
    size = table.size(size_column)
    j = table.mix_domains.index(mix_domain)
    v = table.loss_domains.index(domain)
    fig, ax = plt.subplots(figsize=(4.5, 3.4))
    for k, s in enumerate(np.unique(size)):
        sel = size == s
        tmax = table.tokens[sel].max()
        rows = sel & (table.tokens == tmax)
        colour = f"C{k}"
        ax.scatter(table.mix_rm[rows, j], table.loss_rv[rows, v], color=colour, s=18, label=f"N={s:.3g}")
        if fit is not None:
            m = len(table.mix_domains)
            share = np.linspace(0.02, 0.9, 40)
            mix = np.full((40, m), 0.0)
            mix[:] = ((1 - share) / (m - 1))[:, None]
            mix[:, j] = share
            pred = fit.predict_losses(np.full(40, s), np.full(40, tmax), mix)[:, fit.loss_domains.index(domain)]
            ax.plot(share, pred, color=colour, lw=1)
    ax.set_xlabel(f"share of {mix_domain}")
    ax.set_ylabel(f"loss:{domain}")
    ax.legend(fontsize=7)
    return _save(fig, path)


def plot_optimal_vs_size(sizes: Sequence[float], weights_sm: np.ndarray, domains: Sequence[str],
                         path: str | os.PathLike, *, title: str = "") -> Path:
    """Stacked shares of the optimal mixture against model size (log axis)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(4.8, 3.4))
    ax.stackplot(np.asarray(sizes), np.asarray(weights_sm).T, labels=list(domains))
    ax.set_xscale("log")
    ax.set_xlabel("model size")
    ax.set_ylabel("optimal share")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=7, loc="upper left")
    if title:
        ax.set_title(title, fontsize=9)
    return _save(fig, path)


def plot_mixtures_vs_size(sizes_s: np.ndarray, loss_sk: np.ndarray, labels: Sequence[str],
                          path: str | os.PathLike, *, title: str = "") -> Path:
    """Observed loss of every mixture (one line each) against model size, the best at each size
    marked: where the lines cross, the best mixture moves with size."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.2, 3.6))
    for k, label in enumerate(labels):
        ax.plot(sizes_s, loss_sk[:, k], marker="o", ms=3, lw=1, label=label)
    best_s = np.argmin(loss_sk, axis=1)
    ax.scatter(sizes_s, loss_sk[np.arange(len(sizes_s)), best_s], s=80, facecolors="none", edgecolors="k",
               label="best at that size", zorder=3)
    ax.set_xscale("log")
    ax.set_xlabel("model size")
    ax.set_ylabel("held-out loss")
    ax.legend(fontsize=6, ncol=2)
    if title:
        ax.set_title(title, fontsize=9)
    return _save(fig, path)


def plot_bench_curves(loss_r: np.ndarray, acc_r: np.ndarray, curve_loss: np.ndarray, curve_acc: np.ndarray,
                      task: str, path: str | os.PathLike) -> Path:
    """Observed accuracy against the loss that feeds it, with the fitted sigmoid."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(4.2, 3.2))
    ax.scatter(loss_r, acc_r, s=14, label="runs")
    ax.plot(curve_loss, curve_acc, color="k", lw=1, label="fitted law")
    ax.set_xlabel("loss feeding the task")
    ax.set_ylabel(f"bench:{task}")
    ax.legend(fontsize=7)
    return _save(fig, path)


def _save(fig, path: str | os.PathLike) -> Path:
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    _plt().close(fig)
    return path
