"""The mid-training mixture study: a 4-size ladder, laws vs baselines, target runs with 3 seeds.

    ./launch.sh python -m experiments.studies.do_laws_pick_midtrain_mixtures   # every stage; each skips what exists

Stages (``--stage NAME`` runs one; results in ``--out``, runs under ``--root``):

1. ``plan``    the ladder plan: one uniform base per size (20 tokens/param), 12 space-filling mixtures
               continued from each proxy base for 4 tokens/param, 2 seeds at the largest proxy; the
               decision rule is written into the plan before any target run.
2. ``ladder``  ``data_mixture sweep`` of the ladder plan; the runs table is copied to ``--out``, and
               collected again with the benchmarks' continuous score (``runs_logprob.csv``).
3. ``fit``     ``data_mixture evaluate`` of every law and baseline on the ladder (fit below the
               largest proxy, decide there: ``evaluate_ladder/``); every law fitted on the whole
               ladder (``fits/``) and its loss-optimal mixture at the target (``optima/``).

The sizes and ``T_mid`` come from the pilot (experiments/studies/results/midtrain_pilot/pilot.md): at 4
tokens/param of mid-training the mixtures' mean held-out loss spreads over 5-7 seed standard errors
(3 seeds) and the per-domain losses over 4.5-45, so the ladder keeps the pilot's T_mid.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from data_mixture.plan import PlanSpec, make_plan, preset_sizes
from experiments.studies import EVAL_WINDOWS
from moejax.log import add_verbosity_flags, setup_logging

DOMAINS = ("code", "prose", "math", "knowledge")
HEADS = {"model.num_kv_heads": 1}
PRESETS = {  # the ladder: s0 .. s2 span 10.3x in active parameters; s2 is the target
    "s0": {"model.d_model": 32, "model.num_layers": 2, "model.num_heads": 2, **HEADS, "model.mlp_dim": 128,
           "model.moe.expert_dim": 64, "model.moe.shared_expert_dim": 64},
    "s1": {"model.d_model": 64, "model.num_layers": 2, "model.num_heads": 2, **HEADS, "model.mlp_dim": 256,
           "model.moe.expert_dim": 128, "model.moe.shared_expert_dim": 128},
    "s1b": {"model.d_model": 64, "model.num_layers": 3, "model.num_heads": 2, **HEADS, "model.mlp_dim": 256,
            "model.moe.expert_dim": 128, "model.moe.shared_expert_dim": 128},
    "s2": {"model.d_model": 96, "model.num_layers": 3, "model.num_heads": 3, **HEADS, "model.mlp_dim": 384,
           "model.moe.expert_dim": 192, "model.moe.shared_expert_dim": 192},
}
TARGET = "s2"
LARGEST_PROXY = "s1b"
MIXTURES = 12
BASE_TOKENS_PER_PARAM, MID_TOKENS_PER_PARAM = 20.0, 4.0
TARGET_SEEDS = (0, 1, 2)
TARGET_LADDER_MIXTURES = ("m1", "m2")  # also trained at the target (not picks): more pairs to decide there
EVAL_ARGS = "--max-items 128"
DECISION_RULE = {
    "metric": "loss:mean at the final checkpoint (mean held-out loss over the validation domains)",
    "seeds": list(TARGET_SEEDS),
    "rule": ("mixture X beats mixture Y at the target when the mean of X's loss over the 3 seeds is lower and the "
             "95% t-interval of the paired difference X - Y (paired by train seed, 2 degrees of freedom) excludes "
             "zero; otherwise X and Y tie."),
    "fixed": ("written into this plan at commit b01916d (2026-12-03 11:30:55 UTC), after the target base and nine target "
              "runs had started in the pilot (uniform, ladder_m1 and ladder_m2, 3 seeds each; pilot commit f849cec): "
              "not pre-registered for those runs (report.md, 'Pre-registration')"),
}
# The process, as git and the sweep logs record it (report.md, "Pre-registration"); log clocks are UTC.
STUDY_DAY = "2026-12-03"
PILOT_COMMIT = {"commit": "f849cec", "time": "2026-12-03T10:42:22+00:00",
                "what": "the pilot's s2 runs (its runs.csv) committed"}
RULE_COMMIT = {"commit": "b01916d", "time": "2026-12-03T11:30:55+00:00", "what": "the decision rule committed (plan.json)"}
PREDICTIONS_COMMIT = {"commit": "db6b09a", "time": "2026-12-03T13:08:19+00:00",
                      "what": "the target plan with the laws' predictions committed (target_plan.json)"}
PILOT_NAMES = {  # target runs copied from the pilot's s2 runs (identical losses): target name -> pilot name
    "s2_base": "s2_base", "s2_uniform_s0": "s2_m0", "s2_uniform_s1": "s2_m0_s1", "s2_uniform_s2": "s2_m0_s2",
    "s2_ladder_m1_s0": "s2_m1", "s2_ladder_m1_s1": "s2_m1_s1", "s2_ladder_m1_s2": "s2_m1_s2",
    "s2_ladder_m2_s0": "s2_m2", "s2_ladder_m2_s1": "s2_m2_s1", "s2_ladder_m2_s2": "s2_m2_s2"}


def ladder_plan() -> dict:
    """The ladder plan (make_plan with a budget that affords exactly MIXTURES mixtures)."""
    sizes = preset_sizes(PRESETS)
    n = {p: sizes[p]["params_active"] for p in PRESETS}
    proxies = [p for p in PRESETS if p != TARGET]
    base = sum(6 * n[p] * BASE_TOKENS_PER_PARAM * n[p] for p in proxies)
    per_mixture = sum(6 * n[p] * MID_TOKENS_PER_PARAM * n[p] * (2 if p == LARGEST_PROXY else 1) for p in proxies)
    spec = PlanSpec(budget_flops=base + per_mixture * (MIXTURES + 0.5), target_size=n[TARGET],
                    target_tokens=MID_TOKENS_PER_PARAM * n[TARGET], presets=PRESETS, law="camel",
                    domains=",".join(DOMAINS), min_sizes=len(proxies), min_runs_per_size=MIXTURES,
                    mid_training=True, base_tokens_per_param=BASE_TOKENS_PER_PARAM,
                    mid_tokens_per_param=(MID_TOKENS_PER_PARAM,), seeds=2, seed_sizes=(LARGEST_PROXY,))
    plan = make_plan(spec)
    plan["eval_windows"] = EVAL_WINDOWS["train.eval_windows"]  # as the committed runs were evaluated
    if plan["chosen"]["runs_per_size"] != MIXTURES or plan["chosen"]["sizes"] != proxies:
        raise SystemExit(f"the planner chose {plan['chosen']}, not {MIXTURES} mixtures at {proxies}")
    plan["decision_rule"] = DECISION_RULE
    plan["notes"] = (f"Ladder of the mid-training study: presets {', '.join(PRESETS)} ({TARGET} is the target, "
                     f"{n[TARGET] / n['s0']:.1f}x the smallest in active parameters); bases on the uniform mixture for "
                     f"{BASE_TOKENS_PER_PARAM:g} tokens/param; {MIXTURES} space-filling mixtures continued from each "
                     f"proxy base for {MID_TOKENS_PER_PARAM:g} tokens/param, 2 seeds at {LARGEST_PROXY}. T_mid from the "
                     "pilot (results/midtrain_pilot/pilot.md): at 4 tokens/param the mixtures' mean held-out loss spreads "
                     "over 5.3 (s1) and 6.8 (s2) seed standard errors with 3 seeds, per-domain losses over 4.5-45.")
    return plan


def stage_plan(out: Path) -> Path:
    path = out / "plan.json"
    if path.exists():
        print(f"plan: {path} exists (kept)")
        return path
    plan = ladder_plan()
    path.write_text(json.dumps(plan, indent=1))
    print(f"plan: {len(plan['runs'])} runs, {plan['total_flops']:.3g} FLOPs -> {path}")
    return path


def sweep(plan: Path, root: Path, parallel: int) -> None:
    dm("sweep", "--plan", str(plan), "--root", str(root), "--parallel", str(parallel), "--eval-args", EVAL_ARGS)


def dm(*args: str) -> None:
    """``python -m data_mixture ARGS``; a failed command stops the study with its exit status."""
    cmd = [sys.executable, "-m", "data_mixture", *args]
    print("+", " ".join(cmd), flush=True)
    rc = subprocess.call(cmd)
    if rc != 0:
        raise SystemExit(f"{' '.join(args[:1])} exited {rc}; fix the cause and rerun the stage")


def stage_ladder(out: Path, root: Path, parallel: int) -> None:
    if not (out / "runs.csv").exists():
        sweep(out / "plan.json", root / "ladder", parallel)
        shutil.copyfile(root / "ladder" / "runs.csv", out / "runs.csv")
    if not (out / "sweep_ladder.log").exists():
        shutil.copyfile(root / "ladder" / "sweep.log", out / "sweep_ladder.log")
    if not (out / "runs_logprob.csv").exists():
        dm("collect", str(root / "ladder"), "--out", str(out / "runs_logprob.csv"), "--bench-metric", "gold_logprob")


LAWS = ("mixing_law", "additive", "regmix", "regmix_linear", "camel")
SIZE_COLUMN = "params_active"  # the laws' N, as the plan sizes the ladder (target_point is in it too)
FIT_BOOTSTRAP = 20


def target_point() -> tuple[float, float]:
    """(active parameters, mid-training tokens) of a target run."""
    n = ladder_size(TARGET)
    return n, MID_TOKENS_PER_PARAM * n


def stage_fit(out: Path) -> None:
    runs = str(out / "runs.csv")
    if not (out / "evaluate_ladder" / "evaluation.json").exists():
        dm("evaluate", "--runs", runs, "--laws", ",".join(LAWS), "--size-column", SIZE_COLUMN,
           "--out-dir", str(out / "evaluate_ladder"), "--force")
    n, d = target_point()
    for law in LAWS:
        fit, opt = out / "fits" / f"{law}.json", out / "optima" / f"{law}.json"
        fit.parent.mkdir(exist_ok=True)
        opt.parent.mkdir(exist_ok=True)
        if not fit.exists():
            dm("fit", "--runs", runs, "--law", law, "--size-column", SIZE_COLUMN, "--bootstrap", str(FIT_BOOTSTRAP),
               "--out", str(fit), "--no-progress")
        if not opt.exists():
            dm("optimize", "--fit", str(fit), "--size", repr(n), "--tokens", repr(d), "--out", str(opt))


EXPERT_SHARE = 0.4  # experts train for this share of the proxy base's tokens ...
FRACTIONS = (0.125, 0.25, 0.5, 1.0)  # ... and are merged at these fractions of it: 5, 10, 20, 40%
EXPERT_SEEDS = (0, 1)
ROUTERS = ("linear", "base", "harc")
MERGE_MAX_ITEMS, MERGE_LOSS_BATCHES = 64, 4
SEARCH_BUDGET, SEARCH_SEEDS = 60, 40
OBJECTIVES = {"bench": None, "loss": {d: 1.0 for d in DOMAINS}}  # loss weights (None: macro benchmark score)
ROUTER_MARGIN = 0.1


def final_cells(table, preset_size: float) -> tuple[dict, dict, dict]:
    """At one size, the mid-training runs' final checkpoints grouped by mixture name (``m<k>``):
    ({name: weights}, {name: {metric: [value per seed]}}, {name: [seeds]})."""
    import re

    mid = table.law_rows()
    seed_r = mid.seeds()
    weights, values, seeds = {}, {}, {}
    for run in sorted(set(mid.run[mid.params_active == preset_size].tolist())):
        rows = np.flatnonzero(mid.run == run)
        i = rows[np.argmax(mid.tokens[rows])]
        name = re.sub(r"_s\d+$", "", run).split("_", 1)[1]
        weights[name] = {d: float(mid.mix_rm[i, j]) for j, d in enumerate(mid.mix_domains)}
        metrics = {f"loss:{d}": float(mid.loss_rv[i, j]) for j, d in enumerate(mid.loss_domains)}
        metrics["loss:mean"] = float(mid.loss_rv[i].mean())
        if mid.bench_rt is not None:
            metrics.update({f"bench:{t}": float(mid.bench_rt[i, j]) for j, t in enumerate(mid.bench_tasks)})
        for k, v in metrics.items():
            values.setdefault(name, {}).setdefault(k, []).append(v)
        seeds.setdefault(name, []).append(int(seed_r[i]))
    return weights, values, seeds


def _decision(pred_k: np.ndarray, obs_sk: list[list[float]], resamples: int) -> tuple[dict, np.ndarray]:
    from data_mixture import decisions as dec

    obs_k = np.array([np.mean(v) for v in obs_sk])
    seeds_k = np.array([len(v) for v in obs_sk])
    sd_k = np.array([np.std(v, ddof=1) if len(v) >= 2 else np.nan for v in obs_sk])
    sd = dec.robust_pooled_sd(sd_k, seeds_k - 1)["sd"]  # only for mixtures with one seed
    agree_kk = dec.agreement_matrix(pred_k, obs_k)
    within_kk = dec.noise_pairs(obs_k, seeds_k, sd_k, fallback=sd)  # each pair by its own two mixtures' seed sd
    out = dec.split_accuracy(agree_kk, within_kk)
    acc_b = dec.resampled_accuracy(agree_kk, ~within_kk, dec.mixture_resamples(len(obs_k), resamples, seed=0))
    out["lo"], out["hi"] = dec.percentile_interval(acc_b)
    out["seed_sd"] = sd
    return out, acc_b


def decision_scores(pred_k: np.ndarray, obs_sk: list[list[float]], resamples: int = 1000) -> dict:
    """Decision accuracy of ``pred_k`` (lower = better) against the mixtures' seed means, pairs within
    the seed noise counted apart, with a 95% bootstrap interval over mixtures."""
    return _decision(pred_k, obs_sk, resamples)[0]


def decision_gap(pred_a_k: np.ndarray, pred_b_k: np.ndarray, obs_sk: list[list[float]], resamples: int = 1000) -> dict:
    """Decision accuracy of ranker a minus ranker b on the same decided pairs, with a paired 95%
    bootstrap interval (both scored on the same mixture resamples)."""
    from data_mixture import decisions as dec

    (a, a_b), (b, b_b) = _decision(pred_a_k, obs_sk, resamples), _decision(pred_b_k, obs_sk, resamples)
    lo, hi = dec.percentile_interval(a_b - b_b)
    return {"diff": a["accuracy"] - b["accuracy"], "lo": lo, "hi": hi}


def stage_experts(out: Path, root: Path, parallel: int) -> tuple[str, float]:
    """One expert per domain from the largest proxy's base, per expert seed; (base, expert tokens)."""
    from data_mixture.mergemix import experts

    base = str(root / "ladder" / f"{LARGEST_PROXY}_base")
    cfg = experts.base_config_dict(base, None)
    base_tokens = float(max(experts.base_steps(base))) * cfg["train"]["global_batch_size"] * cfg["train"]["seq_len"]
    for seed in EXPERT_SEEDS:
        plan = experts.plan_experts(base, domains=DOMAINS, expert_tokens=EXPERT_SHARE * base_tokens,
                                    fractions=FRACTIONS, seed=seed)
        experts.train_experts(plan, root / f"experts_s{seed}", parallel=parallel, progress=False,
                              eval_args=["--max-items", "8", "--loss-batches", "1"])
        (out / "mergemix").mkdir(exist_ok=True)
        if not (out / "mergemix" / f"sweep_experts_s{seed}.log").exists():  # as the ladder's: the training's log
            shutil.copyfile(root / f"experts_s{seed}" / "sweep.log", out / "mergemix" / f"sweep_experts_s{seed}.log")
    return base, EXPERT_SHARE * base_tokens


