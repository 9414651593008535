"""``python -m data_mixture fit``: one law fitted to every validation domain of a runs table
(:func:`data_mixture.fit.fit_table`)."""

from __future__ import annotations

import argparse

from data_mixture.cli.flags import (FORCE_HELP, PROG, SIZE_COLUMN_HELP, TARGET_HELP, UsageError, parse_weights, path_type,
                                    progress, target)

HELP = ("Fit one law to every validation domain of a runs table (+ bootstrap, + benchmark laws). "
        "How many runs and sizes each law needs: `python -m data_mixture laws`.")
EXAMPLE = (f"{PROG} fit --runs experiments/studies/results/ladder_runs.csv --law camel --out fit.json --bootstrap 100 --seed 0\n"
           f"{PROG} fit --runs runs.csv --law additive --out fit.json --fix beta=0.3 gamma[0]=0.5\n"
           f"{PROG} fit --runs runs.csv --law camel --out fit.json --holdout largest   # fit below the largest size\n"
           f"{PROG} fit --runs runs.csv --law camel --target heldout_qa --out fit.json   # a held-out target\n"
           f"{PROG} fit --runs runs.csv --law additive+repfit --out fit.json   # repeated data (unique:<domain>)")
INTERRUPTED = "nothing was written (--out is unchanged; a fit is saved only when complete). Rerun the command to fit again."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runs", type=path_type, required=True, help="runs table CSV")
    p.add_argument("--law", required=True, help="law name: mixing_law | additive | regmix | regmix_linear | camel")
    p.add_argument("--out", type=path_type, required=True, help="fit JSON to write")
    p.add_argument("--force", action="store_true", help=FORCE_HELP)
    p.add_argument("--size-column", default="params_total", choices=("params_total", "params_active"),
                   help=SIZE_COLUMN_HELP)
    p.add_argument("--bootstrap", type=int, default=100, help="bootstrap resamples over runs (0: none)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--starts", type=int, default=64, help="random starts per fit")
    p.add_argument("--chance", nargs="*", action="extend",
                   help="chance level per benchmark task, e.g. code=0.25 math=0")
    p.add_argument("--holdout", default="none",
                   help="rows to leave out of the fit, as evaluate chooses them: 'none' (default: fit every row), "
                        "'largest' (the largest size), 'size=N' (the size closest to N), 'runs=a,b,...'")
    p.add_argument("--fix", nargs="+", action="extend", metavar="NAME=VALUE",
                   help="hold law parameters constant (repeatable), e.g. --fix beta=0.28 s=0 t[1]=0.5: NAME fixes a "
                        "scalar or every entry of a vector, NAME[i] entry i (0-based); natural units, within the bounds")
    p.add_argument("--target", default=None, help="fit the law to this target alone: " + TARGET_HELP)
    p.add_argument("--no-progress", action="store_true")


def run(args: argparse.Namespace) -> None:
    if args.holdout == "each":
        raise UsageError("--holdout each makes one fit per held-out size: that is `evaluate --holdout each`; "
                         "fit takes largest | size=N | runs=a,b,... | none.")
    chance = parse_weights(args.chance, "--chance") or None
    fixed = parse_fixed(args.fix)

    import numpy as np

    from data_mixture.fit import fit_table
    from data_mixture.table import read_runs

    table = read_runs(args.runs)
    held_out = ""
    if args.holdout != "none":  # the same choices as evaluate: fit on the rest
        from data_mixture.evaluate import split_holdout

        test, held_out = split_holdout(table, args.holdout, args.size_column)
        table = table.take(np.flatnonzero(~test))
    fit = fit_table(table, args.law, size_column=args.size_column, bootstrap=args.bootstrap, seed=args.seed,
                    starts=args.starts, chance=chance, progress=progress(args), fixed=fixed,
                    target=target(args))
    if held_out:
        fit.info["held_out"] = held_out
    fit.save(args.out)
    if held_out:
        print(f"fitted without the rows of the {held_out} ({len(table)} rows left)")
    aim = f", target {fit.target.text!r} as loss:{fit.target.domain}" if fit.target is not None else ""
    print(f"wrote {args.out}: law {fit.law}{aim}, {len(fit.loss_domains)} validation domain(s), "
          f"{len(fit.bootstrap)} bootstrap member(s), {len(fit.bench)} benchmark law(s)")
    print_fit_notes(fit)


def parse_fixed(items: list[str] | None) -> dict[str, float]:
    """``['beta=0.28', 's[2]=0']`` (or comma-separated) -> {"beta": 0.28, "s[2]": 0.0}; the law
    checks names and bounds (fit_table), this only the NAME=NUMBER form."""
    out: dict[str, float] = {}
    for item in items or []:
        for part in filter(None, (p.strip() for p in item.split(","))):
            name, sep, value = part.partition("=")
            try:
                if not sep or not name.strip():
                    raise ValueError
                out[name.strip()] = float(value)
            except ValueError:
                raise UsageError(f"--fix {part!r}: expected NAME=NUMBER or NAME[INDEX]=NUMBER, e.g. --fix beta=0.28 s[2]=0") from None
    return out


def print_fit_notes(fit) -> None:
    """The fit's fixed parameters and the point-fit parameters at (or within 1 % of) a bound."""
    for line in fit.fixed_lines():
        print(line)
    lines = fit.at_bounds_lines()
    if lines:
        print(f"{len(lines)} fitted parameter(s) at (or within 1 % of) a bound (a degenerate or unidentified fit):")
        for line in lines:
            print("  " + line)
