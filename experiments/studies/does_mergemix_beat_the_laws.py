"""MergeMix on the built-in corpus against the mixture laws and the uniform mixture.

One command reproduces ``experiments/studies/results/mergemix_v1/`` (small files; checkpoints stay under
``--root``), on top of the built-in sweep (``experiments/studies/do_law_mixtures_win_at_scale.py``, whose run
directories must be on this machine: ``--sweep-root``)::

    nice -n 5 .venv/bin/python -m experiments.studies.does_mergemix_beat_the_laws --sweep-root sweeps/builtin_v1 \\
        --root sweeps/mergemix_v1 --out experiments/studies/results/mergemix_v1

Stages, each resumable (finished experts are skipped, every merge evaluation is cached in
``ROOT/cache_<fraction>.jsonl``):

1. **experts**: the base is the sweep's uniform-mixture run at the largest proxy size (``s1_m0``,
   191k active parameters, 571k tokens, cosine-decayed); one expert per domain trained from it
   at the base's peak learning rate, constant, for ``EXPERT_SHARE`` of the base's tokens, with
   checkpoints at 1/8, 1/4, 1/2 and all of that (5%, 10%, 20% and 40% of the base's tokens).
2. **rank**: for each expert budget and router treatment (linear, base, harc), the merge proxy of
   each of the sweep's 12 ``s1`` mixtures (alpha = the mixture) against the model really trained
   on it (same size, from scratch): Spearman per task, of the macro score, per domain loss and of
   the mean loss, with bootstrap intervals (``rank.json``); routing breakdown per treatment at
   three mixtures. The default expert budget and router follow from this table
   (:func:`choose_default`).
3. **search**: ``python -m data_mixture mergemix`` at that budget and router, both searches
   (MergeMix's regressor-guided search and CMA-ES), ``BUDGET`` merges each, alpha floored at the
   sweep's lower bound (0.05 per domain), for two objectives: the paper's macro benchmark score
   (``search_bench/``) and the mean held-out loss (``search_loss/``, the objective the laws'
   mixtures minimise).
4. **targets**: the target size ``s2`` trained on each MergeMix mixture with exactly the recipe of
   the sweep's target runs (same seed and tokens), next to the sweep's uniform, CAMEL,
   best-proxy and scale-independent-law targets.
5. **report** ``report.md``: tables, costs in FLOPs (:mod:`data_mixture.mergemix.cost`) and plots.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from experiments.studies import do_law_mixtures_win_at_scale as sweep_study
from moejax.log import add_verbosity_flags, setup_logging

DOMAINS = sweep_study.DOMAINS
BASE_RUN = "s1_m0"  # the sweep's uniform mixture at the largest proxy size
PROXY = "s1"
EXPERT_SHARE = 0.4  # expert budget: this share of the base's tokens (checkpoints at 1/8 ... 1 of it)
FRACTIONS = (0.125, 0.25, 0.5, 1.0)
ROUTERS = ("linear", "base", "harc")
BUDGET = 60  # merges per search
N_SEEDS = 40
FLOOR = sweep_study.BOUNDS[0]
MAX_ITEMS, LOSS_BATCHES = 64, sweep_study.LOSS_BATCHES  # as the sweep's evaluations
BREAKDOWN_MIXTURES = ("s1_m0", "s1_m5", "s1_m8")
OBJECTIVES = {"bench": None, "loss": {d: 1.0 for d in DOMAINS}}  # loss weights (None: macro benchmark score)


def log(out: Path, message: str) -> None:
    sweep_study.log(out, message)


def trained_metrics(sweep_out: Path) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, float]], str]:
    """{run: metrics} and {run: mixture} of the sweep's ``PROXY`` runs at their last checkpoint, and
    the base's workdir."""
    from data_mixture.table import read_runs

    table = read_runs(sweep_out / "runs.csv")
    metrics, mixtures, workdir = {}, {}, None
    for run in sorted(set(table.run.tolist())):
        if not run.startswith(PROXY + "_"):
            continue
        rows = np.flatnonzero(table.run == run)
        i = rows[np.argmax(table.tokens[rows])]
        metrics[run] = {**{f"loss:{d}": float(table.loss_rv[i, j]) for j, d in enumerate(table.loss_domains)},
                        **{f"bench:{t}": float(table.bench_rt[i, j]) for j, t in enumerate(table.bench_tasks)}}
        mixtures[run] = {d: float(table.mix_rm[i, j]) for j, d in enumerate(table.mix_domains)}
        if run == BASE_RUN:
            workdir = str(table.extra["workdir"][i])
    if workdir is None:
        raise SystemExit(f"{sweep_out}/runs.csv has no run {BASE_RUN}")
    return metrics, mixtures, workdir


