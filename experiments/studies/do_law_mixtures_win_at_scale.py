"""The real mixture sweep on the built-in corpus, and its scale-up verification.

One command reproduces everything under ``experiments/studies/results/builtin_v1/`` (small files only;
checkpoints stay under ``--root``)::

    nice -n 5 .venv/bin/python -m experiments.studies.do_law_mixtures_win_at_scale --root sweeps/builtin_v1 \\
        --out experiments/studies/results/builtin_v1

Stages, each resumable (a stage whose output exists is not redone; the sweep runner itself skips
finished runs and resumes interrupted ones, so rerunning the command after an interruption
continues where it stopped):

1. **plan** with ``python -m data_mixture plan``: proxy sizes ``s0``, ``s0b``, ``s1`` (54k, 115k,
   191k active parameters; experiments/studies/do_laws_predict_larger_sizes.py), ``--mixtures`` mixtures per size, each
   run trained on ``TOKENS_PER_PARAM`` x its active parameters (so larger proxies also see more
   data, as in a compute-optimal ladder, and a larger model is not handicapped by a token budget
   sized for the smallest), evaluated at ``CHECKPOINTS`` evenly spaced checkpoints. The budget is
   set to exactly what that allocation costs, so the planner's simulation only picks among
   equivalent allocations and records its predicted extrapolation error.
2. **sweep** with ``python -m data_mixture sweep`` (local backend): training, ``moejax.eval`` of
   every checkpoint (held-out losses + benchmarks), the runs table ``runs.csv``.
3. **laws**: every law fitted on the whole table with both size columns (``fits/``), the
   leave-one-scale-out comparison (``loso_params_active/``, ``loso_params_total/``), and the
   optimal mixture against model size for each law (``optimal_vs_size.json`` and plots).
4. **targets**: the target size ``s2`` (600k active, 3.1x the largest proxy) trained on (a)
   CAMEL's optimal mixture, (b) the optimal mixture of the best scale-independent law (the
   better of ``additive`` and ``regmix_linear`` under leave-one-scale-out), (c) the uniform
   mixture, (d) the best proxy-scale mixture (lowest observed mean loss at ``s1``) taken as is;
   same seed and tokens (``TOKENS_PER_PARAM`` x N), ``--target-seeds`` seeds.
5. **report** ``report.md``: the law tables, the optimum against size, the target comparison and
   every law's predicted vs observed target losses.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from experiments.studies.do_laws_predict_larger_sizes import SIZES
from experiments.studies import EVAL_WINDOWS

DOMAINS = ("code", "prose", "math", "knowledge")
PROXIES = ("s0", "s0b", "s1")
TARGET = "s2"
TOKENS_PER_PARAM = 3.0  # tokens per active parameter, every run (proxies and targets)
CHECKPOINTS = 3
BATCH, SEQ_LEN = 16, 128
BOUNDS = (0.05, 0.55)
LOSS_BATCHES = 4  # held-out batches of 16 x 128 tokens per domain and checkpoint
LAWS = ("mixing_law", "additive", "regmix", "regmix_linear", "camel")
SCALE_INDEPENDENT = ("additive", "regmix_linear")  # mixture_moves_with_scale = False
SIZE_COLUMNS = ("params_active", "params_total")


def log(out: Path, message: str) -> None:
    line = f"{time.strftime('%H:%M:%S', time.gmtime())} {message}"
    print(line, flush=True)
    with open(out / "sweep.log", "a") as f:
        f.write(line + "\n")


def run(cmd: list[str], out: Path) -> float:
    """Runs ``cmd`` (output to the terminal), logs it and its wall time; raises on failure."""
    log(out, "$ " + " ".join(cmd))
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True)
    seconds = time.perf_counter() - t0
    log(out, f"  took {seconds:.0f} s")
    return seconds


def record_time(out: Path, stage: str, seconds: float) -> None:
    path = out / "timings.json"
    times = json.loads(path.read_text()) if path.exists() else {}
    times[stage] = times.get(stage, 0.0) + seconds
    path.write_text(json.dumps(times, indent=1))


def sizes_of(names) -> dict[str, dict[str, float]]:
    from data_mixture.plan import preset_sizes

    return preset_sizes({n: SIZES[n] for n in names})


def stage_plan(out: Path, mixtures: int, seed: int) -> None:
    if (out / "plan.json").exists():
        return
    sizes = sizes_of(PROXIES + (TARGET,))
    per_mixture = sum(6.0 * sizes[n]["params_active"] * TOKENS_PER_PARAM * sizes[n]["params_active"] for n in PROXIES)
    presets = out / "presets.json"
    presets.write_text(json.dumps({n: SIZES[n] for n in PROXIES}, indent=1))
    target_n = sizes[TARGET]["params_active"]
    lo, hi = BOUNDS
    cmd = [sys.executable, "-m", "data_mixture", "plan", "--budget-flops", f"{mixtures * per_mixture * 1.001:.6g}",
           "--target-size", f"{target_n:g}", "--target-tokens", f"{TOKENS_PER_PARAM * target_n:g}",
           "--presets", str(presets), "--tokens-per-param", f"{TOKENS_PER_PARAM:g}",
           "--domains", ",".join(DOMAINS), "--min-weight", *[f"{d}={lo}" for d in DOMAINS],
           "--max-weight", *[f"{d}={hi}" for d in DOMAINS], "--batch", str(BATCH), "--seq-len", str(SEQ_LEN),
           "--checkpoints", str(CHECKPOINTS), "--min-sizes", str(len(PROXIES)), "--min-runs-per-size", str(mixtures), "--seed", str(seed),
           "--no-progress", "--out", str(out / "plan.json")]
    record_time(out, "plan", run(cmd, out))


def stage_sweep(plan: Path, root: Path, table: Path, out: Path, parallel: int, max_items: int, stage: str) -> None:
    cmd = [sys.executable, "-m", "data_mixture", "sweep", "--plan", str(plan), "--root", str(root),
           "--parallel", str(parallel), "--retries", "2", "--wait-others", "--eval-args", f"--max-items {max_items} --loss-batches {LOSS_BATCHES}"]
    record_time(out, stage, run(cmd, out))
    shutil.copyfile(root / "runs.csv", table)


def stage_laws(out: Path, bootstrap: int, seed: int) -> dict[str, Any]:
    """Fits, leave-one-scale-out per size column, and the optimum against size (cached in JSON)."""
    from data_mixture.evaluate import evaluate_laws, format_report
    from data_mixture.fit import Fit, fit_table
    from data_mixture.optimize import Constraints, optimize_mixture
    from data_mixture.plots import plot_optimal_vs_size, plot_pred_vs_obs
    from data_mixture.table import read_runs

    table = read_runs(out / "runs.csv")
    t0 = time.perf_counter()
    loso = {}
    for col in SIZE_COLUMNS:
        d = out / f"loso_{col}"
        if not (d / "evaluation.json").exists():
            log(out, f"leave-one-scale-out, size column {col}")
            report = evaluate_laws(table, LAWS, holdout="largest", size_column=col, seed=seed)
            d.mkdir(exist_ok=True)
            (d / "evaluation.json").write_text(json.dumps(report, indent=1))
            (d / "evaluation.md").write_text(format_report(report) + "\n")
            plot_pred_vs_obs(report, d / "pred_vs_obs.png")
        loso[col] = json.loads((d / "evaluation.json").read_text())
    fits_dir = out / "fits"
    fits_dir.mkdir(exist_ok=True)
    for law in LAWS:
        for col in SIZE_COLUMNS:
            path = fits_dir / f"{law}.{col}.json"
            if not path.exists():
                log(out, f"fit {law} on every row, size column {col}")
                fit_table(table, law, size_column=col, bootstrap=bootstrap, seed=seed, progress=False).save(path)
    plot_observed_vs_size(table, out / "observed_vs_size.png")
    opt_path = out / "optimal_vs_size.json"
    if not opt_path.exists():
        sizes = sizes_of(PROXIES + (TARGET,))
        # Optimise inside the region the proxies covered (the plan's bounds): outside it every law
        # extrapolates in the mixture as well as in size.
        inside = Constraints(min_weight={d: BOUNDS[0] for d in DOMAINS}, max_weight={d: BOUNDS[1] for d in DOMAINS})
        result: dict[str, Any] = {"sizes": {n: sizes[n] for n in sizes}, "tokens_per_param": TOKENS_PER_PARAM,
                                  "bounds": list(BOUNDS), "laws": {}}
        for law in LAWS:
            fit = Fit.load(fits_dir / f"{law}.params_active.json")
            per = {}
            for name, s in sizes.items():
                n = s["params_active"]
                r = optimize_mixture(fit, size=n, tokens=TOKENS_PER_PARAM * n, constraints=inside, bootstrap=False,
                                     seed=seed)
                per[name] = r["weights"]
            result["laws"][law] = per
            w_sm = np.array([[per[n][d] for d in DOMAINS] for n in sizes])
            plot_optimal_vs_size([sizes[n]["params_active"] for n in sizes], w_sm, DOMAINS,
                                 out / f"optimal_vs_size_{law}.png", title=f"{law}: optimal mixture vs active size")
        opt_path.write_text(json.dumps(result, indent=1))
    record_time(out, "laws", time.perf_counter() - t0)
    return {"loso": loso, "optimal": json.loads(opt_path.read_text())}


def plot_observed_vs_size(table, path: Path) -> None:
    """Each mixture's mean held-out loss at its last checkpoint against active size."""
    from data_mixture.plots import plot_mixtures_vs_size

    last = np.array([table.tokens[i] == table.tokens[table.run == r].max() for i, r in enumerate(table.run)])
    t = table.take(last)
    mixture_r = np.array([r.split("_", 1)[1] for r in t.run])  # "<preset>_m<k>": the same k, the same mixture
    sizes_s = np.unique(t.size("params_active"))
    labels = sorted(set(mixture_r), key=lambda m: int(m[1:]))
    loss_sk = np.array([[t.loss_rv[(t.size("params_active") == n) & (mixture_r == m)].mean() for m in labels]
                        for n in sizes_s])
    plot_mixtures_vs_size(sizes_s, loss_sk, labels, path, title="mean held-out loss of each mixture (last checkpoint)")


