"""The upcycling study's report: paired intervals by the registered rule, the table and the figure
(from the small per-run summaries in ``results/upcycling_v1/summaries``; see
``does_upcycling_beat_dense_and_scratch``)."""

from __future__ import annotations

import json
import os

import numpy as np
from scipy import stats

PHASE2 = ("dense_cont", "copy", "drop")
LABELS = {"dense": "dense (phase 1)", "dense_cont": "(a) dense continued", "copy": "(b) copy-upcycled",
          "drop": "(c) drop-upcycled", "scratch": "(d) MoE from scratch"}


def load_runs(results: str) -> dict[str, dict]:
    folder = os.path.join(results, "summaries")
    runs = {}
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        with open(os.path.join(folder, name)) as f:
            runs[name.removesuffix(".json")] = json.load(f)
    return runs


def paired_interval(diffs: list[float]) -> dict:
    """mean +/- t(0.975, n-1) sd / sqrt(n) of per-seed differences (the registered rule; n >= 2)."""
    d = np.asarray(diffs, float)
    n = len(d)
    half = float(stats.t.ppf(0.975, n - 1) * d.std(ddof=1) / np.sqrt(n)) if n >= 2 else float("nan")
    mean = float(d.mean()) if n else float("nan")
    verdict = "wins" if mean + half < 0 else "loses" if mean - half > 0 else "no difference shown"
    return {"n": n, "mean": mean, "low": mean - half, "high": mean + half, "verdict": verdict if n >= 2 else "n < 2"}


def _final(run: dict) -> dict:
    return run["evals"][-1]


def _routing_tail(run: dict) -> dict:
    tail = run["routing"][int(0.8 * len(run["routing"])):]
    return {"max_vio": float(np.mean([r["max_vio"] for r in tail])),
            "min_share": float(np.mean([r["min_share"] for r in tail]))}


def comparisons(runs: dict, seeds, pairs) -> list[dict]:
    """Final held-out loss A - B per comparison (mean and per domain), over the seeds both have."""
    out = []
    for a, b in pairs:
        have = [s for s in seeds if f"{a}_s{s}" in runs and f"{b}_s{s}" in runs]
        if not have:
            continue
        row = {"comparison": f"{a} - {b}", "seeds": have,
               "eval_loss": paired_interval([_final(runs[f"{a}_s{s}"])["eval_loss"]
                                             - _final(runs[f"{b}_s{s}"])["eval_loss"] for s in have])}
        for domain in _final(runs[f"{a}_s{have[0]}"])["domains"]:
            row[domain] = paired_interval([_final(runs[f"{a}_s{s}"])["domains"][domain]
                                           - _final(runs[f"{b}_s{s}"])["domains"][domain] for s in have])
        out.append(row)
    return out


def how_soon(runs: dict, seeds) -> dict:
    """Per upcycling method, the interval of (method - dense_cont) at each phase-2 point (equal share
    of the additional FLOPs), and the first point from which every later interval is below 0."""
    out = {}
    for method in ("copy", "drop"):
        have = [s for s in seeds if f"{method}_s{s}" in runs and f"dense_cont_s{s}" in runs]
        if not have:
            continue
        points = len(runs[f"dense_cont_s{have[0]}"]["evals"])
        rows = []
        for k in range(1, points):
            diffs = [runs[f"{method}_s{s}"]["evals"][k]["eval_loss"] - runs[f"dense_cont_s{s}"]["evals"][k]["eval_loss"]
                     for s in have]
            rows.append({"fraction": runs[f"dense_cont_s{have[0]}"]["evals"][k]["fraction"], **paired_interval(diffs)})
        first = next((r["fraction"] for i, r in enumerate(rows) if all(x["high"] < 0 for x in rows[i:])), None)
        out[method] = {"points": rows, "first_fraction_ahead_for_good": first}
    return out


def routing(runs: dict, seeds) -> dict:
    out = {}
    for arm in ("copy", "drop", "scratch"):
        tails = [_routing_tail(runs[f"{arm}_s{s}"]) for s in seeds if f"{arm}_s{s}" in runs]
        if tails:
            out[arm] = {key: float(np.mean([t[key] for t in tails])) for key in tails[0]} | {"seeds": len(tails)}
    return out


