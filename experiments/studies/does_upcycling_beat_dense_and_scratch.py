"""Does upcycling a dense model beat continuing it, and training the MoE from scratch, at equal compute?

    nice -n 10 taskset -c 0 ./launch.sh python -m experiments.studies.does_upcycling_beat_dense_and_scratch
    ./launch.sh python -m experiments.studies.does_upcycling_beat_dense_and_scratch --stage report

On the built-in corpus (uniform mixture of its four domains), for each seed s in 0, 1, 2:

- ``dense``: a dense model (d_model 64, 2 layers, SwiGLU width 256) trained ``N`` steps;
- then, each for the same additional training FLOPs (those of ``M`` dense steps; FLOPs per token
  by :func:`moejax.model.transformer.flops_per_token`), from a fresh optimizer (warmup + cosine over
  the phase) on the same phase-2 data order:
  (a) ``dense_cont``: the dense model continued;
  (b) ``copy``: ``moejax upcycle --method copy`` (8 experts of the dense width, top-2, softmax
  renormalised; the start computes the dense model), trained;
  (c) ``drop``: the same with ``--method drop --drop-ratio 0.5`` (Drop-Upcycling);
- (d) ``scratch``: the same MoE from a random init for the FLOPs of N dense steps plus the
  additional ones.

Every MoE run uses moejax's default balancing (Switch aux loss 1e-2 + z-loss 1e-3) and the dropless
dispatch. Held-out loss per domain (the fixed held-out windows, the same for every run) is taken at
five equally spaced points of each run; routing health (MaxVio per batch, expert loads) at every
10th step. The decision rule, written before the runs, is in ``RULE`` (``plan.json``).

Stages skip what exists: a run directory with ``done`` is not retrained, and its summary
(``results/upcycling_v1/summaries/<name>.json``, small, committed) is rewritten only when missing. The
work directories (checkpoints) go under ``--work`` (default ``runs/upcycling_study``, not committed).
``--stage report`` writes ``table.json``, ``report.md`` and ``curves.png`` from the summaries that
exist (saying which are missing).
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np

from moejax.config import default_config
from moejax.log import add_verbosity_flags, setup_logging
from moejax.model.transformer import flops_per_token
from moejax.upcycle import Plan, upcycle, upcycled_config

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "upcycling_v1")
SEEDS = (0, 1, 2)
N_STEPS, M_STEPS = 200, 200  # dense pretraining; the additional budget in dense steps
POINTS = 5  # held-out evaluations per run (besides step 0)
EXPERTS, TOP_K, DROP_RATIO = 8, 2, 0.5
ARMS = ("dense_cont", "copy", "drop", "scratch")
COMPARISONS = (("copy", "dense_cont"), ("drop", "dense_cont"), ("copy", "scratch"), ("drop", "scratch"),
               ("drop", "copy"))
RULE = {
    "metric": "eval_loss: the unweighted mean over the 4 domains of the held-out cross-entropy (nats/token) at "
              "the end of each run, all runs at equal total training FLOPs (dense pretraining included)",
    "pairing": "by seed: seed s fixes the dense model's init and data, the upcycle draws and the phase-2 data order",
    "interval": "for each comparison A - B: the 3 per-seed differences d_s; mean(d) +/- t(0.975, df=2) * sd(d) / "
                "sqrt(3), t = 4.303 (sd with ddof=1)",
    "decision": "A beats B when the whole interval is below 0, loses when above 0, otherwise no difference "
                "shown; each comparison on its own (5 comparisons, no multiplicity correction: read a "
                "borderline interval as no difference)",
    "how_soon": "at each of the 5 equally spaced points of phase 2 (the same share of the additional FLOPs "
                "for every arm) the same interval for copy/drop - dense_cont; 'how soon' is the first point "
                "from which every later interval is below 0",
    "per_domain": "the same intervals per domain, reported beside the mean (not part of the decision)",
    "routing": "MaxVio (max expert load / mean load - 1, per batch, max over layers) and the smallest expert's "
               "share of the assignments, averaged over the last 20% of logged steps of each MoE run; "
               "reported with the same intervals, not part of the decision",
    "comparisons": [f"{a} - {b}" for a, b in COMPARISONS],
}


def base_config(steps: int, seed: int):
    c = default_config()
    t = c.train
    t.steps, t.seed, t.global_batch_size, t.seq_len = steps, seed, 16, 64
    t.log_every, t.eval_every, t.eval_batches = 10, max(steps // POINTS, 1), 4
    c.checkpoint.every_steps = steps
    c.checkpoint.max_to_keep = 1
    c.optim.warmup_steps = max(steps // 10, 1)
    c.mesh.data = 1
    m = c.model
    m.d_model, m.num_layers, m.num_heads, m.num_kv_heads, m.head_dim = 64, 2, 4, 2, 16
    m.mlp_dim, m.first_k_dense = 256, 2  # every layer dense
    return c


def plan_for(method: str, seed: int) -> Plan:
    return Plan(experts=EXPERTS, top_k=TOP_K, method=method, drop_ratio=DROP_RATIO, seed=seed)


def moe_steps(extra_dense_steps: int) -> int:
    """MoE steps with the FLOPs of ``extra_dense_steps`` dense steps, rounded to a multiple of POINTS."""
    dense = base_config(1, 0)
    moe = upcycled_config(dense, plan_for("copy", 0))
    ratio = flops_per_token(dense.model, dense.train.seq_len) / flops_per_token(moe.model, moe.train.seq_len)
    return max(POINTS, int(round(extra_dense_steps * ratio / POINTS)) * POINTS)


def run_configs(seed: int, work: str) -> dict:
    """name -> (config, upcycle method or None) for the runs of one seed, in the order they run."""
    phase2 = 100 + seed  # the phase-2 data order, shared by the three continuations
    dense = base_config(N_STEPS, seed)
    cont = base_config(M_STEPS, phase2)
    cont.checkpoint.init_from = os.path.join(work, f"dense_s{seed}")
    runs = {f"dense_s{seed}": (dense, None), f"dense_cont_s{seed}": (cont, None)}
    for method in ("copy", "drop"):
        moe = upcycled_config(base_config(moe_steps(M_STEPS), phase2), plan_for(method, seed))
        moe.train.eval_every = moe.train.steps // POINTS
        moe.checkpoint.every_steps = moe.train.steps
        moe.checkpoint.init_from = os.path.join(work, f"upcycled_{method}_s{seed}")
        runs[f"{method}_s{seed}"] = (moe, method)
    scratch = upcycled_config(base_config(moe_steps(N_STEPS + M_STEPS), seed), plan_for("copy", seed))
    scratch.train.eval_every = scratch.train.steps // POINTS
    scratch.checkpoint.every_steps = scratch.train.steps
    runs[f"scratch_s{seed}"] = (scratch, None)
    return runs


def summarize(name: str, cfg, workdir: str, start_flops: float) -> dict:
    """The small record of a finished run: held-out curve (with cumulative training FLOPs) and routing."""
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    tokens = cfg.train.global_batch_size * cfg.train.seq_len
    fpt = flops_per_token(cfg.model, cfg.train.seq_len)
    evals = [
        {"step": r["step"], "fraction": r["step"] / cfg.train.steps, "flops": start_flops + fpt * tokens * r["step"],
         "eval_loss": r["eval_loss"], "domains": {k.split("/", 1)[1]: v for k, v in r.items() if k.startswith("eval_loss/")}}
        for r in records if "eval_loss" in r
    ]
    routing = [
        {"step": r["step"], "max_vio": r["max_vio"], "min_share": float(np.min(r["expert_load"])),
         "router_entropy": r.get("router_entropy")}
        for r in records if "max_vio" in r
    ]
    return {"name": name, "steps": cfg.train.steps, "flops_per_token": fpt, "tokens_per_step": tokens,
            "start_flops": start_flops, "evals": evals, "routing": routing}


def run_all(work: str, seeds: tuple[int, ...]) -> None:
    from moejax.train.loop import train

    os.makedirs(os.path.join(RESULTS, "summaries"), exist_ok=True)
    for seed in seeds:
        runs = run_configs(seed, work)
        dense_cfg = runs[f"dense_s{seed}"][0]
        dense_flops = flops_per_token(dense_cfg.model, dense_cfg.train.seq_len) * \
            dense_cfg.train.global_batch_size * dense_cfg.train.seq_len * N_STEPS
        for name, (cfg, method) in runs.items():
            workdir = os.path.join(work, name)
            if method is not None and not os.path.isdir(cfg.checkpoint.init_from):
                upcycle(os.path.join(work, f"dense_s{seed}"), cfg.checkpoint.init_from, plan_for(method, seed))
            if not os.path.isfile(os.path.join(workdir, "done")):
                train(cfg, workdir)
                open(os.path.join(workdir, "done"), "w").close()
            summary_path = os.path.join(RESULTS, "summaries", f"{name}.json")
            if not os.path.isfile(summary_path):
                start = 0.0 if name.startswith(("dense_s", "scratch")) else dense_flops
                with open(summary_path, "w") as f:
                    json.dump(summarize(name, cfg, workdir, start), f, indent=1)


def write_plan() -> None:
    """plan.json: the setting and the rule; refuses to change a registered one."""
    path = os.path.join(RESULTS, "plan.json")
    plan = {"rule": RULE, "seeds": list(SEEDS), "dense_steps": N_STEPS, "additional_dense_steps": M_STEPS,
            "moe_steps_phase2": moe_steps(M_STEPS), "moe_steps_scratch": moe_steps(N_STEPS + M_STEPS),
            "experts": EXPERTS, "top_k": TOP_K, "drop_ratio": DROP_RATIO, "points": POINTS}
    os.makedirs(RESULTS, exist_ok=True)
    if os.path.isfile(path):
        with open(path) as f:
            registered = json.load(f)
        if registered != plan:
            raise SystemExit(f"{path} registers another setting than this code; the study runs as registered. "
                             "Start a new results directory for a new setting.")
        return
    with open(path, "w") as f:
        json.dump(plan, f, indent=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stage", choices=("plan", "run", "report", "all"), default="all")
    parser.add_argument("--work", default="runs/upcycling_study", help="work directories (checkpoints)")
    parser.add_argument("--seeds", default=",".join(map(str, SEEDS)))
    add_verbosity_flags(parser)
    args = parser.parse_args()
    setup_logging(args.verbosity)
    if args.stage in ("plan", "run", "all"):
        write_plan()
    if args.stage in ("run", "all"):
        run_all(os.path.abspath(args.work), tuple(int(s) for s in args.seeds.split(",")))
    if args.stage in ("report", "all"):
        from experiments.studies.upcycling_report import report

        print(report(RESULTS, SEEDS, ARMS, COMPARISONS))


if __name__ == "__main__":
    main()
