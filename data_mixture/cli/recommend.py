"""``python -m data_mixture recommend``: one command from a runs table to a mixture to train
(:func:`data_mixture.recommendation.recommend`)."""

from __future__ import annotations

import argparse

from data_mixture.cli.flags import (FORCE_HELP, PROG, TARGET_HELP, UsageError, dataset_path_type, input_path_type,
                                    parse_weights, path_type)

HELP = ("From a runs table to a mixture to train: fit every law the table supports, score each by held-out "
        "decision accuracy beside the practitioner rules, and recommend the best law's robust pick or the rule.")
EXAMPLE = (f"{PROG} recommend --runs runs.csv --target knowledge=0.75,prose=0.25 --size 6e5 --tokens 1.2e7 "
           "--unique-tokens knowledge=2.5e5 --out recommendation")
INTERRUPTED = "nothing was written (--out is written only at the end). Rerun the command."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runs", type=path_type, required=True, nargs="+", action="extend",
                   help="runs table CSV (several files with the same columns are concatenated)")
    p.add_argument("--target", default=None, help="what the mixture is for (default: the mean over the validation "
                                                  "domains): " + TARGET_HELP)
    p.add_argument("--size", type=float, required=True, help="the model size to train: its parameter count in --size-column "
                                                                  "(params_active: used per token, the default; "
                                                                  "params_total: every parameter)")
    p.add_argument("--tokens", type=float, required=True, help="the tokens it trains for")
    p.add_argument("--unique-tokens", nargs="*", help="unique tokens of each scarce domain's pool at the target, e.g. "
                                                     "knowledge=2.5e5 (default: each domain's largest pool in the table)")
    p.add_argument("--size-column", default="params_active", choices=("params_total", "params_active"),
                   help="which parameter count --size and the table's sizes mean (default params_active)")
    p.add_argument("--laws", default=None, help="comma-separated laws to consider (default: every law the table "
                                                "supports)")
    p.add_argument("--bootstrap", type=int, default=50, help="bootstrap members of the best law's fit (default 50)")
    p.add_argument("--max-epochs", type=float, default=16.0,
                   help="the law's pick repeats each pool at most this many epochs at --tokens (default 16, the "
                        "practitioner rule's larger cap; 0: no cap)")
    p.add_argument("--robust", default="mean", help="'mean' (default) or a quantile 'q90' of the members' predictions")
    p.add_argument("--starts", type=int, default=16, help="random starts of each law's fit")
    p.add_argument("--resamples", type=int, default=1000, help="bootstrap resamples of the decision-accuracy intervals")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--config", type=input_path_type, default=None,
                   help="experiment config of the printed training command "
                                                  "(default experiments/configs/tiny_moe.py)")
    p.add_argument("--dataset", type=dataset_path_type, default=None,
                   help="prepared dataset directory the command trains on (default: built-in)")
    p.add_argument("--out", type=path_type, dest="out_dir", required=True,
                   help="directory to write mixture.json, recommendation.md (+ .png) and evaluation.json into")
    p.add_argument("--no-progress", action="store_true", help="no progress messages or bars")
    p.add_argument("--force", action="store_true", help=FORCE_HELP)


def run(args: argparse.Namespace) -> None:
    unique_tokens = parse_weights(args.unique_tokens, "--unique-tokens") or None
    laws = [x.strip() for x in args.laws.split(",") if x.strip()] if args.laws else None
    if args.bootstrap < 2:
        raise UsageError(f"--bootstrap {args.bootstrap}; allowed: >= 2 (50 or more advised).")
    from data_mixture.recommendation import recommend
    from data_mixture.recommendation_report import summary_lines

    result = recommend(args.runs, size=args.size, tokens=args.tokens, target=args.target, unique_tokens=unique_tokens,
                       size_column=args.size_column, laws=laws, bootstrap=args.bootstrap, robust=args.robust,
                       seed=args.seed, starts=args.starts, resamples=args.resamples, out=args.out_dir,
                       config=args.config, dataset=args.dataset,
                       progress=not args.no_progress and getattr(args, "verbosity", 0) >= 0,
                       max_epochs=args.max_epochs or None)
    print("\n".join(summary_lines(result)))
    print(f"wrote {args.out_dir}/mixture.json and recommendation.md")