def stage_experts(root: Path, out: Path, base: str, parallel: int) -> dict[str, Any]:
    from data_mixture.mergemix import experts

    cfg = experts.base_config_dict(base, None)
    base_tokens = float(max(experts.base_steps(base))) * cfg["train"]["global_batch_size"] * cfg["train"]["seq_len"]
    plan = experts.plan_experts(base, domains=DOMAINS, expert_tokens=EXPERT_SHARE * base_tokens, fractions=FRACTIONS)
    t0 = time.perf_counter()
    result = experts.train_experts(plan, root / "experts", parallel=parallel, progress=False,
                                   eval_args=["--max-items", "8", "--loss-batches", "1"])
    if result.launched:
        sweep_study.record_time(out, "experts_s", time.perf_counter() - t0)
    return plan


def stage_rank(root: Path, out: Path, base: str, trained: dict, mixtures: dict) -> dict[str, Any]:
    """Rank consistency of every (expert budget, router) and routing breakdown (cached in JSON)."""
    from data_mixture.mergemix.pipeline import MergeProxy, open_merge
    from data_mixture.mergemix.rank import rank_consistency
    from data_mixture.mergemix.routing import calibration_batches, compare_treatments

    path = out / "rank.json"
    result = json.loads(path.read_text()) if path.exists() else {"rank": {}, "breakdown": {}, "proxy": {}}
    for fraction in FRACTIONS:
        if all(f"{fraction}/{r}" in result["rank"] for r in ROUTERS) and str(fraction) in result["breakdown"]:
            continue
        t0 = time.perf_counter()
        merge_set, evaluator = open_merge(base, None, str(root / "experts"), DOMAINS, fraction, max_items=MAX_ITEMS,
                                          loss_batches=LOSS_BATCHES, cache_path=str(root / f"cache_{fraction}.jsonl"))
        calib = calibration_batches(merge_set.erun, list(DOMAINS), batches_per_domain=2)
        for router in ROUTERS:
            proxy = MergeProxy(merge_set, evaluator, router, calib_batches=calib)
            got = {run: proxy(np.array([mix[d] for d in DOMAINS])) for run, mix in mixtures.items()}
            result["proxy"][f"{fraction}/{router}"] = got
            result["rank"][f"{fraction}/{router}"] = rank_consistency(got, trained, seed=0)
            log(out, f"rank {fraction}/{router}: macro {result['rank'][f'{fraction}/{router}']['overall']['rho']:.3f} "
                     f"mean loss {result['rank'][f'{fraction}/{router}']['mean_loss']['rho']:.3f}")
        heldout = evaluator.evaluator.eval_batches
        result["breakdown"][str(fraction)] = {
            run: compare_treatments(merge_set, np.array([mixtures[run][d] for d in DOMAINS]), heldout,
                                    calib_batches=calib)
            for run in BREAKDOWN_MIXTURES}
        result.setdefault("seconds", {})[str(fraction)] = time.perf_counter() - t0
        result.setdefault("merge_seconds", {})[str(fraction)] = float(np.median(
            [m["seconds"] for r in ROUTERS if r != "harc" for m in result["proxy"][f"{fraction}/{r}"].values()]))
        path.write_text(json.dumps(result, indent=1, default=float))
    return result


ROUTER_MARGIN = 0.1  # a treatment replaces the paper's linear router only if it ranks this much better


