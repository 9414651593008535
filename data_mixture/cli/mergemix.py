"""``python -m data_mixture mergemix``: MergeMix's mixture from merged per-domain experts
(:func:`data_mixture.mergemix.pipeline.run`); a rerun resumes."""

from __future__ import annotations

import argparse
import json

from data_mixture.cli.flags import PROG, UsageError, parse_weights, path_type, progress

HELP = ("MergeMix: train one expert per domain from a base, merge them on device, search the merge "
        "weights; the best is the mixture (OUT/mixture.json). Rerun to resume.")
EXAMPLE = (f"{PROG} mergemix --base runs/base --domains code,prose,math,knowledge --expert-tokens 2e5 "
           "--out results/mergemix --budget 60\n"
           "./launch.sh experiments/configs/tiny_moe.py --config.data.mixture_file=results/mergemix/mixture.json")
INTERRUPTED = "the trained experts and every evaluated merge are kept in --out; rerun the same command to resume."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base", type=path_type, required=True, help="base workdir (a moejax training run)")
    p.add_argument("--step", type=int, default=None, help="base checkpoint step (default: its latest)")
    p.add_argument("--domains", required=True, help="training domains, comma-separated: one expert each")
    p.add_argument("--expert-tokens", type=float, required=True,
                   help="training tokens per expert (the paper: a few percent of the base's tokens)")
    p.add_argument("--out", type=path_type, required=True,
                   help="output directory (experts/, cache.jsonl, mixture.json, search_*.json, plots)")
    p.add_argument("--fractions", default="0.125,0.25,0.5,1",
                   help="expert checkpoints kept, as fractions of --expert-tokens (default 0.125,0.25,0.5,1)")
    p.add_argument("--expert-fraction", type=float, default=1.0, help="which kept checkpoint is merged (default 1)")
    p.add_argument("--experts-dir", type=path_type, default="",
                   help="experts directory (default OUT/experts; reused when trained)")
    p.add_argument("--router", default="linear", help="router treatment: linear (paper) | base | harc (calibrated)")
    p.add_argument("--search", default="mergemix", help="mergemix (regressor-guided, the paper) | cmaes | both")
    p.add_argument("--budget", type=int, default=60, help="merges evaluated per search (default 60)")
    p.add_argument("--seeds", type=int, default=40, help="seed design of the mergemix search (default 40)")
    p.add_argument("--task-weights", nargs="*", action="extend",
                   help="objective: benchmark weights, e.g. know_type=2,math_copy=1 "
                                                      "(default: macro-average of every benchmark)")
    p.add_argument("--loss-weights", nargs="*", action="extend",
                   help="objective: held-out loss weights (count negatively), e.g. code=1")
    p.add_argument("--bench-metric", default="accuracy",
                   help="what each benchmark term is: accuracy (default; exact match for generation tasks) | "
                        "gold_logprob (mean log-probability of the gold answer: continuous, no extra forward)")
    p.add_argument("--min-weight", nargs="*", action="extend",
                   help="per-domain floors of the merge weights, e.g. code=0.05,math=0.05")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--backend", default="local", help="experts' training: local | ray")
    p.add_argument("--parallel", type=int, default=1, help="experts trained at once")
    p.add_argument("--max-items", type=int, default=64, help="benchmark items per task per merge")
    p.add_argument("--loss-batches", type=int, default=4, help="held-out batches per domain per merge")
    p.add_argument("--calib-batches", type=int, default=2, help="harc: training-split batches per domain")
    p.add_argument("--damping", type=float, default=0.1, help="harc: pull towards the linearly merged router")
    p.add_argument("--cache", type=path_type, default="", help="evaluation cache JSONL (default OUT/cache.jsonl)")
    p.add_argument("--expert-eval-args", default="--max-items 8 --loss-batches 1",
                   help="moejax.eval flags for the experts' own checkpoints (the sweep runner evaluates each)")
    p.add_argument("--no-progress", action="store_true")


def run(args: argparse.Namespace) -> None:
    fractions = _floats(args.fractions, "--fractions")
    task_weights = parse_weights(args.task_weights, "--task-weights") or None
    loss_weights = parse_weights(args.loss_weights, "--loss-weights") or None
    min_weight = parse_weights(args.min_weight, "--min-weight")

    from data_mixture.mergemix.pipeline import Options, run as run_mergemix

    summary = run_mergemix(Options(
        base=args.base, step=args.step, domains=tuple(d.strip() for d in args.domains.split(",") if d.strip()),
        expert_tokens=args.expert_tokens, out=args.out, fractions=fractions,
        expert_fraction=args.expert_fraction, router=args.router, search=args.search, budget=args.budget,
        n_seeds=args.seeds, task_weights=task_weights, loss_weights=loss_weights, bench_metric=args.bench_metric,
        min_weight=min_weight, seed=args.seed, backend=args.backend,
        parallel=args.parallel, max_items=args.max_items, loss_batches=args.loss_batches,
        calib_batches=args.calib_batches, damping=args.damping, experts_dir=args.experts_dir, cache=args.cache,
        expert_eval_args=args.expert_eval_args,
        progress=progress(args),
    ))
    print(json.dumps({k: summary[k] for k in ("mixture", "best_method", "searches", "merges_evaluated")}, indent=1))


def _floats(text: str, flag: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.split(","))
    except ValueError:
        raise UsageError(f"{flag} {text!r}: expected comma-separated numbers, e.g. {flag} 0.25,0.5,1") from None