def stage_rank(out: Path, root: Path, base: str) -> dict:
    """Merges of every ladder mixture at the largest proxy, per expert seed, budget and router,
    ranked against the mid-training runs of that size (``mergemix/rank.json``, resumable)."""
    from data_mixture.mergemix.pipeline import MergeProxy, open_merge
    from data_mixture.mergemix.rank import rank_consistency
    from data_mixture.mergemix.routing import calibration_batches
    from data_mixture.table import read_runs

    path = out / "mergemix" / "rank.json"
    path.parent.mkdir(exist_ok=True)
    result = json.loads(path.read_text()) if path.exists() else {"rank": {}, "proxy": {}}
    table = read_runs(out / "runs.csv")
    weights, values, _ = final_cells(table, ladder_size(LARGEST_PROXY))
    names = sorted(weights)
    trained = {n: {k: float(np.mean(v)) for k, v in values[n].items()} for n in names}
    result.pop("rank_by_weight", None)
    result["baselines"] = rank_baselines(table, weights, values)
    for seed in EXPERT_SEEDS:
        for fraction in FRACTIONS:
            keys = [f"s{seed}/{fraction}/{r}" for r in ROUTERS]
            if all(k in result["rank"] for k in keys):
                continue
            t0 = time.perf_counter()
            merge_set, evaluator = open_merge(base, None, str(root / f"experts_s{seed}"), DOMAINS, fraction,
                                              max_items=MERGE_MAX_ITEMS, loss_batches=MERGE_LOSS_BATCHES,
                                              cache_path=str(root / f"cache_s{seed}_{fraction}.jsonl"))
            calib = calibration_batches(merge_set.erun, list(DOMAINS), batches_per_domain=2)
            for router, key in zip(ROUTERS, keys):
                proxy = MergeProxy(merge_set, evaluator, router, calib_batches=calib)
                got = dict(zip(names, proxy.evaluate_many([np.array([weights[n][d] for d in DOMAINS]) for n in names])))
                for n in names:
                    got[n]["loss:mean"] = float(np.mean([got[n][f"loss:{d}"] for d in DOMAINS]))
                rank = rank_consistency(got, trained, seed=0)
                rank["decision"] = {
                    k: decision_scores(np.array([got[n][k] for n in names]), [values[n][k] for n in names])
                    for k in ["loss:mean"] + [f"loss:{d}" for d in DOMAINS]}
                result["proxy"][key], result["rank"][key] = got, rank
                print(f"rank {key}: mean-loss rho {rank['mean_loss']['rho']:.3f}, decision "
                      f"{rank['decision']['loss:mean']['accuracy']:.3f}", flush=True)
            result.setdefault("seconds", {})[f"s{seed}/{fraction}"] = time.perf_counter() - t0
            path.write_text(json.dumps(result, indent=1, default=float))
    path.write_text(json.dumps(result, indent=1, default=float))
    return result


