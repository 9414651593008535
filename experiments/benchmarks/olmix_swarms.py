"""The laws on real swarms made by others: 5-fold out-of-fold Spearman and regret@1 on Olmix's swarms.

    ./launch.sh python -m experiments.benchmarks.olmix_swarms [--tables dclm,full_recomputation]
        [--targets mean_bpb,family_math,family_code,family_qa] [--folds 5] [--seed 0]
        [--out experiments/benchmarks/results/olmix_swarms]

Reads the converted tables (``experiments/tools/olmix_swarms.py``: 127 runs x 24 DCLM topics and
512 runs x 64 domains, one 30M size, BPB on 110 tasks, and the aggregates Olmix optimises) and
writes ``oof_<table>.json`` for each table and ``oof.md`` (every table's JSON found) beside them.

Protocol: the runs are split into ``--folds`` folds (a seeded permutation); every method is fitted
(or set up) on the other folds and scores the fold's runs. Per fold: the Spearman correlation
between the method's prediction (or score; lower = predicted better) and the true target over the
fold's runs, and regret@1 = the true target of the fold's predicted-best run minus the fold's best
true target (BPB; 0 when the method picks the fold's best run). Reported: the mean over folds with
a 95 % interval (Student t over the folds: mean +- t_{0.975, k-1} sd / sqrt(k)), the folds' range,
and the pooled out-of-fold Spearman (every run's prediction from the fold that held it out, one
Spearman over all runs: Marin's "OOF Spearman"). MAE for the methods that predict a loss.

Methods:

* every registered law that fits one model size (``Law.min_sizes() == 1``: ``log_linear``,
  ``regmix``, ``regmix_linear``), point fits (no bootstrap), seed 0, the target as the fit's one
  validation domain;
* every baseline of ``data_mixture.baselines`` that applies (``compute_baselines`` on the fold's
  training and held-out runs; the others are listed with the reason they were skipped): the
  practitioner rules ``proxy_capped_4`` / ``proxy_capped_16`` (the best training run's mixture,
  capped at K epochs of each pool; these tables record no pools, so no cap binds and both are
  the same; held-out runs ranked by total variation distance to it) and ``uniform``;
  ``target_capped_*`` does not apply to a held-out target (the BPB tasks weight no training
  domain), ``best_at_proxy`` and ``trend`` need a smaller size, ``proportional`` and ``unimax`` pools;
* ``nearest_run``: a held-out run's target predicted as that of the nearest training run (L1 on
  the simplex), what ``best_at_proxy`` becomes at one size.

Published figures, beside ours in ``oof.md``: Olmix (arXiv 2602.12237) reports rank correlations
above 0.89 between proxies of 15M parameters and more and 1B targets -- a proxy-to-target
correlation of mixture rankings, a different quantity from an out-of-fold fit; Marin
(marin-community/marin issue 6611) reports an out-of-fold Spearman of 0.918 (its DSP regression,
280 runs at 300M, a 51-task macro BPB) and 0.380 for the paper-faithful Olmix log-linear fit on
the same target.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import time
import warnings
from pathlib import Path

import numpy as np
import scipy.stats

from data_mixture.baselines import build_cells, compute_baselines
from data_mixture.laws import LAWS, get_law
from data_mixture.table import RunsTable, read_runs
from data_mixture.target import resolve
from experiments.benchmarks.timing import write_json

RESULTS = Path("experiments/benchmarks/results/olmix_swarms")
TABLES = ("dclm", "full_recomputation")
TARGETS = ("mean_bpb", "family_math", "family_code", "family_qa")
PUBLISHED = [
    {"source": "Olmix (Chen et al. 2026, arXiv 2602.12237)", "figure": "rank correlation > 0.89",
     "what": "Spearman between the mixture rankings of proxies of 15M+ parameters and of 1B targets (1M proxies: 0.73); "
             "not an out-of-fold fit of a regression", "comparable": False},
    {"source": "Marin (marin-community/marin issue 6611)", "figure": "OOF Spearman 0.918, fold mean regret@1 0.00739",
     "what": "its effective-exposure DSP regression, 280 runs at 300M, target: mean of 51 OLMoBaseEval Easy BPB tasks",
     "comparable": True},
    {"source": "Marin (marin-community/marin issues 6608, 6611)", "figure": "OOF Spearman 0.380",
     "what": "paper-faithful Olmix log-linear fit (Huber delta 0.02) on the same 51-task target and runs", "comparable": True},
]


# -- scoring (pure functions; tests/test_dm_olmix.py checks them on hand-made cases) ------------------
def folds(n: int, k: int, seed: int) -> list[np.ndarray]:
    """``k`` disjoint index arrays covering range(n), from a seeded permutation (sizes differ by <= 1)."""
    if not 2 <= k <= n:
        raise ValueError(f"folds: need 2 <= k <= n, got k={k}, n={n}")
    perm = np.random.default_rng(np.random.SeedSequence([int(seed), 0x0F])).permutation(n)
    return [np.sort(a) for a in np.array_split(perm, k)]


def fold_scores(y: np.ndarray, score: np.ndarray) -> dict[str, float]:
    """Spearman(score, y) and regret@1 = y[argmin score] - min y (ties in score: the first run)."""
    y, score = np.asarray(y, np.float64), np.asarray(score, np.float64)
    rho = scipy.stats.spearmanr(score, y)[0] if np.ptp(score) > 0 else float("nan")
    return {"spearman": float(rho), "regret": float(y[int(np.argmin(score))] - y.min())}


def interval(values, level: float = 0.95, floor: float = -math.inf) -> dict[str, float]:
    """Mean over folds, its Student-t interval (``level``; its lower end no lower than ``floor``:
    regret cannot be negative), min and max; NaNs ignored."""
    v = np.asarray([x for x in values if np.isfinite(x)], np.float64)
    if len(v) == 0:
        return {"mean": float("nan"), "lo": float("nan"), "hi": float("nan"), "min": float("nan"), "max": float("nan"), "n": 0}
    half = float(scipy.stats.t.ppf(0.5 + level / 2, len(v) - 1) * v.std(ddof=1) / math.sqrt(len(v))) if len(v) > 1 else float("nan")
    return {"mean": float(v.mean()), "lo": float(max(floor, v.mean() - half)), "hi": float(v.mean() + half), "min": float(v.min()),
            "max": float(v.max()), "n": int(len(v))}


# -- methods ---------------------------------------------------------------------------------------
def one_size_laws() -> list[str]:
    """The registered laws that can be fitted on a table of one model size."""
    return [n for n in LAWS if get_law(n).min_sizes() == 1]


def baseline_scores(train: RunsTable, test: RunsTable, target: str) -> tuple[dict[str, tuple[np.ndarray, bool]], dict[str, str]]:
    """({name: (score of each test run, is a loss prediction)}, {name: why skipped}): every baseline
    of ``data_mixture.baselines`` (on the target alone), and ``nearest_run``."""
    train_t, test_t = resolve(target).apply(train), resolve(target).apply(test)
    out: dict[str, tuple[np.ndarray, bool]] = {}
    skipped: dict[str, str] = {}
    held = build_cells(test_t, "params_total")
    row = {r: i for i, r in enumerate(test.run)}
    row_c = np.array([row[runs[0]] for runs in held.runs])  # cells come sorted by key; one run per cell here
    for name, b in compute_baselines(build_cells(train_t, "params_total"), held, test_t.loss_domains, test_t.mix_domains).items():
        if "skipped" in b:
            skipped[name] = b["skipped"]
        else:
            score_r = np.empty(len(test))
            score_r[row_c] = b["rank_c"] if b.get("pred_cv") is None else b["pred_cv"][:, 0]
            out[name] = (score_r, b.get("pred_cv") is not None)
    dist = np.abs(test.mix_rm[:, None, :] - train.mix_rm[None, :, :]).sum(-1)
    out["nearest_run"] = (train.loss(target)[np.argmin(dist, axis=1)], True)
    return out, skipped


def run_table(table: RunsTable, targets, k: int, seed: int, laws, starts: int = 64) -> dict:
    """Out-of-fold scores of every method on one table: {method: {target: {...}}}."""
    idx = folds(len(table), k, seed)
    pred: dict[str, dict[str, np.ndarray]] = {}
    per_fold: dict[str, dict[str, list[dict]]] = {}
    is_pred: dict[str, bool] = {}
    fit_seconds: dict[str, float] = {}
    skipped: dict[str, str] = {}

    def record(name, target, test_i, score, prediction):
        pred.setdefault(name, {}).setdefault(target, np.full(len(table), np.nan))[test_i] = score
        per_fold.setdefault(name, {}).setdefault(target, []).append(fold_scores(table.loss(target)[test_i], score))
        is_pred[name] = prediction

    for f, test_i in enumerate(idx):
        train_i = np.setdiff1d(np.arange(len(table)), test_i)
        train, test = table.take(train_i), table.take(test_i)
        for law in laws:
            t0 = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # one size: no size trend to warn about here
                fits = get_law(law).fit_domains(train, list(targets), seed=seed, starts=starts)
                for t in targets:
                    record(law, t, test_i, fits[t].predict(test.params_total, test.tokens, test.mix_rm), True)
            fit_seconds[law] = fit_seconds.get(law, 0.0) + time.perf_counter() - t0
            print(f"  fold {f + 1}/{k} {law}: {time.perf_counter() - t0:.1f} s", flush=True)
        for t in targets:
            scores, why = baseline_scores(train, test, t)
            skipped.update(why)
            for name, (score, prediction) in scores.items():
                record(name, t, test_i, score, prediction)
    methods: dict[str, dict] = {}
    for name in pred:
        methods[name] = {"predicts_loss": is_pred[name], "fit_seconds_total": round(fit_seconds.get(name, 0.0), 2), "targets": {}}
        for t in targets:
            y, s = table.loss(t), pred[name][t]
            entry = {
                "spearman": interval([d["spearman"] for d in per_fold[name][t]]),
                "regret": interval([d["regret"] for d in per_fold[name][t]], floor=0.0),
                "pooled_spearman": float(scipy.stats.spearmanr(s, y)[0]),
                "folds": per_fold[name][t],
            }
            if is_pred[name]:
                entry["mae"] = float(np.mean(np.abs(s - y)))
            methods[name]["targets"][t] = entry
    return {"methods": methods, "skipped": skipped}


# -- report ----------------------------------------------------------------------------------------
def _cell(d: dict, fmt: str) -> str:
    return f"{d['mean']:{fmt}} [{d['lo']:{fmt}}, {d['hi']:{fmt}}]" if d["n"] else "-"


def markdown(results: list[dict]) -> str:
    """The report of one or more per-table results (``oof_<table>.json``)."""
    lines = ["# Olmix swarms: out-of-fold scores", "",
             "Spearman and regret@1 (BPB): mean over folds [95 % t interval; regret's lower end at 0 at least]; pooled: one "
             "Spearman over every run's out-of-fold prediction. Laws: point fits, seed 0. Best mean Spearman in bold.", ""]
    for result in results:
        for name, res in result["tables"].items():
            methods = res["methods"]
            meta = result["table_shapes"][name]
            lines += [f"## {name} ({meta['runs']} runs, {meta['mix_domains']} domains)", "",
                      f"{result['folds']} folds (seed {result['seed']}), {result['starts']} random starts per parametric fit; commit "
                      f"{result['commit']}, {result['date']}; load average {result['load_avg'][0]:.1f} -> {result['load_avg'][1]:.1f} "
                      f"on {result['machine']['cpus']} shared cores.", ""]
            for t in result["targets"]:
                best = max(methods[m]["targets"][t]["spearman"]["mean"] for m in methods)
                lines += [f"### {t}", "", "| method | Spearman per fold | pooled | regret@1 (BPB) | MAE |", "|---|---|---:|---|---:|"]
                for m in sorted(methods, key=lambda m: -methods[m]["targets"][t]["spearman"]["mean"]):
                    e = methods[m]["targets"][t]
                    mark = "**" if e["spearman"]["mean"] == best else ""
                    mae = f"{e['mae']:.4f}" if "mae" in e else "-"
                    lines.append(f"| {mark}{m}{mark} | {_cell(e['spearman'], '.3f')} | {e['pooled_spearman']:.3f} | "
                                 f"{_cell(e['regret'], '.4f')} | {mae} |")
                lines.append("")
            lines += ["Skipped baselines (the reason, as `data_mixture.baselines` gives it):", ""]
            lines += [f"- {k}: {v}" for k, v in res["skipped"].items()] + [""]
    lines += ["## Published figures", "", "| source | figure | what it measures | same quantity as ours? |", "|---|---|---|---|"]
    for p in PUBLISHED:
        lines.append(f"| {p['source']} | {p['figure']} | {p['what']} | {'yes (another swarm)' if p['comparable'] else 'no'} |")
    return "\n".join(lines) + "\n"


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tables", default=",".join(TABLES))
    ap.add_argument("--targets", default=",".join(TARGETS))
    ap.add_argument("--laws", default=None, help="comma-separated (default: every law that fits one size; '' for the baselines alone)")
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--starts", type=int, default=64, help="random starts of the parametric laws (log_linear adds its 5 least-squares starts)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    laws = [x for x in args.laws.split(",") if x] if args.laws is not None else one_size_laws()
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.tables.split(","):
        table = read_runs(RESULTS / f"{name}_runs.csv")
        print(f"{name}: {len(table)} runs x {len(table.mix_domains)} domains", flush=True)
        load0 = os.getloadavg()[0]
        result = {"commit": _commit(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "folds": args.folds,
                  "seed": args.seed, "starts": args.starts, "targets": args.targets.split(","), "laws": laws,
                  "machine": {"cpus": os.cpu_count(), "platform": platform.platform()}, "published": PUBLISHED,
                  "table_shapes": {name: {"runs": len(table), "mix_domains": len(table.mix_domains)}},
                  "tables": {name: run_table(table, args.targets.split(","), args.folds, args.seed, laws, args.starts)}}
        result["load_avg"] = [round(load0, 2), round(os.getloadavg()[0], 2)]
        write_json(args.out / f"oof_{name}.json", result, indent=1)
    results = [json.loads((args.out / f"oof_{n}.json").read_text()) for n in TABLES if (args.out / f"oof_{n}.json").exists()]
    (args.out / "oof.md").write_text(markdown(results))
    print(markdown(results))
    return {"results": results}


if __name__ == "__main__":
    main()