def plot(runs: dict, seeds, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    colors = {"dense": "black", "dense_cont": "tab:gray", "copy": "tab:blue", "drop": "tab:orange",
              "scratch": "tab:green"}
    for arm, color in colors.items():
        curves = [runs[f"{arm}_s{s}"]["evals"] for s in seeds if f"{arm}_s{s}" in runs]
        if not curves:
            continue
        flops = np.asarray([e["flops"] for e in curves[0]]) / 1e12
        loss = np.asarray([[e["eval_loss"] for e in c] for c in curves])
        left.plot(flops, loss.mean(0), "-o", ms=3, color=color, label=f"{LABELS[arm]} (n={len(curves)})")
        if len(curves) > 1:
            left.fill_between(flops, loss.min(0), loss.max(0), color=color, alpha=0.15)
        if arm in ("copy", "drop", "scratch"):
            present = [runs[f"{arm}_s{s}"] for s in seeds if f"{arm}_s{s}" in runs]
            fraction = np.asarray([r["step"] for r in present[0]["routing"]]) / present[0]["steps"]
            vio = np.mean([[r["max_vio"] for r in run["routing"]] for run in present], axis=0)
            right.plot(fraction, vio, color=color, label=LABELS[arm])
    phase1_end = [runs[f"dense_s{s}"]["evals"][-1]["eval_loss"] for s in seeds if f"dense_s{s}" in runs]
    if phase1_end:  # zoom on the second half: the first steps' drop from ~5.5 would flatten the rest
        left.set_ylim(top=max(phase1_end) + 0.4)
    left.set_xlabel("cumulative training FLOPs (1e12; dense pretraining included)")
    left.set_ylabel("held-out loss, mean of 4 domains (nats/token)")
    left.set_title("held-out loss at equal compute (mean over seeds; band: min-max)")
    left.legend(fontsize=8)
    right.set_xlabel("fraction of the run's steps")
    right.set_ylabel("MaxVio (per batch, max over layers)")
    right.set_title("routing balance (mean over seeds)")
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _fmt(iv: dict) -> str:
    if iv["n"] < 2:
        return f"{iv['mean']:+.4f} (1 seed: no interval)"
    return f"{iv['mean']:+.4f} [{iv['low']:+.4f}, {iv['high']:+.4f}] {iv['verdict']}"


def report(results: str, seeds, arms, pairs) -> str:
    """Writes table.json, report.md and curves.png from the summaries present; returns report.md."""
    runs = load_runs(results)
    expected = [f"{name}_s{s}" for s in seeds for name in ("dense", *arms)]
    missing = [name for name in expected if name not in runs]
    table = {"missing_runs": missing, "comparisons": comparisons(runs, seeds, pairs),
             "how_soon": how_soon(runs, seeds), "routing": routing(runs, seeds),
             "final_eval_loss": {name: _final(run)["eval_loss"] for name, run in runs.items()}}
    with open(os.path.join(results, "table.json"), "w") as f:
        json.dump(table, f, indent=1)
    complete = [s for s in seeds if all(f"{name}_s{s}" in runs for name in ("dense", *arms))]
    if runs:  # the seeds that have every run, so each curve averages the same seeds
        plot(runs, complete or list(seeds), os.path.join(results, "curves.png"))
    lines = ["# Upcycling study: report", "",
             f"Runs present: {len(runs)} of {len(expected)}" + (f"; missing: {', '.join(missing)}" if missing else "")
             + f". Seeds with every run (the figure's): {complete}", "",
             "## Final held-out loss, A - B (paired by seed, 95% t interval; negative: A better)", "",
             "| comparison | seeds | mean of domains | " + " | ".join(
                 k for k in (table["comparisons"][0] if table["comparisons"] else {}) if k not in
                 ("comparison", "seeds", "eval_loss")) + " |"]
    lines.append("|---" * (3 + max(0, len(table["comparisons"][0]) - 3 if table["comparisons"] else 0)) + "|")
    for row in table["comparisons"]:
        domains = [k for k in row if k not in ("comparison", "seeds", "eval_loss")]
        lines.append(f"| {row['comparison']} | {len(row['seeds'])} | {_fmt(row['eval_loss'])} | "
                     + " | ".join(_fmt(row[d]) for d in domains) + " |")
    lines += ["", "## How soon: (method - dense continued) at each share of the additional FLOPs", ""]
    for method, result in table["how_soon"].items():
        lines.append(f"- {method}: " + "; ".join(f"{p['fraction']:.1f}: {_fmt(p)}" for p in result["points"])
                     + f". Ahead for good from: {result['first_fraction_ahead_for_good']}")
    lines += ["", "## Routing health (last 20% of logged steps, mean over seeds)", ""]
    for arm, r in table["routing"].items():
        lines.append(f"- {arm}: MaxVio {r['max_vio']:.3f}, smallest expert's share {r['min_share']:.4f} "
                     f"(uniform 1/E = {1 / 8:.4f}; {r['seeds']} seeds)")
    text = "\n".join(lines) + "\n"
    with open(os.path.join(results, "report.md"), "w") as f:
        f.write(text)
    return text