def rescore_rank(out: Path) -> None:
    """Re-scores ``mergemix/rank.json``'s decisions from its stored merge evaluations (``proxy``) and
    the ladder's runs, with the current :func:`decision_scores` (noise per pair); no merge is rerun."""
    from data_mixture.table import read_runs

    path = out / "mergemix" / "rank.json"
    if not path.exists():
        return
    result = json.loads(path.read_text())
    table = read_runs(out / "runs.csv")
    weights, values, _ = final_cells(table, ladder_size(LARGEST_PROXY))
    names = sorted(weights)
    for key, got in result["proxy"].items():
        result["rank"][key]["decision"] = {
            k: decision_scores(np.array([got[n][k] for n in names]), [values[n][k] for n in names])
            for k in ["loss:mean"] + [f"loss:{d}" for d in DOMAINS]}
    result["baselines"] = rank_baselines(table, weights, values)
    path.write_text(json.dumps(result, indent=1, default=float))


def baseline_predictions(table, weights: dict) -> dict[str, dict[str, list[float]]]:
    """The trivial rankers beside MergeMix's (lower = better, mixtures in sorted name order): a
    domain's loss by the domain's own weight (no training at all); the mean loss by closeness to
    uniform (``evaluate``'s uniform baseline score); and every metric by the same mixtures'
    mid-training runs at the next smaller proxy size (s1: a ladder's cost, not MergeMix's)."""
    from data_mixture.baselines import uniform_score

    names = sorted(weights)
    small = final_cells(table, ladder_size("s1"))[1]
    keys = ["loss:mean"] + [f"loss:{d}" for d in DOMAINS]
    return {
        "rank_by_weight": {f"loss:{d}": [-weights[n][d] for n in names] for d in DOMAINS},
        "closeness_to_uniform": {"loss:mean": uniform_score(np.array([[weights[n][d] for d in DOMAINS] for n in names]))},
        "smaller_proxy_s1": {k: [float(np.mean(small[n][k])) for n in names] for k in keys},
    }


def rank_baselines(table, weights: dict, values: dict) -> dict[str, dict[str, dict]]:
    """:func:`baseline_predictions` scored like the merges: Spearman against the seed means and
    decision accuracy."""
    from data_mixture.mergemix.rank import spearman

    names = sorted(weights)
    return {ranker: {k: {"spearman": spearman(np.array(p), np.array([np.mean(values[n][k]) for n in names])),
                         "decision": decision_scores(np.array(p), [values[n][k] for n in names])}
                     for k, p in by_key.items()}
            for ranker, by_key in baseline_predictions(table, weights).items()}


