"""``python -m data_mixture laws``: each law's minimum model sizes and runs (:func:`data_mixture.laws.min_runs_table`)."""

from __future__ import annotations

import argparse

from data_mixture.cli.flags import PROG

HELP = "Print each law's minimum number of model sizes and of runs for M training domains."
EXAMPLE = (f"{PROG} laws              # each law's minimum sizes and runs for 2..8 training domains\n"
           f"{PROG} laws --domains 3  # for 3 training domains")
INTERRUPTED = "nothing was written."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--domains", type=int, default=None, help="M, the number of training domains (default: 2..8)")


def run(args: argparse.Namespace) -> None:
    from data_mixture.laws import min_runs_table

    counts = (args.domains,) if args.domains else (2, 3, 4, 5, 6, 8)
    print("What each law needs to be identified: distinct model sizes, and runs in all (over every size) for M "
          "training domains; fit refuses fewer, plan warns of fewer.")
    print(min_runs_table(counts))