def choose_default(rank: dict[str, Any]) -> tuple[float, str]:
    """The default (expert fraction, router): the expert budget whose proxies rank the trained
    mixtures best (macro score, mean over the router treatments, so one lucky treatment does not
    decide the budget), then the paper's ``linear`` router unless another treatment's macro-score
    Spearman at that budget beats it by more than ``ROUTER_MARGIN`` (``harc`` costs about 3x a plain
    merge per evaluation; differences smaller than this are far inside the bootstrap intervals)."""
    rho = {k: np.nan_to_num(r["overall"]["rho"], nan=-2.0) for k, r in rank["rank"].items()}
    fraction = max(FRACTIONS, key=lambda f: np.mean([rho[f"{f}/{r}"] for r in ROUTERS]))
    router = max(ROUTERS, key=lambda r: rho[f"{fraction}/{r}"])
    if rho[f"{fraction}/{router}"] - rho[f"{fraction}/linear"] <= ROUTER_MARGIN:
        router = "linear"
    return float(fraction), router


def stage_search(root: Path, out: Path, base: str, plan: dict, fraction: float, router: str) -> dict[str, Any]:
    """``python -m data_mixture mergemix`` for each objective (its own outputs are resumable)."""
    results = {}
    for name, loss_weights in OBJECTIVES.items():
        dest = out / f"search_{name}"
        cmd = [sys.executable, "-m", "data_mixture", "mergemix", "--base", base, "--domains", ",".join(DOMAINS),
               "--expert-tokens", repr(plan["mergemix"]["expert_tokens"]), "--fractions",
               ",".join(map(str, FRACTIONS)), "--expert-fraction", str(fraction), "--experts-dir", str(root / "experts"),
               "--router", router, "--search", "both", "--budget", str(BUDGET), "--seeds", str(N_SEEDS),
               "--max-items", str(MAX_ITEMS), "--loss-batches", str(LOSS_BATCHES),
               "--min-weight", ",".join(f"{d}={FLOOR}" for d in DOMAINS),
               "--cache", str(root / (f"cache_{fraction}.jsonl" if name == "bench" else f"cache_{fraction}_{name}.jsonl")),
               "--out", str(dest), "--no-progress"]
        if loss_weights:
            cmd += ["--loss-weights", ",".join(f"{d}={w}" for d, w in loss_weights.items())]
        if not (dest / "summary.json").exists():
            sweep_study.record_time(out, f"search_{name}_s", sweep_study.run(cmd, out))
        results[name] = json.loads((dest / "summary.json").read_text())
    return results


def stage_targets(root: Path, out: Path, searches: dict[str, Any], parallel: int) -> None:
    mixtures = {f"mergemix_{name}": s["mixture"] for name, s in searches.items()}
    plan = sweep_study.target_plan(out, mixtures, seeds=1)
    if (out / "target_runs.csv").exists():  # done (the runner would only skip them, adding its time)
        return
    sweep_study.stage_sweep(plan, root / "targets", out / "target_runs.csv", out, parallel, MAX_ITEMS, "targets")


def costs(sweep_out: Path, out: Path, searches: dict[str, Any], rank: dict[str, Any]) -> dict[str, Any]:
    from data_mixture.mergemix.cost import sweep_cost, train_flops

    sweep_plan = json.loads((sweep_out / "plan.json").read_text())
    eval_tokens = float(np.nanmean([s["flops"]["eval_tokens_per_merge"] for s in searches.values()]))
    proxies = [{"params_active": r["params_active"], "tokens": r["tokens"],
                "checkpoints": sweep_study.CHECKPOINTS} for r in sweep_plan["runs"]]
    target = json.loads((sweep_out / "target_plan.json").read_text())["runs"][0]
    brute = len([r for r in sweep_plan["runs"] if r["preset"] == PROXY]) * train_flops(target["params_active"], target["tokens"])
    return {"mergemix": {n: s["flops"] for n, s in searches.items()}, "laws_sweep": sweep_cost(proxies, eval_tokens),
            "brute_force_target": brute, "target_run": train_flops(target["params_active"], target["tokens"]),
            "note": "MergeMix's total excludes the base (a pretrained model a user already has) and the rank study's "
                    "merges; laws_sweep.evaluation assumes every sweep checkpoint cost the same evaluation tokens as "
                    "one merge evaluation (same tasks and settings)."}


