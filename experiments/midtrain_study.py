"""The mid-training mixture study: a 4-size ladder, laws vs baselines, target runs with 3 seeds.

    ./launch.sh python -m experiments.midtrain_study            # every stage; each skips what exists

Stages (``--stage NAME`` runs one; results in ``--out``, runs under ``--root``):

1. ``plan``    the ladder plan: one uniform base per size (20 tokens/param), 12 space-filling mixtures
               continued from each proxy base for 4 tokens/param, 2 seeds at the largest proxy; the
               decision rule is written into the plan before any target run.
2. ``ladder``  ``data_mixture sweep`` of the ladder plan; the runs table is copied to ``--out``.

The sizes and ``T_mid`` come from the pilot (data_mixture/results/midtrain_pilot/pilot.md): at 4
tokens/param of mid-training the mixtures' mean held-out loss spreads over 5-7 seed standard errors
(3 seeds) and the per-domain losses over 4.5-45, so the ladder keeps the pilot's T_mid.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

from data_mixture.plan import PlanSpec, make_plan, preset_sizes

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
EVAL_ARGS = "--max-items 128"
DECISION_RULE = {
    "metric": "loss:mean at the final checkpoint (mean held-out loss over the validation domains)",
    "seeds": list(TARGET_SEEDS),
    "rule": ("mixture X beats mixture Y at the target when the mean of X's loss over the 3 seeds is lower and the "
             "95% t-interval of the paired difference X - Y (paired by train seed, 2 degrees of freedom) excludes "
             "zero; otherwise X and Y tie."),
    "fixed": "written into this plan before any target run",
}


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
    cmd = [sys.executable, "-m", "data_mixture", "sweep", "--plan", str(plan), "--root", str(root),
           "--parallel", str(parallel), "--eval-args", EVAL_ARGS]
    print("+", " ".join(cmd), flush=True)
    rc = subprocess.call(cmd)
    if rc != 0:
        raise SystemExit(f"sweep of {plan} exited {rc}; rerun the stage to resume it")


def stage_ladder(out: Path, root: Path, parallel: int) -> None:
    if (out / "runs.csv").exists():
        print(f"ladder: {out / 'runs.csv'} exists (kept)")
        return
    sweep(out / "plan.json", root / "ladder", parallel)
    shutil.copyfile(root / "ladder" / "runs.csv", out / "runs.csv")


STAGES = ("plan", "ladder")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stage", choices=STAGES + ("all",), default="all")
    ap.add_argument("--out", default="data_mixture/results/midtrain_v1", help="committed results")
    ap.add_argument("--root", default="runs/midtrain_v1", help="run directories (not committed)")
    ap.add_argument("--parallel", type=int, default=2)
    args = ap.parse_args(argv)
    out, root = Path(args.out), Path(args.root)
    out.mkdir(parents=True, exist_ok=True)
    todo = STAGES if args.stage == "all" else (args.stage,)
    if "plan" in todo:
        stage_plan(out)
    if "ladder" in todo:
        stage_ladder(out, root, args.parallel)


if __name__ == "__main__":
    main()
