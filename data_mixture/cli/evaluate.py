"""``python -m data_mixture evaluate``: laws beside baselines on held-out sizes
(:func:`data_mixture.evaluate.evaluate_laws`), a report directory and a one-line verdict."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from data_mixture.cli.flags import PROG, SIZE_COLUMN_HELP, TARGET_HELP, path_type, target

HELP = ("Compare laws with baselines on held-out sizes: decision accuracy (with the seed noise "
        "floor and bootstrap intervals), errors, pick regret, and a one-line verdict.")
EXAMPLE = (f"{PROG} evaluate --runs experiments/studies/results/ladder_runs.csv --laws mixing_law,additive,regmix,camel "
           "--out-dir results/eval\n"
           f"{PROG} evaluate --runs runs.csv --laws camel,regmix_linear --holdout each --starts 16 --out-dir results/eval_each")
INTERRUPTED = "nothing was written to --out-dir (the report is written when every law is done). Rerun the command."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runs", type=path_type, required=True, nargs="+", action="extend",
                   help="runs table CSV; several files with the same columns are concatenated (e.g. proxies + targets)")
    p.add_argument("--laws", default="mixing_law,additive,regmix,camel")
    p.add_argument("--holdout", default="largest",
                   help="'largest' (default: fit below the largest size, predict it), 'each' (every size above the "
                        "two smallest in turn, fitted on the sizes below it), 'size=N' (hold out the size closest to "
                        "N), 'runs=a,b,...', 'kfold=K' (out-of-fold predictions of the mixtures at the largest size, K folds; "
                        "for tables with too few sizes to hold one out), or 'none' (in-sample fit, scored at the "
                        "largest size)")
    p.add_argument("--size-column", default="params_total", choices=("params_total", "params_active"),
                   help=SIZE_COLUMN_HELP)
    p.add_argument("--tokens", default="all", help="held-out rows to score: 'all' checkpoints or 'last' per run")
    p.add_argument("--seed", type=int, default=0, help="seed of the fits' random starts and of the bootstrap")
    p.add_argument("--starts", type=int, default=64, help="random starts per law fit")
    p.add_argument("--resamples", type=int, default=1000,
                   help="bootstrap resamples over mixtures for the decision-accuracy intervals (default 1000)")
    p.add_argument("--out-dir", type=path_type, default="results/dm_evaluate",
                   help="evaluation.json, evaluation.md, pred_vs_obs.png, decision_accuracy.png")
    p.add_argument("--force", action="store_true",
                   help="write into a non-empty --out-dir (files of the same names are replaced)")
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--target", default=None,
                   help="score the laws on this target instead of every loss column: " + TARGET_HELP)
    p.add_argument("--registration", type=path_type, default=None,
                   help="registration JSON (`register`): check it against the table's started_at column and score "
                        "every registered comparison; the report says pre-registered only when the check passes")


def run(args: argparse.Namespace) -> None:
    from data_mixture.evaluate import _jsonable, evaluate_laws, format_report

    table = read_runs_files(args.runs)
    check = None
    if args.registration:  # checked on the table as read, before any fit: the rule names its own metric
        from data_mixture.register import load, verify

        check = verify(load(args.registration), table)
    aim = target(args)
    if aim is not None:  # the target is the one validation domain every law is fitted to and scored on
        table = aim.apply(table)
    laws = [x.strip() for x in args.laws.split(",") if x.strip()]
    report = evaluate_laws(table, laws, holdout=args.holdout, size_column=args.size_column, seed=args.seed,
                           starts=args.starts, tokens=args.tokens, resamples=args.resamples, target=aim)
    if check is not None:
        report["registration"] = _jsonable(check)
    if aim is not None:
        report["target"] = aim.to_json()
    text = format_report(report)
    if aim is not None:
        text = f"Target: {aim.text} (loss:{aim.domain})\n\n{text}"
    written = write_report(report, text, Path(args.out_dir), plots=not args.no_plot)
    print(text)
    print()
    print(report["verdict"]["text"])
    print(f"wrote {', '.join(str(w) for w in written)}")


def write_report(report: dict, text: str, final: Path, *, plots: bool) -> list[Path]:
    """evaluation.json, evaluation.md and the plots, replacing the directory ``final`` whole (no old
    plot stays beside new results); the paths written."""
    from moejax.paths import replace_dir

    final.parent.mkdir(parents=True, exist_ok=True)
    names = ["evaluation.json", "evaluation.md"]
    with replace_dir(str(final)) as tmp:
        out = Path(tmp)
        (out / "evaluation.json").write_text(json.dumps(report, indent=1))
        (out / "evaluation.md").write_text(text + "\n")
        if plots:
            from data_mixture.plots import plot_decision_accuracy, plot_pred_vs_obs

            each = report.get("holdouts", [report])
            for r in each:
                name = "pred_vs_obs.png" if len(each) == 1 else f"pred_vs_obs_{r['held_out_size']:.4g}.png"
                if any("predictions" in e for e in (*r["laws"].values(), *r["baselines"].values())):
                    names.append(plot_pred_vs_obs(r, out / name).name)
            names.append(plot_decision_accuracy(report, out / "decision_accuracy.png").name)
    return [final / n for n in names]


def read_runs_files(paths: list[str]):
    """One runs table from one or more CSVs with the same columns (rows concatenated, then validated)."""
    import csv

    from data_mixture.table import TableError, from_columns, read_runs

    if len(paths) == 1:
        return read_runs(paths[0])
    columns: dict[str, list[str]] = {}
    for path in paths:
        table = read_runs(path)  # each file is valid on its own
        with open(path, newline="", encoding="utf-8-sig") as f:
            rows = [r for r in csv.reader(f) if any(c.strip() for c in r)]
        header = [h.strip() for h in rows[0]]
        if columns and set(header) != set(columns):
            raise TableError(f"--runs: {path} has columns {', '.join(sorted(set(header) ^ set(columns)))} that "
                             f"{paths[0]} has not (or the reverse); allowed: the same columns in every file.")
        for k, h in enumerate(header):
            columns.setdefault(h, []).extend(r[k] for r in rows[1:])
        del table
    return from_columns(columns)
