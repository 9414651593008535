"""``python -m data_mixture collect``: moejax workdirs -> a runs table CSV (:mod:`data_mixture.collect`)."""

from __future__ import annotations

import argparse
import logging

from data_mixture.cli.flags import FORCE_HELP, PROG, UsageError, path_type

log = logging.getLogger(__name__)

HELP = "moejax workdirs -> runs table CSV (one row per evaluated checkpoint)."
EXAMPLE = (f"{PROG} collect runs/mixture_ladder --out runs.csv\n"
           f"{PROG} collect runs/a runs/b --out runs.csv --evaluate --eval-args='--max-items 32'\n"
           f"{PROG} collect sweeps/mid/s1_base sweeps/mid/s1_m0 --out runs.csv   # a mid-training run and its base")
INTERRUPTED = ("no table was written (--out is unchanged); evaluations already made stay in the workdirs. "
               "Rerun the command to continue.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("workdirs", type=path_type, nargs="+",
                   help="training workdirs, or a directory whose sub-directories are workdirs")
    p.add_argument("--out", type=path_type, required=True, help="runs table CSV to write")
    p.add_argument("--force", action="store_true", help=FORCE_HELP)
    p.add_argument("--evaluate", action="store_true",
                   help="evaluate checkpoints that have no eval/step_N.json first (python -m moejax.eval); "
                        "default: leave them out and list them")
    p.add_argument("--losses-from-log", action="store_true",
                   help="for checkpoints without an evaluation, take the held-out losses the training loop logged "
                        "at that step (metrics.jsonl eval_loss/<domain>; no benchmark scores)")
    p.add_argument("--eval-args", default="", help="extra moejax.eval flags for --evaluate, e.g. '--max-items 32'")
    p.add_argument("--ignore-init-from", action="store_true",
                   help="collect runs warm-started with checkpoint.init_from (e.g. MergeMix experts) as runs from "
                        "scratch; default: they are mid-training runs of the collected base they name")
    p.add_argument("--validation-only", default="",
                   help="comma-separated domains no run trains on (a held-out target in a prepared dataset): a "
                        "loss:<domain> column and no mix:<domain> (an error if a run gives one a weight)")
    p.add_argument("--bench-metric", choices=("accuracy", "gold_logprob"), default="accuracy",
                   help="score in the bench: columns: accuracy (exact match for exact-match tasks), or gold_logprob, "
                        "the mean log-probability of the correct answer (continuous; moves after accuracy saturates)")


def run(args: argparse.Namespace) -> None:
    import shlex

    from data_mixture.collect import collect, write_columns
    from data_mixture.table import read_runs

    got = collect(args.workdirs, evaluate=args.evaluate, eval_args=shlex.split(args.eval_args),
                  losses_from_log=args.losses_from_log, bases="none" if args.ignore_init_from else "auto",
                  bench_metric=args.bench_metric,
                  validation_only=tuple(d.strip() for d in args.validation_only.split(",") if d.strip()))
    for note in got.skipped:
        log.warning(f"collect: skipped {note}")
    if got.unevaluated:
        listed = ", ".join(f"{w} step {s}" for w, s in got.unevaluated[:8])
        more = f" and {len(got.unevaluated) - 8} more" if len(got.unevaluated) > 8 else ""
        log.warning(f"collect: {len(got.unevaluated)} checkpoint(s) have no evaluation and were left out: {listed}{more}. "
                    f"Evaluate them with `python -m moejax.eval --workdir W --all` or rerun collect with --evaluate.")
    n_rows = len(got.columns.get("run", []))
    if not n_rows:
        raise UsageError(f"no evaluated checkpoint found in {', '.join(args.workdirs)}; evaluate the runs "
                         "(python -m moejax.eval --workdir W --all) or pass --evaluate.")
    write_columns(got.columns, args.out)
    table = read_runs(args.out)  # the written table passes the same validation every reader applies
    mid = table.mid_training()
    kind = (f" ({len(set(table.run[mid]))} mid-training runs of {len(set(table.base[mid]))} base(s))"
            if mid.any() and table.base is not None else "")
    print(f"wrote {args.out}: {n_rows} rows, {len(set(table.run))} runs{kind}, mix domains {', '.join(table.mix_domains)}, "
          f"loss domains {', '.join(table.loss_domains)}, tasks {', '.join(table.bench_tasks) or 'none'}")
