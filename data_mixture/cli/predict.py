"""``python -m data_mixture predict``: a fit's per-domain losses (and benchmark scores) for a query
table (:meth:`data_mixture.fit.Fit.predict`)."""

from __future__ import annotations

import argparse

from data_mixture.cli.fit import print_fit_notes
from data_mixture.cli.flags import FORCE_HELP, PROG, TARGET_HELP, path_type, target

HELP = "Predict per-domain losses (and benchmark scores) for a query table."
EXAMPLE = f"{PROG} predict --fit fit.json --runs query.csv --out pred.csv"
INTERRUPTED = "nothing was written (--out is unchanged). Rerun the command."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--fit", type=path_type, required=True, help="fit JSON written by `fit`")
    p.add_argument("--runs", type=path_type, required=True,
                   help="query CSV: runs-table columns without the losses; extra columns are kept")
    p.add_argument("--out", type=path_type, required=True, help="CSV to write: the query plus pred:/lo:/hi: columns")
    p.add_argument("--force", action="store_true", help=FORCE_HELP)
    p.add_argument("--interval", type=float, default=0.9, help="bootstrap interval mass")
    p.add_argument("--target", default=None, help="also write pred:<target> (from the fit's domains): " + TARGET_HELP)


def run(args: argparse.Namespace) -> None:
    import numpy as np

    from data_mixture.fit import Fit
    from data_mixture.table import read_runs, write_runs

    fit = Fit.load(args.fit)
    print_fit_notes(fit)
    query = read_runs(args.runs, query=True)
    pred = fit.predict(query, interval=args.interval)
    aim = target(args)
    if aim is not None and f"pred:{aim.domain}" not in pred:
        pred[f"pred:{aim.domain}"] = aim.combine(fit.loss_domains, np.stack([pred[f"pred:{d}"] for d in fit.loss_domains], 1))
    write_runs(query, args.out, extra={k: np.asarray(v) for k, v in pred.items()})
    print(f"wrote {args.out}: {len(query)} rows, columns {', '.join(pred)}")