def merge_gaps(out: Path, rank: dict, fraction: float) -> dict[str, dict[str, dict]]:
    """Per expert seed and router at one expert budget: the merges' decision accuracy minus the best
    trivial ranker's that needs no training (closeness to uniform for the mean loss, the domain's own
    weight for a domain's loss), paired over the same mixture resamples; and, per expert seed, the
    budget's mean-loss decision accuracy minus each other budget's (linear router)."""
    from data_mixture.table import read_runs

    table = read_runs(out / "runs.csv")
    weights, values, _ = final_cells(table, ladder_size(LARGEST_PROXY))
    names = sorted(weights)
    base = baseline_predictions(table, weights)
    trivial = {"loss:mean": base["closeness_to_uniform"]["loss:mean"],
               **{f"loss:{d}": base["rank_by_weight"][f"loss:{d}"] for d in DOMAINS}}
    def pred(key, metric):
        return np.array([rank["proxy"][key][n][metric] for n in names])

    got = {}
    for seed in EXPERT_SEEDS:
        for router in ROUTERS:
            key = f"s{seed}/{fraction}/{router}"
            got[key] = {k: decision_gap(pred(key, k), np.array(p), [values[n][k] for n in names])
                        for k, p in trivial.items()}
        for other in FRACTIONS:  # the chosen budget against the others, on the mean loss (linear router)
            if other != fraction:
                got[f"s{seed}/{fraction} vs {other}/linear"] = {"loss:mean": decision_gap(
                    pred(f"s{seed}/{fraction}/linear", "loss:mean"), pred(f"s{seed}/{other}/linear", "loss:mean"),
                    [values[n]["loss:mean"] for n in names])}
    return got


def choose_default(rank: dict) -> tuple[float, str]:
    """The expert budget whose merges decide the mean held-out loss best (decision accuracy, mean
    over expert seeds and routers), then the paper's ``linear`` router unless another treatment beats
    it there by more than ``ROUTER_MARGIN`` (mean over seeds)."""
    def acc(seed, fraction, router):
        return rank["rank"][f"s{seed}/{fraction}/{router}"]["decision"]["loss:mean"]["accuracy"]

    fraction = max(FRACTIONS, key=lambda f: np.mean([acc(s, f, r) for s in EXPERT_SEEDS for r in ROUTERS]))
    by_router = {r: np.mean([acc(s, fraction, r) for s in EXPERT_SEEDS]) for r in ROUTERS}
    router = max(ROUTERS, key=by_router.get)
    if by_router[router] - by_router["linear"] <= ROUTER_MARGIN:
        router = "linear"
    return float(fraction), router


def stage_search(out: Path, root: Path, base: str, expert_tokens: float, fraction: float, router: str) -> dict:
    """``data_mixture mergemix`` per objective on the seed-0 experts (resumable, cached)."""
    results = {}
    for name, loss_weights in OBJECTIVES.items():
        dest = out / "mergemix" / f"search_{name}"
        args = ["mergemix", "--base", base, "--domains", ",".join(DOMAINS), "--expert-tokens", repr(expert_tokens),
                "--fractions", ",".join(map(str, FRACTIONS)), "--expert-fraction", str(fraction),
                "--experts-dir", str(root / "experts_s0"), "--router", router, "--search", "mergemix",
                "--budget", str(SEARCH_BUDGET), "--seeds", str(SEARCH_SEEDS), "--max-items", str(MERGE_MAX_ITEMS),
                "--loss-batches", str(MERGE_LOSS_BATCHES), "--cache", str(root / f"cache_search_{name}.jsonl"),
                "--out", str(dest), "--no-progress"]
        if loss_weights:
            args += ["--loss-weights", ",".join(f"{d}={w}" for d, w in loss_weights.items())]
        if not (dest / "summary.json").exists():
            dm(*args)
        results[name] = json.loads((dest / "summary.json").read_text())
    return results