def best_scale_independent(loso: dict[str, Any]) -> str:
    """The scale-independent law with the lowest leave-one-scale-out MAE (params_active)."""
    laws = loso["params_active"]["laws"]
    scored = [(laws[name]["mean"]["mae"], name) for name in SCALE_INDEPENDENT if "mean" in laws.get(name, {})]
    if not scored:
        raise RuntimeError(f"none of {SCALE_INDEPENDENT} could be evaluated: {sorted(laws)}")
    return min(scored)[1]


def target_mixtures(out: Path, laws: dict[str, Any], seed: int) -> dict[str, dict[str, float]]:
    """(a) CAMEL, (b) the best scale-independent law, (c) uniform, (d) the best proxy-scale mixture."""
    from data_mixture.table import read_runs

    opt = laws["optimal"]["laws"]
    table = read_runs(out / "runs.csv")
    largest = table.size("params_active") == table.size("params_active").max()
    last = np.array([table.tokens[i] == table.tokens[table.run == r].max() for i, r in enumerate(table.run)])
    rows = np.flatnonzero(largest & last)
    best = rows[np.argmin(table.loss_rv[rows].mean(axis=1))]
    indep = best_scale_independent(laws["loso"])
    return {
        "camel": opt["camel"][TARGET],
        indep: opt[indep][TARGET],
        "uniform": {d: 1.0 / len(DOMAINS) for d in DOMAINS},
        f"best_{PROXIES[-1]}": {d: float(table.mix_rm[best, j]) for j, d in enumerate(table.mix_domains)},
    }


