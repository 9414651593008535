"""``recommendation.md`` and its figure: one page a user reads before training a mixture."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np


def _w(weights: Mapping[str, float]) -> str:
    return ", ".join(f"{d} {v:.3f}" for d, v in weights.items())


def candidates(result: Mapping[str, Any]) -> list[tuple[str, float, float, float]]:
    """(name, predicted mean, lo, hi) of the law's robust pick and every baseline the members scored."""
    r = result.get("robust")
    if not r:
        return []
    out = [(f"robust pick ({result['decision']['best_law']})", r["predicted"]["mean"], r["predicted"]["lo"],
            r["predicted"]["hi"])]
    out += [(n, o["mean_pred"], o["pred_lo"], o["pred_hi"]) for n, o in r["odds"].items()]
    return out


def plot_recommendation(result: Mapping[str, Any], path: str | os.PathLike) -> Path | None:
    """Predicted target loss (members' mean, 90% interval) of the pick and each baseline; the
    recommended mixture drawn in red. None (no file) when no law was fitted."""
    from data_mixture.plots import _plt, _save

    rows = candidates(result)
    if not rows:
        return None
    plt = _plt()
    chosen = result["source"].split(" ")[0]
    fig, ax = plt.subplots(figsize=(6.4, 0.35 * len(rows) + 1.2))
    for i, (name, m, lo, hi) in enumerate(rows):
        hit = name.startswith("robust") and result["decision"]["choice"] == "law" or name == chosen
        ax.errorbar([m], [i], xerr=[[m - lo], [hi - m]], fmt="o", color="tab:red" if hit else "tab:blue", capsize=3)
    ax.set_yticks(range(len(rows)), [r[0] for r in rows])
    ax.invert_yaxis()
    ax.set_xlabel(f"predicted target loss at N = {result['target']['size']:.3g}, D = {result['target']['tokens']:.3g} "
                  f"({result['robust']['members']} bootstrap members; 90%)", fontsize=8)
    ax.set_title(f"recommended: {result['source']}", fontsize=9)
    ax.grid(axis="x", alpha=0.3)
    return _save(fig, path)


def _acc_table(result: Mapping[str, Any]) -> list[str]:
    lines = ["| method | kind | held-out decision accuracy |", "|---|---|---|"]
    for kind in ("laws", "baselines"):
        for n, a in result["decision_accuracy"][kind].items():
            lines.append(f"| {n} | {kind[:-1]} | {'skipped' if a is None else f'{a:.2f}'} |")
    return lines


def recommendation_md(result: Mapping[str, Any]) -> str:
    """The one-page report (see :mod:`data_mixture.recommendation`)."""
    t, d = result["target"], result["decision"]
    aim = t["target"]["text"] if t.get("target") else "the mean validation loss"
    lines = [f"# Recommended mixture: {result['source']}", "",
             f"Target: {aim}, at {t['size_column']} = {t['size']:.4g} and {t['tokens']:.4g} tokens"
             + (f"; pools {', '.join(f'{k} {v:.4g}' for k, v in t['unique_tokens'].items())}" if t["unique_tokens"] else "")
             + ".", "", "| domain | weight |", "|---|---|"]
    lines += [f"| {k} | {v:.4f} |" for k, v in result["weights"].items()]
    lines += ["", f"**Why:** {d['why']}. Decisions scored with {result['holdout']}.", ""]
    r = result.get("robust")
    if r:
        lines += [f"**{d['best_law']}'s robust pick** ({r['robust']} over {r['members']} bootstrap members): "
                  f"{_w(r['weights'])}; predicted target loss {r['predicted']['mean']:.4f} "
                  f"[{r['predicted']['lo']:.4f}, {r['predicted']['hi']:.4f}]; "
                  f"{r['agreement']['share']:.0%} of members' own optima within {r['agreement']['tv']:g} total variation "
                  "of it.", "", "| against | P(pick beats it) | pick minus it (median) | 90% interval | its mixture |",
                  "|---|---|---|---|---|"]
        lines += [f"| {n} | {o['p_beats']:.0%} | {o['median']:+.4f} | [{o['lo']:+.4f}, {o['hi']:+.4f}] | {_w(o['weights'])} |"
                  for n, o in r["odds"].items()]
        lines += [""] + [f"- warning: {w}" for w in r["warnings"]] + ["", "![predicted target loss](recommendation.png)", ""]
    lines += ["Held-out decision accuracy (pairs of mixtures ordered as observed; laws fitted without the held-out cells):",
              ""] + _acc_table(result) + [""]
    skipped = {**result["laws_skipped"], **result["laws_scored_skipped"]}
    if skipped:
        lines += ["Laws not scored: " + "; ".join(f"{n} ({why})" for n, why in skipped.items()), ""]
    lines += ["Train it (runs as printed, from any directory; it trains the config's model for the target's tokens):", "",
              "```bash", result.get("command", ""), "```", "",
              "The odds are the fitted law's, over its bootstrap members: predictions, not trained results."]
    return "\n".join(lines) + "\n"


def summary_lines(result: Mapping[str, Any]) -> list[str]:
    """What the command prints: the pick, its odds against each baseline, the command."""
    from data_mixture.robust import format_robust

    lines = [f"recommended: {result['source']}: {_w(result['weights'])}", f"why: {result['decision']['why']}"]
    if result.get("robust"):
        lines += format_robust(result["robust"])
    acc = result["decision_accuracy"]
    lines.append("held-out decision accuracy: " + ", ".join(
        f"{n} {a:.2f}" for kind in ("laws", "baselines") for n, a in acc[kind].items() if a is not None and np.isfinite(a)))
    if result.get("command"):
        lines.append(f"train with: {result['command']}")
    return lines