def stage_mergemix(out: Path, root: Path, parallel: int) -> dict:
    base, expert_tokens = stage_experts(out, root, parallel)
    rank = stage_rank(out, root, base)
    fraction, router = choose_default(rank)
    searches = stage_search(out, root, base, expert_tokens, fraction, router)
    summary = {"expert_fraction": fraction, "expert_share_of_base": fraction * EXPERT_SHARE, "router": router,
               "optima": {name: s["mixture"] for name, s in searches.items()}}
    (out / "mergemix" / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def ladder_size(preset: str) -> float:
    return preset_sizes({preset: PRESETS[preset]})[preset]["params_active"]


def picks(out: Path) -> dict[str, dict]:
    """The target's candidate mixtures that exist so far: {name: {"weights", "why"}}."""
    from data_mixture.table import read_runs

    got: dict[str, dict] = {"uniform": {"weights": {d: 1.0 / len(DOMAINS) for d in DOMAINS}, "why": "uniform"}}
    weights, values, _ = final_cells(read_runs(out / "runs.csv"), ladder_size(LARGEST_PROXY))
    best = min(weights, key=lambda n: np.mean(values[n]["loss:mean"]))
    got["best_at_proxy"] = {"weights": weights[best], "why": f"{LARGEST_PROXY}_{best}: lowest mean loss at "
                                                             f"{LARGEST_PROXY} (seed mean)"}
    for name in TARGET_LADDER_MIXTURES:
        got[f"ladder_{name}"] = {"weights": weights[name], "why": f"ladder mixture {name}: more target mixtures for "
                                                                  "the laws' decision accuracy at the target"}
    ev = out / "evaluate_ladder" / "evaluation.json"
    if (out / "optima" / "camel.json").exists() and ev.exists():
        laws = json.loads(ev.read_text())["laws"]
        got["camel"] = {"weights": json.loads((out / "optima" / "camel.json").read_text())["weights"],
                        "why": "CAMEL's loss optimum at the target"}
        scored = {k: v for k, v in laws.items() if k != "camel" and "decision" in v}
        other = max(scored, key=lambda k: (scored[k]["decision"]["accuracy"], -scored[k]["mean"]["mae"]))
        got["best_other_law"] = {
            "weights": json.loads((out / "optima" / f"{other}.json").read_text())["weights"], "law": other,
            "why": f"{other}: the best decision accuracy on the held-out proxy size after CAMEL's "
                   f"({scored[other]['decision']['accuracy']:.3f})"}
    summary = out / "mergemix" / "summary.json"
    if summary.exists():
        for name, w in json.loads(summary.read_text())["optima"].items():
            got[f"mergemix_{name}"] = {"weights": w, "why": f"MergeMix's optimum, {name} objective"}
    return got


def stage_target(out: Path, root: Path, parallel: int) -> None:
    """Every pick so far continued from the target's base, 3 seeds each (``target_plan.json``); a
    pick equal to an earlier one (within 1e-6) is not trained twice."""
    from data_mixture.plan import continuation_runs

    chosen = picks(out)
    mixtures: dict[str, dict] = {}
    for name, p in chosen.items():
        same = [m for m, w in mixtures.items() if max(abs(w[d] - p["weights"][d]) for d in DOMAINS) < 1e-6]
        p["trained_as"] = same[0] if same else name
        if not same:
            mixtures[name] = {d: float(p["weights"][d]) for d in DOMAINS}
    spec = PlanSpec(budget_flops=1.0, target_size=1.0, target_tokens=1.0, presets=PRESETS, mid_training=True,
                    base_tokens_per_param=BASE_TOKENS_PER_PARAM, mid_tokens_per_param=(MID_TOKENS_PER_PARAM,))
    runs = continuation_runs(spec, TARGET, mixtures, TARGET_SEEDS)
    plan_path = out / "target_plan.json"
    plan = {"version": 1, "decision_rule": json.loads((out / "plan.json").read_text())["decision_rule"],
            "picks": chosen, "predicted": law_predictions(out, mixtures), "runs": runs,
            "notes": "Target runs of the mid-training study: each pick continued from the target's base, 3 seeds. "
                     "predicted: every law's mean target loss for each trained pick, from the fits on the whole "
                     "ladder; committed at db6b09a (2026-12-03 13:08:19 UTC), after the ten pilot target runs (the "
                     "base included), the three best_at_proxy target runs and s2_camel_s0 had started (report.md, "
                     "'Pre-registration')."}
    if not plan_path.exists() or json.loads(plan_path.read_text()) != json.loads(json.dumps(plan)):
        plan_path.write_text(json.dumps(plan, indent=1))
    sweep(plan_path, root / "target", parallel)
    shutil.copyfile(root / "target" / "runs.csv", out / "target_runs.csv")
    shutil.copyfile(root / "target" / "sweep.log", out / "sweep_target.log")


def target_cells(out: Path) -> dict[str, dict[int, dict[str, float]]]:
    """{trained pick: {seed: metrics}} of the target runs' final checkpoints."""
    import re

    from data_mixture.table import read_runs

    mid = read_runs(out / "target_runs.csv").law_rows()
    seed_r, got = mid.seeds(), {}
    for run in sorted(set(mid.run.tolist())):
        rows = np.flatnonzero(mid.run == run)
        i = rows[np.argmax(mid.tokens[rows])]
        name = re.fullmatch(rf"{TARGET}_(.+)_s\d+", run).group(1)
        metrics = {f"loss:{d}": float(mid.loss_rv[i, j]) for j, d in enumerate(mid.loss_domains)}
        metrics["loss:mean"] = float(mid.loss_rv[i].mean())
        got.setdefault(name, {})[int(seed_r[i])] = metrics
    return got


def compare(a: dict[int, dict], b: dict[int, dict], metric: str = "loss:mean") -> dict:
    """The plan's decision rule: a beats b when its seed mean is lower and the 95% paired
    t-interval of a - b excludes zero; otherwise they tie."""
    from data_mixture.decisions import seed_difference

    d = seed_difference(sorted((s, m[metric]) for s, m in a.items()), sorted((s, m[metric]) for s, m in b.items()))
    d["verdict"] = ("tie" if d["lo"] is None or d["lo"] <= 0 <= d["hi"] else "wins" if d["diff"] < 0 else "loses")
    return d


def law_predictions(out: Path, mixtures: dict[str, dict]) -> dict[str, dict[str, float]]:
    """{law: {pick: predicted mean target loss}} of every law fitted on the whole ladder."""
    from data_mixture.fit import Fit

    n, d = target_point()
    names = list(mixtures)
    mix_rm = np.array([[mixtures[k][dom] for dom in DOMAINS] for k in names])
    got = {}
    for law in LAWS:
        path = out / "fits" / f"{law}.json"
        if path.exists():
            fit = Fit.load(str(path), "fit")
            pred_rv = fit.predict_losses(np.full(len(names), n), np.full(len(names), d), mix_rm)
            got[law] = dict(zip(names, pred_rv.mean(axis=1).tolist()))
    return got


def report(out: Path) -> dict:
    """report.json + report.md from the committed results only (no run directory is read)."""
    plan, tplan = json.loads((out / "plan.json").read_text()), json.loads((out / "target_plan.json").read_text())
    chosen, cells = tplan["picks"], target_cells(out)
    trained = {name: p["trained_as"] for name, p in chosen.items() if p["trained_as"] in cells}
    cell = {name: cells[t] for name, t in trained.items()}
    summary = {name: {"mean": float(np.mean([m["loss:mean"] for m in c.values()])),
                      "sd": float(np.std([m["loss:mean"] for m in c.values()], ddof=1)) if len(c) > 1 else None,
                      "seeds": sorted(c)} for name, c in cell.items()}
    pairs = {}
    for a in cell:
        for b in cell:
            if a < b or a == b:
                continue
            pairs[f"{a} vs {b}"] = compare(cell[a], cell[b])
    predicted = {law: {name: p[trained[name]] for name in cell} for law, p in tplan["predicted"].items()}
    result = {"decision_rule": plan["decision_rule"], "picks": chosen, "target": summary, "comparisons": pairs,
              "predicted": predicted}
    for name in ("evaluate_ladder", "evaluate_target"):
        path = out / name / "evaluation.json"
        if path.exists():
            ev = json.loads(path.read_text())
            result[name] = {"verdict": ev["verdict"]["text"], "noise_floor": ev["noise_floor"],
                            "decision": {**{k: v["decision"] for k, v in ev["laws"].items() if "decision" in v},
                                         **{f"baseline:{k}": v["decision"] for k, v in ev["baselines"].items()
                                            if "decision" in v}}}
    rank_path = out / "mergemix" / "rank.json"
    if rank_path.exists():
        rank = json.loads(rank_path.read_text())
        result["mergemix"] = {"rank": {k: {"mean_loss_rho": r["mean_loss"], "decision": r["decision"]["loss:mean"],
                                           "domains": {d: {"rho": r["losses"][d], "decision": r["decision"][f"loss:{d}"]}
                                                       for d in DOMAINS}}
                                       for k, r in rank["rank"].items()},
                              "baselines": rank["baselines"]}
        if (out / "mergemix" / "summary.json").exists():
            result["mergemix"]["chosen"] = json.loads((out / "mergemix" / "summary.json").read_text())
        if all(f"s{s}/{f}/{r}" in rank["rank"] for s in EXPERT_SEEDS for f in FRACTIONS for r in ROUTERS):
            fraction = choose_default(rank)[0]
            result["mergemix"]["gaps"] = {"fraction": fraction, "by": merge_gaps(out, rank, fraction)}
    result["costs"] = costs(out)
    result["preregistration"] = preregistration(out)
    result["limits"] = limits(result, cell)
    result["limits"]["base_mean_loss"] = base_mean_loss(out)
    (out / "report.json").write_text(json.dumps(result, indent=1, default=float))
    (out / "report.md").write_text(report_md(result))
    plot_target(out, cell, summary)
    return result


def first_starts(*logs: Path) -> dict[str, str]:
    """{run: UTC time of its first ``NAME: start`` line} over sweep logs of the study day (earlier logs first)."""
    import re

    got: dict[str, str] = {}
    for log in logs:
        if log.exists():
            for m in re.finditer(r"^(\d\d:\d\d:\d\d) sweep: (\S+): start", log.read_text(), re.M):
                got.setdefault(m[2], f"{STUDY_DAY}T{m[1]}+00:00")
    return got


def preregistration(out: Path) -> dict:
    """Which target runs started before the rule and before the predictions were committed, by name
    (start times from the pilot's and the target sweep's logs; a target run copied from the pilot
    takes its pilot run's start). The study had no registration file: the commits are the record."""
    from data_mixture.register import parse_time

    pilot = first_starts(out.parent / "midtrain_pilot" / "sweep.log", out.parent / "midtrain_pilot" / "sweep_s2.log")
    target = first_starts(out / "sweep_target.log")
    runs = sorted(json.loads((out / "target_plan.json").read_text())["runs"], key=lambda r: r["name"])
    started = {}
    for r in runs:
        name = r["name"]
        if name in PILOT_NAMES and PILOT_NAMES[name] in pilot:
            started[name] = {"time": pilot[PILOT_NAMES[name]], "where": f"pilot run {PILOT_NAMES[name]}"}
        elif name in target:
            started[name] = {"time": target[name], "where": "target sweep"}
    unknown = sorted(r["name"] for r in runs if r["name"] not in started)

    def before(event):
        t = parse_time(event["time"])
        return sorted(n for n, s in started.items() if parse_time(s["time"]) < t)

    got = {"rule": RULE_COMMIT, "predictions": PREDICTIONS_COMMIT, "pilot": PILOT_COMMIT, "started": started,
           "before_rule": before(RULE_COMMIT), "before_predictions": before(PREDICTIONS_COMMIT), "start_unknown": unknown}
    got["pre_registered"] = not (got["before_rule"] or got["before_predictions"] or unknown)
    return got


def base_mean_loss(out: Path) -> float:
    """The target base's mean held-out loss at its final checkpoint (where every target run starts)."""
    from data_mixture.table import read_runs

    t = read_runs(out / "target_runs.csv")
    rows = np.flatnonzero(t.run == f"{TARGET}_base")
    return float(t.loss_rv[rows[np.argmax(t.tokens[rows])]].mean())


FIVE = ("uniform", "best_at_proxy", "camel", "best_other_law", "mergemix_loss")  # the picks of methods (not ladder points)


def limits(r: dict, cell: dict) -> dict:
    """What the target comparison can and cannot say: ties (could have come out otherwise), the
    smallest difference the 3-seed paired design detects (80% power, from each pair's seed sd of
    differences), and how each law's predicted order of the five method picks agrees with the
    observed (pairs right of 10; closeness to uniform beside them)."""
    from data_mixture import decisions as dec
    from data_mixture.baselines import uniform_score

    ties = [k for k, v in r["comparisons"].items() if v["verdict"] == "tie"]
    detect = {}
    for k in r["comparisons"]:
        a, b = k.split(" vs ")
        seeds = sorted(set(cell[a]) & set(cell[b]))
        if len(seeds) >= 2:
            d_s = [cell[a][s]["loss:mean"] - cell[b][s]["loss:mean"] for s in seeds]
            detect[k] = dec.detectable_difference(float(np.std(d_s, ddof=1)), len(seeds))
    five = [n for n in FIVE if n in r["target"]]
    obs = np.array([r["target"][n]["mean"] for n in five])
    order = {}
    weights = r["picks"]
    rankers = {law: np.array([p[n] for n in five]) for law, p in r["predicted"].items()}
    rankers["closeness to uniform"] = uniform_score(np.array([[weights[n]["weights"][d] for d in DOMAINS] for n in five]))
    i, j = np.triu_indices(len(five), 1)
    for name, pred in rankers.items():
        right = int(np.sum(np.sign(pred[i] - pred[j]) == np.sign(obs[i] - obs[j])))
        order[name] = {"pairs_right": right, "pairs": int(i.size), "order": [five[k] for k in np.argsort(pred)]}
    close = [k for k in r["comparisons"] if all(x in five for x in k.split(" vs "))]
    return {"ties": ties, "detectable": detect, "five": five, "observed_order": [five[k] for k in np.argsort(obs)],
            "span_five": float(obs.max() - obs.min()), "law_order": order,
            "five_ties": [k for k in close if r["comparisons"][k]["verdict"] == "tie"], "five_pairs": close}


def run_seconds(*logs: Path) -> dict[str, float]:
    """Wall seconds of each run a sweep.log reports ``NAME: done in N s`` for (a later log wins)."""
    import re

    got = {}
    for log in logs:
        if log.exists():
            got.update({m[1]: float(m[2]) for m in re.finditer(r"sweep: (\S+): done in (\d+) s", log.read_text())})
    return got


def costs(out: Path) -> dict:
    """Training FLOPs (6 N_active D) and run wall seconds of the ladder, MergeMix and brute force at the
    target. Wall seconds are the sum of the runs' own wall times (2 runs at a time on 2 cores); the
    s1 base and the s2 base were trained in the pilot, so their times come from its logs."""
    plan, tplan = json.loads((out / "plan.json").read_text()), json.loads((out / "target_plan.json").read_text())
    pilot = out.parent / "midtrain_pilot"
    secs = run_seconds(pilot / "sweep.log", pilot / "sweep_s2.log", out / "sweep_ladder.log", out / "sweep_target.log")
    ladder = [r for r in plan["runs"] if r["role"] in ("base", "mid")]
    target_mid = [r for r in tplan["runs"] if r["role"] == "mid"]
    target_base = next(r for r in tplan["runs"] if r["role"] == "base")

    def wall(runs):
        return float(sum(secs[r["name"]] for r in runs)) if all(r["name"] in secs for r in runs) else None

    run_s = float(np.median([secs[r["name"]] for r in target_mid if r["name"] in secs]))
    got = {"ladder": {role: {"flops": sum(r["flops"] for r in ladder if r["role"] == role),
                             "run_s": wall([r for r in ladder if r["role"] == role])} for role in ("base", "mid")},
           "target_base": {"flops": target_base["flops"], "run_s": secs.get(target_base["name"])},
           "target_run": {"flops": target_mid[0]["flops"], "run_s": run_s},
           "brute_force_target": {"runs": MIXTURES, "flops": MIXTURES * target_mid[0]["flops"], "run_s": MIXTURES * run_s},
           "note": "Training FLOPs 6 x N_active x tokens; evaluations not counted except MergeMix's merges, whose "
                   "evaluation is its whole search cost. Every method needs the target base (target_base). run_s: "
                   "the runs' own wall seconds, 2 at a time on 2 cores under the load of the day."}
    experts = run_seconds(out / "mergemix" / "sweep_experts_s0.log")  # the searches merge the seed-0 experts
    for name in OBJECTIVES:
        path = out / "mergemix" / f"search_{name}" / "summary.json"
        if path.exists():
            summary = json.loads(path.read_text())
            got[f"mergemix_{name}"] = {**summary["flops"], "search_s": summary["seconds"].get("search_mergemix"),
                                       "experts_run_s": float(sum(experts.values()))}
    return got


def _iv(x: dict) -> str:
    return f"{x['diff']:+.4f} [{x['lo']:+.4f}, {x['hi']:+.4f}]" if x.get("lo") is not None else f"{x['diff']:+.4f}"


def _acc(x: dict) -> str:
    return f"{x['accuracy']:.2f} [{x['lo']:.2f}, {x['hi']:.2f}]"


def report_md(r: dict) -> str:
    prereg = r.get("preregistration")
    status = ("pre-registered: the rule and the predictions were committed before every target run started" if prereg and
              prereg["pre_registered"] else "**not pre-registered** for every target run; see 'Pre-registration'")
    lines = ["# The mid-training mixture study", "", f"Decision rule (plan.json, {status}): "
             f"{r['decision_rule']['rule']}", "", "## Target runs", "",
             "| pick | why | weights (code, prose, math, knowledge) | mean loss (3 seeds) | sd |", "|---|---|---|---|---|"]
    for name, p in r["picks"].items():
        t = r["target"].get(name)
        w = ", ".join(f"{p['weights'][d]:.2f}" for d in DOMAINS)
        got = (f"{t['mean']:.4f} | {t['sd']:.4f}" if t and t["sd"] is not None else "not trained yet | ")
        lines.append(f"| {name} | {p['why']} | {w} | {got} |")
    lines += ["", "Paired comparisons (mean loss difference a - b, 95% paired t-interval over seeds):", "",
              "| a vs b | difference [95%] | verdict for a |", "|---|---|---|"]
    lines += [f"| {k} | {_iv(v)} | {v['verdict']} |" for k, v in r["comparisons"].items()]
    if r["predicted"]:
        names = list(r["target"])
        lines += ["", "## Predicted vs observed target loss (laws fitted on the whole ladder)", "",
                  "| law | " + " | ".join(names) + " |", "|---|" + "---|" * len(names),
                  "| observed | " + " | ".join(f"{r['target'][n]['mean']:.4f}" for n in names) + " |"]
        lines += [f"| {law} | " + " | ".join(f"{p[n]:.4f}" for n in names) + " |" for law, p in r["predicted"].items()]
    for name, title in (("evaluate_ladder", "the largest proxy size held out"), ("evaluate_target", "the target held out")):
        if name in r:
            ev = r[name]
            noisy = [c["run"].split("+")[0].rsplit("_s", 1)[0] for f in ev["noise_floor"].values()
                     for c in f.get("per_cell", []) if c["noisy"]]
            lines += ["", f"## Decision accuracy, {title} ({name}/evaluation.md)", "", f"**{ev['verdict']}**", "",
                      "A pair is within the noise when its difference is below 2 x sqrt(s_a^2/n_a + s_b^2/n_b), s each "
                      "mixture's own seed sd (per pair, not one pooled figure); cells flagged noisy (variance above "
                      f"the others' at the 99% F quantile): {', '.join(noisy) or 'none'}.", "",
                      "| method | decision accuracy on the mean loss [95%] | pairs within noise |", "|---|---|---|"]
            lines += [f"| {k} | {_acc(v)} | {v['pairs_within_noise']} |" for k, v in ev["decision"].items()]
    if "mergemix" in r:
        m = r["mergemix"]
        lines += ["", "## MergeMix in its own setting (experts from the largest proxy's base)", "",
                  "Merges of the 12 ladder mixtures against the mid-training runs of that size (2 seeds): Spearman of "
                  "the mean held-out loss and decision accuracy on it, per expert seed / expert budget (fraction of "
                  "the 40% expert run) / router.", "",
                  "| experts / budget / router | Spearman mean loss [95%] | decision accuracy [95%] |", "|---|---|---|"]
        for k, v in m["rank"].items():
            rho = v["mean_loss_rho"]
            lines.append(f"| {k} | {rho['rho']:.2f} [{rho['lo']:.2f}, {rho['hi']:.2f}] | {_acc(v['decision'])} |")
        lines += ["", "Decision accuracy [95%] per domain's loss, and the trivial rankers beside the merges (a ranker "
                  "of the mean loss or of one domain's loss):", "",
                  "| ranker | mean loss | " + " | ".join(DOMAINS) + " |", "|---|---|" + "---|" * len(DOMAINS)]
        for k, v in m["rank"].items():
            lines.append(f"| merges {k} | {_acc(v['decision'])} | "
                         + " | ".join(_acc(v["domains"][d]["decision"]) for d in DOMAINS) + " |")
        for ranker, by_key in m["baselines"].items():
            lines.append(f"| {ranker} | " + " | ".join(_acc(by_key[k]["decision"]) if k in by_key else ""
                                                        for k in ["loss:mean"] + [f"loss:{d}" for d in DOMAINS]) + " |")
        if "gaps" in m:
            g = m["gaps"]
            lines += ["", f"Merges minus the best trivial ranker that needs no training, at the chosen budget "
                          f"({g['fraction']:g} of the expert run): decision accuracy difference [paired 95%]; the "
                          "mean loss against closeness to uniform, each domain against its own weight.", "",
                      "| merges | mean loss | " + " | ".join(DOMAINS) + " |", "|---|---|" + "---|" * len(DOMAINS)]
            keys = ["loss:mean"] + [f"loss:{d}" for d in DOMAINS]
            lines += [f"| {k} | " + " | ".join(_iv(v[key]) if key in v else "" for key in keys) + " |"
                      for k, v in g["by"].items() if " vs " not in k]
            lines += ["", "The chosen budget against the others (mean loss, linear router, decision accuracy difference "
                          "[paired 95%]):", "", "| comparison | difference |", "|---|---|"]
            lines += [f"| {k} | {_iv(v['loss:mean'])} |" for k, v in g["by"].items() if " vs " in k]
        if "chosen" in m:
            c = m["chosen"]
            lines += ["", f"Chosen: expert budget {c['expert_share_of_base']:.0%} of the base's tokens, router "
                          f"{c['router']}."]
    if prereg:
        lines += _preregistration_md(prereg)
    if "limits" in r:
        lines += _limits_md(r)
    c = r["costs"]

    def row(what, x):
        return f"| {what} | {x['flops']:.3g} | {x['run_s'] / 60:.0f} |" if x.get("run_s") else f"| {what} | {x['flops']:.3g} | |"

    lines += ["", "## Cost (training FLOPs 6 N_active D; run minutes: the runs' own wall time, 2 at a time on 2 cores)",
              "", "| what | FLOPs | run minutes |", "|---|---|---|",
              row("ladder: 3 proxy bases", c["ladder"]["base"]), row("ladder: mid-training runs", c["ladder"]["mid"]),
              row("target base (every method needs it)", c["target_base"]),
              row(f"brute force: {c['brute_force_target']['runs']} mixtures at the target", c["brute_force_target"])]
    for name in OBJECTIVES:
        if f"mergemix_{name}" in c:
            f = c[f"mergemix_{name}"]
            lines.append(f"| MergeMix ({name} objective): its base {f['base']:.3g} (the ladder's s1b base) + experts "
                         f"{f['experts']:.3g} (4 x the chosen budget) + {f['merges_evaluated']} merge evaluations "
                         f"{f['merges']:.3g} | {f['total_with_base']:.3g} | experts {f['experts_run_s'] / 60:.0f} "
                         f"(trained to 40% for the budget study, with every checkpoint evaluated) + search "
                         f"{f['search_s'] / 60:.0f} |")
    return "\n".join(lines) + "\n"


def _preregistration_md(p: dict) -> list[str]:
    def when(e):
        return f"{e['commit']} at {e['time'][11:19]} UTC"

    lines = ["", "## Pre-registration", "",
             ("The rule and the predictions were committed before every target run started." if p["pre_registered"] else
              "**Not pre-registered.** The study wrote no registration file; git and the sweep logs are the record "
              f"(start times from the pilot's and the target sweep's logs, {STUDY_DAY}, UTC). The rule was committed "
              f"at {when(p['rule'])}; the laws' predictions (target_plan.json) at {when(p['predictions'])}."), ""]
    if p["before_rule"]:
        lines.append(f"- Started before the rule ({len(p['before_rule'])}): "
                     + ", ".join(f"{n} ({p['started'][n]['time'][11:19]}, {p['started'][n]['where']})" for n in p["before_rule"])
                     + f". All are the pilot's s2 runs: every loss of the other nine is identical to the pilot's "
                       f"runs.csv committed at {when(p['pilot'])}, 48 minutes before the rule; s2_ladder_m2_s2 was cut "
                       "short in the pilot and finished by the target sweep (attempt 2, resumed from step 184).")
    later = [n for n in p["before_predictions"] if n not in p["before_rule"]]
    if later:
        lines.append(f"- Started after the rule but before the predictions were committed ({len(later)}): "
                     + ", ".join(f"{n} ({p['started'][n]['time'][11:19]})" for n in later)
                     + "; s2_best_at_proxy_s0 and _s1 had finished (12:57) before that commit.")
    if p["start_unknown"]:
        lines.append(f"- No start time in the logs: {', '.join(p['start_unknown'])}.")
    lines += ["", "The comparisons that involve these runs were decided by a rule written after (or, for the pilot "
                  "runs, while) their outcome could be seen. `data_mixture register` and `evaluate --registration` now "
                  "check this; the table here predates them."]
    return lines


def _limits_md(r: dict) -> list[str]:
    lm = r["limits"]
    det = lm["detectable"]
    five_det = [det[k] for k in lm["five_pairs"] if k in det]
    lines = ["", "## Limits and conclusions", "",
             f"- **Could have come out otherwise.** {len(lm['ties'])} of {len(r['comparisons'])} comparisons are ties by "
             f"the rule (interval across 0): their order is not established. Among the five methods' picks "
             f"({', '.join(lm['five'])}) all {len(lm['five_ties'])} of {len(lm['five_pairs'])} pairs are ties: they "
             f"span {lm['span_five']:.4f} nats, and the design cannot tell them apart.",
             f"- **Smallest detectable effect.** With 3 seeds, paired, 95% two-sided and 80% power, a pair is detected "
             f"reliably only when the true difference exceeds (t_0.975,2 + t_0.8,2) sd_d / sqrt 3, sd_d the sd of that "
             f"pair's per-seed differences: {min(det.values()):.4f}-{max(det.values()):.4f} nats over all pairs, "
             + (f"{min(five_det):.4f}-{max(five_det):.4f} among the five picks" if five_det else "")
             + f" (median {float(np.median(list(det.values()))):.4f}). The five picks' span, {lm['span_five']:.4f}, "
               "is below that.",
             f"- **Predicted order vs observed.** Observed order of the five picks (best first): "
             f"{', '.join(lm['observed_order'])}."]
    for name, o in lm["law_order"].items():
        lines.append(f"  - {name}: {o['pairs_right']} of {o['pairs']} pairs in the observed order (predicted best "
                     f"first: {', '.join(o['order'])})")
    camel = lm["law_order"].get("camel")
    reverse = [n for n, o in lm["law_order"].items() if o["order"] == lm["observed_order"][::-1]]
    if reverse:
        lines.append(f"- {', '.join(reverse)}: the predicted order is the exact reverse of the observed one.")
    if camel and lm["observed_order"][-1] == "camel":
        lines.append(f"- CAMEL's pick is numerically the worst of the five (mean {r['target']['camel']['mean']:.4f}); "
                     f"CAMEL orders {camel['pairs_right']} of {camel['pairs']} pairs of the five as observed. None of "
                     "these pairs is decided, so this is an observation about the point estimates, not a result.")
    gain = lm.get("base_mean_loss", float("nan")) - r["target"]["uniform"]["mean"]
    lines += [f"- **What the answer means.** The objective (the equal-weighted loss of the four training domains) makes "
              f"the uniform mixture close to optimal by construction, and the whole mid-training phase (uniform) lowers "
              f"the mean loss by {gain:.4f} nats from the target base's {lm.get('base_mean_loss', float('nan')):.4f}: the "
              "study cannot show that any law picks better than uniform, nor that one cannot. A decision that matters "
              "needs a target that is not the training mix, sources of unequal size, and a pre-registration checked by "
              "the tools."]
    return lines


def plot_target(out: Path, cell: dict, summary: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = sorted(summary, key=lambda n: summary[n]["mean"])
    fig, ax = plt.subplots(figsize=(7, 0.5 * len(names) + 1.5))
    for y, n in enumerate(names):
        ax.scatter([m["loss:mean"] for m in cell[n].values()], [y] * len(cell[n]), color="0.6", s=14)
        ax.scatter([summary[n]["mean"]], [y], color="C0", marker="D")
    ax.set_yticks(range(len(names)), names)
    ax.set_xlabel("mean held-out loss at the target (seeds grey, mean blue)")
    fig.tight_layout()
    fig.savefig(out / "target.png", dpi=120)
    plt.close(fig)


def stage_report(out: Path) -> None:
    """The target evaluation (redone when the target table changed) and the report."""
    import hashlib

    if (out / "target_runs.csv").exists():
        runs = [out / "runs.csv", out / "target_runs.csv"]
        digest = hashlib.sha256(b"".join(p.read_bytes() for p in runs)).hexdigest()
        stamp = out / "evaluate_target" / "inputs.sha256"
        if not stamp.exists() or stamp.read_text().strip() != digest:
            dm("evaluate", "--runs", *map(str, runs), "--laws", ",".join(LAWS), "--size-column", SIZE_COLUMN, "--out-dir",
               str(out / "evaluate_target"), "--force")
            stamp.write_text(digest + "\n")
        rescore_rank(out)
        print(report_md(report(out)))


STAGES = ("plan", "ladder", "fit", "target", "mergemix", "report")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stage", choices=STAGES + ("all",), default="all")
    ap.add_argument("--out", default="experiments/studies/results/midtrain_v1", help="committed results")
    ap.add_argument("--root", default="runs/midtrain_v1", help="run directories (not committed)")
    ap.add_argument("--parallel", type=int, default=2)
    add_verbosity_flags(ap)
    args = ap.parse_args(argv)
    setup_logging(args.verbosity)
    out, root = Path(args.out), Path(args.root)
    out.mkdir(parents=True, exist_ok=True)
    todo = STAGES if args.stage == "all" else (args.stage,)
    if "plan" in todo:
        stage_plan(out)
    if "ladder" in todo:
        stage_ladder(out, root, args.parallel)
    if "fit" in todo:
        stage_fit(out)
    if "target" in todo:  # the laws' and baselines' picks first, so they train while MergeMix is made
        stage_target(out, root, args.parallel)
    if "mergemix" in todo:
        stage_mergemix(out, root, args.parallel)
        if "target" in todo:  # MergeMix's picks join the target runs
            stage_target(out, root, args.parallel)
    if "report" in todo:
        stage_report(out)


if __name__ == "__main__":
    main()