def target_plan(out: Path, mixtures: dict[str, dict[str, float]], seeds: int) -> Path:
    """A plan (the runner's schema) of the target runs: every mixture x seed, same tokens."""
    path = out / "target_plan.json"
    size = sizes_of((TARGET,))[TARGET]
    steps = math.floor(TOKENS_PER_PARAM * size["params_active"] / (BATCH * SEQ_LEN))
    every = math.ceil(steps / CHECKPOINTS)  # as plan.py: the last checkpoint is the final step
    runs = []
    for seed in range(seeds):
        for label, mix in mixtures.items():
            mix = {d: round(float(w), 6) for d, w in mix.items()}
            overrides = {**SIZES[TARGET], "train.steps": steps, "train.global_batch_size": BATCH,
                         "train.seq_len": SEQ_LEN, "checkpoint.every_steps": every, "train.eval_every": every,
                         "train.seed": seed, "optim.warmup_steps": max(1, steps // 10), "data.mixture": mix,
                         **EVAL_WINDOWS}
            tokens = float(steps * BATCH * SEQ_LEN)
            runs.append({"name": f"{TARGET}_{label}_seed{seed}", "preset": TARGET,
                         "config": "experiments/configs/tiny_moe.py",
                         "overrides": overrides, "mixture": mix, "tokens": tokens, "steps": steps, **size,
                         "flops": 6.0 * size["params_active"] * tokens})
    plan = {"version": 1, "target": {"size": size["params_active"], "size_column": "params_active",
                                      "tokens": TOKENS_PER_PARAM * size["params_active"]},
            "mix_domains": list(DOMAINS), "runs": runs, "total_flops": float(sum(r["flops"] for r in runs)),
            "labels": {label: mix for label, mix in mixtures.items()}}
    path.write_text(json.dumps(plan, indent=1))
    return path


def predictions_at_targets(out: Path) -> dict[str, Any]:
    """Every law's predicted target losses (fit on all proxies) next to the observed ones."""
    from scipy.stats import spearmanr

    from data_mixture.fit import Fit
    from data_mixture.table import read_runs

    obs = read_runs(out / "target_runs.csv")
    final = np.array([obs.tokens[i] == obs.tokens[obs.run == r].max() for i, r in enumerate(obs.run)])
    obs = obs.take(final)
    result: dict[str, Any] = {"runs": obs.run.tolist(), "observed": obs.loss_rv.tolist(),
                              "loss_domains": list(obs.loss_domains), "bench_tasks": list(obs.bench_tasks),
                              "bench": obs.bench_rt.tolist() if obs.bench_rt is not None else [], "laws": {}}
    for law in LAWS:
        for col in SIZE_COLUMNS:
            fit = Fit.load(out / "fits" / f"{law}.{col}.json")
            pred = fit.predict(obs, interval=0.9)
            pred_rv = np.stack([np.asarray(pred[f"pred:{d}"]) for d in obs.loss_domains], axis=1)
            err = np.abs(pred_rv - obs.loss_rv)
            mean_obs_r, mean_pred_r = obs.loss_rv.mean(axis=1), pred_rv.mean(axis=1)
            result["laws"][f"{law}.{col}"] = {
                "predicted": pred_rv.tolist(), "mae": float(err.mean()), "mre": float((err / obs.loss_rv).mean()),
                "predicted_mean": mean_pred_r.tolist(),
                # does the law order the target runs (their mixtures) as observed?
                "spearman_mean": float(spearmanr(mean_pred_r, mean_obs_r)[0]) if len(obs) >= 3 else None}
    return result


def write_report(out: Path, laws: dict[str, Any], mixtures: dict[str, dict[str, float]] | None,
                 preds: dict[str, Any] | None) -> None:
    from data_mixture.table import read_runs

    plan = json.loads((out / "plan.json").read_text())
    times = json.loads((out / "timings.json").read_text())
    table = read_runs(out / "runs.csv")
    lines = ["# The built-in mixture sweep (builtin_v1)", "",
             "Reproduce: `python -m experiments.studies.do_law_mixtures_win_at_scale --root sweeps/builtin_v1 "
             f"--out {out}`.", "",
             "## Setup", "",
             f"- proxies: {', '.join(PROXIES)} x {plan['chosen']['runs_per_size']} mixtures, "
             f"{len(plan['runs'])} runs, {len(table)} rows (evaluated checkpoints per run: "
             + ", ".join(f"{p} {int((table.run == p + '_m0').sum())}" for p in PROXIES) + "); "
             f"{TOKENS_PER_PARAM:g} tokens per active parameter, batch {BATCH} x {SEQ_LEN}",
             "- tokens per run: " + ", ".join(f"{r['preset']} {r['tokens']:.0f} ({r['steps']} steps)"
                                               for r in plan["runs"][::plan["chosen"]["runs_per_size"]]),
             "- wall time (s): " + ", ".join(f"{k} {v:.0f}" for k, v in times.items() if isinstance(v, (int, float)))
             + (f"; targets {', '.join(f'{k} {v:.0f}' for k, v in times['targets_s'].items())}" if "targets_s" in times else ""),
             *([f"- {times['note']}"] if "note" in times else []), ""]
    for col in SIZE_COLUMNS:
        lines += [f"## Leave one scale out ({col})", "", (out / f"loso_{col}" / "evaluation.md").read_text(), ""]
    lines += [f"## Optimal mixture against size (fit on every row, params_active; weights in [{BOUNDS[0]}, {BOUNDS[1]}])", "",
              "| law | " + " | ".join(laws["optimal"]["sizes"]) + " |", "|---|" + "---|" * len(laws["optimal"]["sizes"])]
    for law, per in laws["optimal"]["laws"].items():
        cells = [" / ".join(f"{per[n][d]:.2f}" for d in DOMAINS) for n in laws["optimal"]["sizes"]]
        lines.append(f"| {law} | " + " | ".join(cells) + " |")
    lines += ["", f"(shares of {' / '.join(DOMAINS)}; plots `optimal_vs_size_<law>.png`)", "",
              "Observed: each mixture's mean held-out loss against size (`observed_vs_size.png`):", "",
              "![observed loss of each mixture against size](observed_vs_size.png)", ""]
    if mixtures:
        lines += ["## Target mixtures", "", "| label | " + " | ".join(DOMAINS) + " |", "|---|" + "---|" * len(DOMAINS)]
        lines += [f"| {k} | " + " | ".join(f"{m[d]:.3f}" for d in DOMAINS) + " |" for k, m in mixtures.items()]
        lines.append("")
    if preds:
        doms = preds["loss_domains"]
        lines += ["## Target runs: observed held-out loss (last checkpoint)", "",
                  "| run | " + " | ".join(doms) + " | mean |", "|---|" + "---|" * (len(doms) + 1)]
        for run_name, obs in zip(preds["runs"], preds["observed"]):
            lines.append(f"| {run_name} | " + " | ".join(f"{v:.4f}" for v in obs) + f" | {np.mean(obs):.4f} |")
        tasks = preds["bench_tasks"]
        if tasks:
            lines += ["", "## Target runs: benchmark accuracy (last checkpoint, 64 items per task)", "",
                      "| run | " + " | ".join(tasks) + " | mean |", "|---|" + "---|" * (len(tasks) + 1)]
            for run_name, acc in zip(preds["runs"], preds["bench"]):
                lines.append(f"| {run_name} | " + " | ".join(f"{v:.3f}" for v in acc) + f" | {np.mean(acc):.3f} |")
        lines += ["", "## Predicted vs observed target losses (laws fitted on every proxy row)", "",
                  "| law.size_column | MAE | mean rel. error | Spearman of the mean loss over the target runs | "
                  + " | ".join(f"pred. mean {r}" for r in preds["runs"]) + " |",
                  "|---|---|---|---|" + "---|" * len(preds["runs"])]
        for key, e in sorted(preds["laws"].items(), key=lambda kv: kv[1]["mae"]):
            rho = "n/a" if e["spearman_mean"] is None else f"{e['spearman_mean']:.2f}"
            lines.append(f"| {key} | {e['mae']:.4f} | {e['mre']:.4f} | {rho} | "
                         + " | ".join(f"{v:.4f}" for v in e["predicted_mean"]) + " |")
        lines.append("")
    (out / "report.md").write_text("\n".join(lines) + "\n")
    log(out, f"wrote {out / 'report.md'}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default="sweeps/builtin_v1", help="run directories (checkpoints; not committed)")
    parser.add_argument("--out", default="experiments/studies/results/builtin_v1", help="small results (committed)")
    parser.add_argument("--mixtures", type=int, default=12, help="mixtures per proxy size")
    parser.add_argument("--parallel", type=int, default=2, help="runs trained at once")
    parser.add_argument("--max-items", type=int, default=64, help="benchmark items per task per checkpoint")
    parser.add_argument("--bootstrap", type=int, default=20, help="bootstrap resamples per law fit")
    parser.add_argument("--target-seeds", type=int, default=1)
    parser.add_argument("--stop-after", choices=("plan", "sweep", "laws", "targets"), default=None)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    out, root = Path(args.out), Path(args.root)
    out.mkdir(parents=True, exist_ok=True)
    stage_plan(out, args.mixtures, args.seed)
    if args.stop_after == "plan":
        return
    stage_sweep(out / "plan.json", root / "proxies", out / "runs.csv", out, args.parallel, args.max_items, "sweep")
    if args.stop_after == "sweep":
        return
    laws = stage_laws(out, args.bootstrap, args.seed)
    mixtures = preds = None
    if args.stop_after != "laws":
        mixtures = target_mixtures(out, laws, args.seed)
        plan = target_plan(out, mixtures, args.target_seeds)
        stage_sweep(plan, root / "targets", out / "target_runs.csv", out, args.parallel, args.max_items, "targets")
        preds = predictions_at_targets(out)
        (out / "target_predictions.json").write_text(json.dumps(preds, indent=1))
    write_report(out, laws, mixtures, preds)


if __name__ == "__main__":
    main()