def write_report(out: Path, sweep_out: Path, rank: dict[str, Any], default: tuple[float, str], searches: dict[str, Any],
                 cost: dict[str, Any]) -> None:
    from data_mixture.table import read_runs

    fmt = lambda r: f"{r['rho']:.2f} [{r['lo']:.2f}, {r['hi']:.2f}]" if np.isfinite(r["rho"]) else "n/a (saturated)"
    lines = ["# MergeMix on the built-in corpus (mergemix_v1)", "",
             "Reproduce: `python -m experiments.studies.does_mergemix_beat_the_laws --sweep-root sweeps/builtin_v1 "
             f"--root sweeps/mergemix_v1 --out {out}`.", "",
             f"Base: the sweep's `{BASE_RUN}` (uniform mixture, {PROXY}: 191k active parameters, 571k tokens). Experts: "
             f"one per domain, constant learning rate, checkpoints at {', '.join(f'{f * EXPERT_SHARE:.0%}' for f in FRACTIONS)}"
             " of the base's tokens. Trained mixtures: the sweep's 12 `s1` runs (from scratch, same size, 571k tokens).", "",
             "## Rank consistency (Spearman, merge proxy vs trained models, 95% bootstrap interval over mixtures)", "",
             "| expert budget | router | macro score | mean loss | " + " | ".join(f"loss {d}" for d in DOMAINS) + " |",
             "|---|---|---|---|" + "---|" * len(DOMAINS)]
    for key, r in rank["rank"].items():
        fraction, router = key.split("/")
        lines.append(f"| {float(fraction) * EXPERT_SHARE:.0%} | {router} | {fmt(r['overall'])} | {fmt(r['mean_loss'])} | "
                     + " | ".join(fmt(r["losses"][d]) for d in DOMAINS) + " |")
    best_key = f"{default[0]}/{default[1]}"
    tasks = list(rank["rank"][best_key]["tasks"])
    lines += ["", f"Default chosen from this table: expert budget {default[0] * EXPERT_SHARE:.0%} of the base's tokens, "
                  f"router `{default[1]}`. Per task at that setting:", "",
              "| task | Spearman |", "|---|---|"] + [f"| {t} | {fmt(rank['rank'][best_key]['tasks'][t])} |" for t in tasks]
    lines += ["", "## Merged models' scores (mean over the 12 mixtures' merges)", "",
              "| expert budget | router | mean benchmark score | mean held-out loss |", "|---|---|---|---|"]
    for key, got in rank["proxy"].items():
        fraction, router = key.split("/")
        bench = np.mean([[v for k, v in m.items() if k.startswith("bench:")] for m in got.values()])
        loss = np.mean([[v for k, v in m.items() if k.startswith("loss:")] for m in got.values()])
        lines.append(f"| {float(fraction) * EXPERT_SHARE:.0%} | {router} | {bench:.4f} | {loss:.4f} |")
    lines += ["", "## Routing breakdown (fraction of tokens whose top-k set differs from the domain expert's; "
                  "mean over domains, per MoE layer and their mean) and its loss cost", "",
              "| expert budget | mixture | linear | base | harc | loss cost linear / base / harc |", "|---|---|---|---|---|---|"]
    for fraction, per in rank["breakdown"].items():
        for run, tr in per.items():
            lines.append(f"| {float(fraction) * EXPERT_SHARE:.0%} | {run} | "
                         + " | ".join(f"{tr[t]['breakdown']:.3f} ({', '.join(f'{b:.2f}' for b in tr[t]['breakdown_l'])})"
                                      for t in ROUTERS) + " | "
                         + " / ".join(f"{tr[t]['loss_cost']:+.3f}" for t in ROUTERS) + " |")
    lines += ["", "## Search (budget per method; alpha floored at 0.05 per domain)", "",
              "| objective | method | best score | evaluations | mixture (" + ", ".join(DOMAINS) + ") |", "|---|---|---|---|---|"]
    for name, s in searches.items():
        for method, r in s["searches"].items():
            lines.append(f"| {name} | {method} | {r['best_score']:.3f} | {r['evaluations']} | "
                         + ", ".join(f"{r['best_mixture'][d]:.3f}" for d in DOMAINS) + " |")
    lines += ["", "Scores are in each objective's own units (standardised over the mergemix seed design); "
                  "`search_<objective>/search.png` plots best score against merges evaluated."]
    targets = out / "target_runs.csv"
    if targets.exists():
        rows = []
        for path in (sweep_out / "target_runs.csv", targets):
            t = read_runs(path)
            for run in sorted(set(t.run.tolist())):
                sel = np.flatnonzero(t.run == run)
                i = sel[np.argmax(t.tokens[sel])]
                rows.append((run, t.mix_rm[i], t.loss_rv[i], t.bench_rt[i], list(t.bench_tasks)))
        lines += ["", "## Target size s2 (600k active parameters, 1.8M tokens, seed 0): trained on each mixture", "",
                  "| run | mixture (" + ", ".join(DOMAINS) + ") | mean loss | " + " | ".join(DOMAINS) + " | mean bench |",
                  "|---|---|---|" + "---|" * len(DOMAINS) + "---|"]
        for run, mix, loss, bench, _ in sorted(rows, key=lambda r: r[2].mean()):
            lines.append(f"| {run} | " + ", ".join(f"{w:.2f}" for w in mix) + f" | {loss.mean():.4f} | "
                         + " | ".join(f"{v:.4f}" for v in loss) + f" | {bench.mean():.3f} |")
    lines += ["", "## Cost (FLOPs)", "", "| method | FLOPs |", "|---|---|"]
    for name, f in cost["mergemix"].items():
        lines.append(f"| MergeMix ({name}): experts + {f['merges_evaluated']:.0f} merges | {f['total']:.3g} "
                     f"(experts {f['experts']:.3g}, merges {f['merges']:.3g}; base {f['base']:.3g}) |")
    lines += [f"| mixture laws: the sweep (36 runs + evaluations) | {cost['laws_sweep']['total']:.3g} |",
              f"| brute force: 12 mixtures at the target size | {cost['brute_force_target']:.3g} |",
              f"| one target run | {cost['target_run']:.3g} |", "", cost["note"], ""]
    times = json.loads((out / "timings.json").read_text()) if (out / "timings.json").exists() else {}
    lines += ["Wall times (s): " + ", ".join(f"{k} {v:.0f}" for k, v in times.items() if isinstance(v, (int, float))),
              f"Median merge + evaluation (linear/base router, {MAX_ITEMS} items per task, {LOSS_BATCHES} held-out batches "
              "per domain): " + ", ".join(f"{float(f) * EXPERT_SHARE:.0%} {s:.1f} s" for f, s in rank.get("merge_seconds", {}).items()), ""]
    (out / "report.md").write_text("\n".join(lines) + "\n")
    log(out, f"wrote {out / 'report.md'}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sweep-root", default="sweeps/builtin_v1", help="the built-in sweep's run directories")
    parser.add_argument("--sweep-out", default="experiments/studies/results/builtin_v1", help="the built-in sweep's results")
    parser.add_argument("--root", default="sweeps/mergemix_v1", help="experts, caches, target runs (not committed)")
    parser.add_argument("--out", default="experiments/studies/results/mergemix_v1", help="small results (committed)")
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--stop-after", choices=("experts", "rank", "search"), default=None)
    add_verbosity_flags(parser)
    args = parser.parse_args(argv)
    setup_logging(args.verbosity)
    out, root, sweep_out = Path(args.out), Path(args.root), Path(args.sweep_out)
    out.mkdir(parents=True, exist_ok=True)
    trained, mixtures, base = trained_metrics(sweep_out)
    plan = stage_experts(root, out, base, args.parallel)
    if args.stop_after == "experts":
        return
    rank = stage_rank(root, out, base, trained, mixtures)
    default = choose_default(rank)
    log(out, f"default: expert fraction {default[0]}, router {default[1]}")
    if args.stop_after == "rank":
        return
    searches = stage_search(root, out, base, plan, *default)
    if args.stop_after != "search":
        stage_targets(root, out, searches, args.parallel)
    cost = costs(sweep_out, out, searches, rank)
    (out / "cost.json").write_text(json.dumps(cost, indent=1))
    write_report(out, sweep_out, rank, default, searches, cost)


if __name__ == "__main__":
    main()
