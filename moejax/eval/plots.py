"""Curves over a run's checkpoints: held-out loss, bits per byte and benchmark scores vs step."""

from __future__ import annotations

import os
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; no display needed
import matplotlib.pyplot as plt  # noqa: E402

from moejax.eval.evaluate import benchmark_score  # noqa: E402


def plot_curves(results: list[dict[str, Any]], path: str) -> str:
    """Three panels (loss, bits per byte per domain; score per task) into the PNG ``path``."""
    results = sorted(results, key=lambda r: r["step"])
    steps = [r["step"] for r in results]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for domain in results[-1]["losses"]["domains"]:
        axes[0].plot(steps, [r["losses"]["domains"][domain]["loss"] for r in results], "o-", label=domain)
        axes[1].plot(steps, [r["losses"]["domains"][domain]["bits_per_byte"] for r in results], "o-", label=domain)
    for task in results[-1]["benchmarks"]:
        scores = [benchmark_score(r["benchmarks"][task]) if task in r["benchmarks"] else float("nan") for r in results]
        axes[2].plot(steps, scores, "o-", label=task)
    titles = ("held-out loss (nats/token)", "bits per byte", "benchmark accuracy / exact match")
    for ax, title in zip(axes, titles):
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
