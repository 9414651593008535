"""Command line: ``python -m data_mixture {collect,fit,predict,evaluate,register,optimize,plan,sweep,mergemix} ...``.

Every subcommand has ``--help`` with an example; docs/data_mixture.md ("CLI") walks through the
whole pipeline. Bad input (a runs table off the simplex, a query with unknown domains,
infeasible constraints, ...) ends with a one-paragraph message naming the rows/columns/flags at
fault and exit code 2, before any fitting; no traceback. Paths mean what the user typed, an
existing output is refused unless ``--force`` and replaced whole, and both are checked before any
work (:mod:`data_mixture.user_files`); Ctrl-C prints one line saying what was kept and exits 130.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import textwrap
from pathlib import Path

from moejax.errors import UserError
from moejax.cli import preload_allocator
from moejax.log import add_verbosity_flags
from moejax.runner import run

log = logging.getLogger(__name__)

PROG = "python -m data_mixture"

EXAMPLES = {
    "collect": f"{PROG} collect runs/mixture_ladder --out runs.csv\n"
               f"{PROG} collect runs/a runs/b --out runs.csv --evaluate --eval-args='--max-items 32'\n"
               f"{PROG} collect sweeps/mid/s1_base sweeps/mid/s1_m0 --out runs.csv   # a mid-training run and its base",
    "fit": f"{PROG} fit --runs experiments/studies/results/ladder_runs.csv --law camel --out fit.json --bootstrap 100 --seed 0\n"
           f"{PROG} fit --runs runs.csv --law additive --out fit.json --fix beta=0.3 gamma[0]=0.5\n"
           f"{PROG} fit --runs runs.csv --law camel --out fit.json --holdout largest   # fit below the largest size\n"
           f"{PROG} fit --runs runs.csv --law camel --target heldout_qa --out fit.json   # a held-out target\n"
           f"{PROG} fit --runs runs.csv --law additive+repfit --out fit.json   # repeated data (unique:<domain>)",
    "laws": f"{PROG} laws              # each law's minimum sizes and runs for 2..8 training domains\n"
            f"{PROG} laws --domains 3  # for 3 training domains",
    "predict": f"{PROG} predict --fit fit.json --runs query.csv --out pred.csv",
    "evaluate": f"{PROG} evaluate --runs experiments/studies/results/ladder_runs.csv --laws mixing_law,additive,regmix,camel "
                "--out-dir results/eval\n"
                f"{PROG} evaluate --runs runs.csv --laws camel,regmix_linear --holdout each --starts 16 --out-dir results/eval_each",
    "register": f"{PROG} register --rule 'a beats b when the 95% paired t-interval over 3 seeds of loss(a) - loss(b) "
                "lies below 0' --candidates candidates.json --fits camel=fit_camel.json additive=fit_additive.json "
                "--size 6e5 --tokens 2.4e6 --out registration.json\n"
                f"{PROG} evaluate --runs proxies.csv targets.csv --registration registration.json --out-dir results/eval",
    "optimize": f"{PROG} optimize --fit fit.json --size 3.1e6 --tokens 5e8 --objective loss "
                "--min-weight code=0.1 --max-weight math=0.4 --dataset builtin --max-epochs 4 --out mixture.json\n"
                f"{PROG} optimize --fit fit.json --size 3.1e6 --tokens 5e8 --target code=0.6,prose=0.4 "
                "--unique-tokens code=2e7 --max-epochs code=4 --out mixture.json\n"
                "./launch.sh experiments/configs/tiny_moe.py --config.data.mixture_file=mixture.json",
    "plan": f"{PROG} plan --budget-flops 3e15 --prior fit.json --target-size 3.1e6 --target-tokens 5e8 --out plan.json\n"
            f"{PROG} plan --budget-flops 2e16 --domains code,prose,math,knowledge --target-size 2e7 --target-tokens 4e8 "
            "--mid-training --base-tokens-per-param 20 --mid-tokens-per-param 4 --seeds 3 --seed-sizes s3 --out plan.json",
    "sweep": f"{PROG} sweep --plan plan.json --root sweeps/ladder --parallel 2 --retries 1 --eval-args '--max-items 64'\n"
             f"{PROG} sweep --plan plan.json --root /shared/sweeps/ladder --backend ray --ray-address HEAD:6379 "
             "--cpus-per-run 4 --gpus-per-run 1",
    "mergemix": f"{PROG} mergemix --base runs/base --domains code,prose,math,knowledge --expert-tokens 2e5 "
                "--out results/mergemix --budget 60\n"
                "./launch.sh experiments/configs/tiny_moe.py --config.data.mixture_file=results/mergemix/mixture.json",
}


TARGET_HELP = ("what the mixture is chosen for, when not the training mix: a validation domain (heldout_qa), a weighted "
               "set (code=0.6,prose=0.4) or a benchmark log-probability (logprob:know_type); docs/data_mixture.md, 'Targets'")
FORCE_HELP = "replace an existing --out (default: refuse it); the new file is renamed into place when complete"

# What Ctrl-C leaves, per command (sweep handles Ctrl-C itself: its runs save and resume).
INTERRUPTED = {
    "collect": "no table was written (--out is unchanged); evaluations already made stay in the workdirs. "
               "Rerun the command to continue.",
    "fit": "nothing was written (--out is unchanged; a fit is saved only when complete). Rerun the command to fit again.",
    "predict": "nothing was written (--out is unchanged). Rerun the command.",
    "laws": "nothing was written.",
    "evaluate": "nothing was written to --out-dir (the report is written when every law is done). Rerun the command.",
    "register": "nothing was written (--out is unchanged). Rerun the command.",
    "optimize": "nothing was written (--out is unchanged). Rerun the command.",
    "plan": "nothing was written (--out is unchanged). Rerun the command.",
    "mergemix": "the trained experts and every evaluated merge are kept in --out; rerun the same command to resume.",
}


class UsageError(UserError):
    """A bad flag value found by the CLI itself."""


def _parse_weights(items: list[str] | None, flag: str) -> dict[str, float]:
    """``['code=0.1', 'math=0.4']`` or ``['code=0.1,math=0.4']`` -> dict; errors name the flag."""
    out: dict[str, float] = {}
    for item in items or []:
        for part in filter(None, (p.strip() for p in item.split(","))):
            name, sep, value = part.partition("=")
            try:
                if not sep or not name:
                    raise ValueError
                number = float(value)
            except ValueError:
                raise UsageError(f"{flag} {part!r}: expected DOMAIN=NUMBER, e.g. {flag} code=0.1") from None
            name = name.strip()
            if name in out and out[name] != number:
                raise UsageError(f"{flag} gives {name!r} twice, as {out[name]:g} and {number:g}; give each "
                                 f"domain once (every {flag} counts, e.g. {flag} code=0.1 {flag} math=0.4).")
            out[name] = number
    return out


def _target(args):
    """The parsed ``--target`` (None when not given); a TableError naming the part at fault."""
    from data_mixture.target import parse_target

    return parse_target(args.target) if getattr(args, "target", None) else None


def _max_epochs(items: list[str] | None) -> tuple[float, dict[str, float]]:
    """``--max-epochs 4`` (every domain with available tokens) or ``--max-epochs code=4 math=8``."""
    if not items:
        return 1.0, {}
    if len(items) == 1 and "=" not in items[0]:
        try:
            return float(items[0]), {}
        except ValueError:
            raise UsageError(f"--max-epochs {items[0]!r}: expected a number or DOMAIN=EPOCHS, e.g. --max-epochs code=4") from None
    return 1.0, _parse_weights(items, "--max-epochs")


def _json_arg(text: str, flag: str):
    """JSON text, or the path of a JSON file."""
    try:
        if text.strip()[:1] in "[{":
            return json.loads(text)
        return json.loads(Path(text).read_text())
    except FileNotFoundError:
        raise UsageError(f"{flag}: file {text!r} does not exist.") from None
    except IsADirectoryError:
        raise UsageError(f"{flag}: {text!r} is a directory; give JSON text or the path of a JSON file.") from None
    except ValueError as e:
        where = "" if text.strip()[:1] in "[{" else f" {text}"
        raise UsageError(f"{flag}{where}: not valid JSON: {e}") from None


# ---------------------------------------------------------------------------------------- commands


def cmd_collect(args) -> None:
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


def _progress(args) -> bool:
    """Progress bars only on a terminal, and not with -q/--no-progress: a pipe or a log file gets
    the messages, not a bar's redraws."""
    return not args.no_progress and getattr(args, "verbosity", 0) >= 0 and sys.stderr.isatty()


def cmd_fit(args) -> None:
    from data_mixture.fit import fit_table
    from data_mixture.table import read_runs

    import numpy as np

    table = read_runs(args.runs)
    held_out = ""
    if args.holdout != "none":  # the same choices as evaluate: fit on the rest
        from data_mixture.evaluate import split_holdout

        if args.holdout == "each":
            raise UsageError("--holdout each makes one fit per held-out size: that is `evaluate --holdout each`; "
                             "fit takes largest | size=N | runs=a,b,... | none.")
        test, held_out = split_holdout(table, args.holdout, args.size_column)
        table = table.take(np.flatnonzero(~test))
    chance = _parse_weights(args.chance, "--chance") or None
    fixed = _parse_fixed(args.fix)
    fit = fit_table(table, args.law, size_column=args.size_column, bootstrap=args.bootstrap, seed=args.seed,
                    starts=args.starts, chance=chance, progress=_progress(args), fixed=fixed,
                    target=_target(args))
    if held_out:
        fit.info["held_out"] = held_out
    fit.save(args.out)
    if held_out:
        print(f"fitted without the rows of the {held_out} ({len(table)} rows left)")
    aim = f", target {fit.target.text!r} as loss:{fit.target.domain}" if fit.target is not None else ""
    print(f"wrote {args.out}: law {fit.law}{aim}, {len(fit.loss_domains)} validation domain(s), "
          f"{len(fit.bootstrap)} bootstrap member(s), {len(fit.bench)} benchmark law(s)")
    _print_fit_notes(fit)


def cmd_laws(args) -> None:
    from data_mixture.laws import min_runs_table

    counts = (args.domains,) if args.domains else (2, 3, 4, 5, 6, 8)
    print("What each law needs to be identified: distinct model sizes, and runs in all (over every size) for M "
          "training domains; fit refuses fewer, plan warns of fewer.")
    print(min_runs_table(counts))


def _parse_fixed(items: list[str] | None) -> dict[str, float]:
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


def _print_fit_notes(fit) -> None:
    """The fit's fixed parameters and the point-fit parameters at (or within 1 % of) a bound."""
    for line in fit.fixed_lines():
        print(line)
    lines = fit.at_bounds_lines()
    if lines:
        print(f"{len(lines)} fitted parameter(s) at (or within 1 % of) a bound (a degenerate or unidentified fit):")
        for line in lines:
            print("  " + line)


def cmd_predict(args) -> None:
    import numpy as np

    from data_mixture.fit import Fit
    from data_mixture.table import read_runs, write_runs

    fit = Fit.load(args.fit)
    _print_fit_notes(fit)
    query = read_runs(args.runs, query=True)
    pred = fit.predict(query, interval=args.interval)
    target = _target(args)
    if target is not None and f"pred:{target.domain}" not in pred:
        pred[f"pred:{target.domain}"] = target.combine(fit.loss_domains, np.stack([pred[f"pred:{d}"] for d in fit.loss_domains], 1))
    write_runs(query, args.out, extra={k: np.asarray(v) for k, v in pred.items()})
    print(f"wrote {args.out}: {len(query)} rows, columns {', '.join(pred)}")


def _read_runs_files(paths: list[str]):
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


def cmd_evaluate(args) -> None:
    from data_mixture.evaluate import _jsonable, evaluate_laws, format_report
    from moejax.paths import replace_dir

    table = _read_runs_files(args.runs)
    check = None
    if args.registration:  # checked on the table as read, before any fit: the rule names its own metric
        from data_mixture.register import load, verify

        check = verify(load(args.registration), table)
    target = _target(args)
    if target is not None:  # the target is the one validation domain every law is fitted to and scored on
        table = target.apply(table)
    laws = [x.strip() for x in args.laws.split(",") if x.strip()]
    report = evaluate_laws(table, laws, holdout=args.holdout, size_column=args.size_column, seed=args.seed,
                           starts=args.starts, tokens=args.tokens, resamples=args.resamples)
    if check is not None:
        report["registration"] = _jsonable(check)
    if target is not None:
        report["target"] = target.to_json()
    final = Path(args.out_dir)
    final.parent.mkdir(parents=True, exist_ok=True)
    text = format_report(report)
    if target is not None:
        text = f"Target: {target.text} (loss:{target.domain})\n\n{text}"
    names = ["evaluation.json", "evaluation.md"]
    with replace_dir(str(final)) as tmp:  # the whole directory is replaced: no old plot stays beside new results
        out = Path(tmp)
        (out / "evaluation.json").write_text(json.dumps(report, indent=1))
        (out / "evaluation.md").write_text(text + "\n")
        if not args.no_plot:
            from data_mixture.plots import plot_decision_accuracy, plot_pred_vs_obs

            each = report.get("holdouts", [report])
            for r in each:
                name = "pred_vs_obs.png" if len(each) == 1 else f"pred_vs_obs_{r['held_out_size']:.4g}.png"
                if any("predictions" in e for e in (*r["laws"].values(), *r["baselines"].values())):
                    names.append(plot_pred_vs_obs(r, out / name).name)
            names.append(plot_decision_accuracy(report, out / "decision_accuracy.png").name)
    print(text)
    print()
    print(report["verdict"]["text"])
    written = [final / n for n in names]
    print(f"wrote {', '.join(str(w) for w in written)}")


def cmd_register(args) -> None:
    from data_mixture.fit import Fit
    from data_mixture.register import RegistrationError, register, write

    try:
        candidates = json.loads(Path(args.candidates).read_text())
    except (OSError, ValueError) as e:
        raise UsageError(f"--candidates {args.candidates}: not a readable JSON file ({e}); allowed: a JSON object "
                         '{"name": {"domain": weight, ...}, ...}.') from None
    if not isinstance(candidates, dict) or not all(isinstance(w, dict) for w in candidates.values()):
        raise UsageError(f"--candidates {args.candidates} is not an object of mixtures; allowed: "
                         '{"name": {"domain": weight, ...}, ...}.')
    fits = dict(_parse_pairs(args.fits or [], "--fits"))
    if fits and (args.size is None or args.tokens is None):
        raise UsageError("--fits needs --size and --tokens: the target point the laws predict.")
    predictions = {}
    for law, path in fits.items():
        fit = Fit.load(path, "--fits")
        names = list(candidates)
        absent = sorted({d for w in candidates.values() for d in w} - set(fit.mix_domains))
        if absent:
            raise RegistrationError(f"--fits {law}={path} was fitted on {', '.join(fit.mix_domains)}; the candidates "
                                    f"also weigh {', '.join(absent)}.")
        import numpy as np

        mix_rm = np.array([[float(candidates[n].get(d, 0.0)) for d in fit.mix_domains] for n in names])
        pred_rv = fit.predict_losses(np.full(len(names), args.size), np.full(len(names), args.tokens), mix_rm)
        predictions[law] = dict(zip(names, pred_rv.mean(axis=1).tolist()))
    if args.predictions:
        predictions.update(json.loads(Path(args.predictions).read_text()))
    target = ({"size_column": args.size_column, "size": args.size, "tokens": args.tokens} if args.size is not None else None)
    reg = register({"rule": args.rule, "metric": args.metric, "level": args.level}, candidates, predictions=predictions,
                   target=target)
    write(reg, args.out)
    print(json.dumps({k: reg[k] for k in ("registered_at", "code_version", "sha256")}, indent=1))
    print(f"wrote {args.out}: {len(reg['candidates'])} candidates, {len(reg['comparisons'])} comparisons, "
          f"predictions of {', '.join(reg['predictions']) or 'no law'}")


def _parse_pairs(items: list[str], flag: str) -> list[tuple[str, str]]:
    out = []
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name or not value:
            raise UsageError(f"{flag} {item!r}; allowed: NAME=PATH, e.g. {flag} camel=fit_camel.json.")
        out.append((name.strip(), value.strip()))
    return out


def cmd_optimize(args) -> None:
    from data_mixture.fit import Fit
    from data_mixture.optimize import Constraints, available_tokens, optimize_mixture, write_mixture

    fit = Fit.load(args.fit)
    available = None
    if args.available or args.dataset is not None:
        available = available_tokens(
            explicit=_parse_weights(args.available, "--available") if args.available else None,
            dataset=args.dataset, cache_dir=args.cache_dir, domains=fit.mix_domains,
        )
    max_epochs, domain_epochs = _max_epochs(args.max_epochs)
    constraints = Constraints(
        min_weight=_parse_weights(args.min_weight, "--min-weight"),
        max_weight=_parse_weights(args.max_weight, "--max-weight"),
        available_tokens=available, max_epochs=max_epochs, domain_epochs=domain_epochs,
    )
    result = optimize_mixture(
        fit, size=args.size, tokens=args.tokens, objective=args.objective,
        loss_weights=_parse_weights(args.loss_weights, "--loss-weights") or None,
        task_weights=_parse_weights(args.task_weights, "--task-weights") or None,
        constraints=constraints, starts=args.starts, seed=args.seed, bootstrap=not args.no_bootstrap,
        interval=args.interval, target=_target(args),
        unique_tokens=_parse_weights(args.unique_tokens, "--unique-tokens") or None,
    )
    result["fit_file"] = str(args.fit)
    write_mixture(result, args.out)
    w = ", ".join(f"{d} {v:.3f}" for d, v in result["weights"].items())
    print(f"optimal mixture ({result['objective']['kind']} {result['objective']['value']:.4f}): {w}")
    boot = result["bootstrap"]
    if boot.get("weights"):
        iv = ", ".join(f"{d} [{s['lo']:.3f}, {s['hi']:.3f}]" for d, s in boot["weights"].items())
        print(f"{boot['interval']:.0%} interval of the optimal weights over {boot['members']} bootstrap optima: {iv}")
    from data_mixture.sweep.targets import DEFAULT_CONFIG, launch_command

    overrides = {"data.mixture_file": os.path.abspath(args.out)}
    if args.dataset not in (None, "builtin"):  # the dataset the mixture's domains are from
        overrides = {"data.path": os.path.abspath(args.dataset), **overrides}
    print(f"wrote {args.out}; train with: {launch_command(DEFAULT_CONFIG, 'runs/optimized', overrides)}")


def _numbers(text: str, flag: str) -> list[float]:
    """``'20,40'`` -> [20.0, 40.0]; errors name the flag."""
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"{flag} {text!r}: expected comma-separated numbers, e.g. {flag} 20,40") from None


def cmd_plan(args) -> None:
    from data_mixture.plan import PlanSpec, make_plan
    from data_mixture.user_files import write_text

    if args.mid_training and args.tokens_per_param is not None:
        raise UsageError("--tokens-per-param sizes runs from scratch; a --mid-training plan takes "
                         "--mid-tokens-per-param (or --mid-tokens) and --base-tokens-per-param (or --base-tokens).")
    domains = args.domains
    if args.dataset and not domains and not args.prior:  # the dataset's own domains
        from moejax.data import describe_dataset

        domains = ",".join(describe_dataset(args.dataset).domains)
    spec = PlanSpec(
        budget_flops=args.budget_flops, target_size=args.target_size, target_tokens=args.target_tokens,
        prior=args.prior, law=args.law, presets=_json_arg(args.presets, "--presets") if args.presets else None,
        tokens_per_param=_numbers(args.tokens_per_param or "20", "--tokens-per-param"),
        min_weight=_parse_weights(args.min_weight, "--min-weight"),
        max_weight=_parse_weights(args.max_weight, "--max-weight"),
        noise=args.noise, simulations=args.simulations, sim_starts=args.sim_starts, seed=args.seed,
        config=args.config, batch=args.batch, seq_len=args.seq_len, domains=domains,
        min_runs_per_size=args.min_runs_per_size, checkpoints=args.checkpoints, min_sizes=args.min_sizes,
        mid_training=args.mid_training, base_tokens_per_param=args.base_tokens_per_param, base_tokens=args.base_tokens,
        mid_tokens_per_param=(_numbers(args.mid_tokens_per_param, "--mid-tokens-per-param")
                              if args.mid_tokens_per_param is not None else None), mid_tokens=args.mid_tokens,
        base_mixture=_parse_weights(args.base_mixture, "--base-mixture") if args.base_mixture else None,
        mid_lr_scale=args.mid_lr_scale, seeds=args.seeds,
        seed_sizes=[x.strip() for x in args.seed_sizes.split(",") if x.strip()] if args.seed_sizes is not None else None,
        target=args.target, unique_tokens=_parse_weights(args.unique_tokens, "--unique-tokens"),
        match_repetition=args.match_repetition,
    )
    plan = make_plan(spec, progress=_progress(args))
    if args.dataset:  # every run trains on the user's dataset (its vocabulary size is derived from it)
        plan["dataset"] = args.dataset
        for run in plan["runs"]:
            run["overrides"]["data.path"] = args.dataset
    write_text(args.out, json.dumps(plan, indent=1))
    chosen, protocol = plan["chosen"], plan["protocol"]
    roles = [r["role"] for r in plan["runs"]]
    what = (f"{roles.count('base')} base(s) + {roles.count('mid')} mid-training runs"
            if protocol["kind"] == "mid_training" else f"{len(roles)} runs")
    seeds = f", {protocol['seeds']} seeds at {', '.join(protocol['seed_sizes'])}" if protocol["seed_sizes"] else ""
    print(f"plan: {what} at sizes {', '.join(chosen['sizes'])}{seeds}, {plan['total_flops']:.3g} of "
          f"{plan['budget_flops']:.3g} FLOPs; simulated extrapolation error {chosen['sim_error']:.4f} "
          f"(best of {len(plan['candidates'])} allocations)")
    left_out = [p for p in protocol["seed_sizes_requested"] or [] if p not in protocol["seed_sizes"]]
    if protocol["seeds"] > 1 and left_out:
        log.warning(f"plan: note: --seed-sizes {', '.join(left_out)} not in the chosen sizes: no replicates there")
    _warn_laws_left_short(plan)
    from data_mixture.sweep.targets import launch_command

    first = plan["runs"][0]
    example = launch_command(first["config"], os.path.join("runs", first["name"]), first["overrides"])
    print(f"wrote {args.out}; run it with: python -m data_mixture sweep --plan {args.out} --root runs/sweep; "
          f"each run trains as, e.g.: {example}")


def _warn_laws_left_short(plan: dict) -> None:
    """A warning for each law the plan's runs cannot identify (too few runs or sizes in all)."""
    from data_mixture.laws import LAWS, get_law

    fitted = [r for r in plan["runs"] if r.get("role") != "base"]  # a mid-training plan's laws see the mid runs
    runs, sizes = len(fitted), len({r["preset"] for r in fitted})
    m = len(fitted[0]["mixture"]) if fitted else 0
    short = [f"{name} (needs {get_law(name).min_runs(m)} runs at {get_law(name).min_sizes()}+ sizes)" for name in LAWS
             if runs < get_law(name).min_runs(m) or sizes < get_law(name).min_sizes()]
    if short:
        log.warning(f"plan: warning: its {runs} runs at {sizes} size(s) over {m} training domains are too few to fit "
                    f"{', '.join(short)}; fit and evaluate will refuse those laws on its table "
                    "(python -m data_mixture laws lists every law's minimum). Raise --budget-flops or "
                    "--min-runs-per-size to give them enough.")


def cmd_sweep(args) -> None:
    import shlex

    from data_mixture.sweep import SweepOptions, run_sweep

    options = SweepOptions(
        root=args.root, backend=args.backend, parallel=args.parallel, retries=args.retries,
        eval_args=shlex.split(args.eval_args), lease_timeout=args.lease_timeout, heartbeat=args.heartbeat,
        grace=args.grace, wait_others=args.wait_others, progress=_progress(args),
        ray_address=args.ray_address,
        cpus_per_run=args.cpus_per_run, gpus_per_run=args.gpus_per_run,
        ray_init_kwargs={"num_cpus": args.ray_num_cpus} if args.ray_num_cpus else {},
    )
    result = run_sweep(args.plan, options)
    sys.exit(result.exit_code)


def cmd_mergemix(args) -> None:
    from data_mixture.mergemix.pipeline import Options, run

    def floats(text: str, flag: str) -> tuple[float, ...]:
        try:
            return tuple(float(x) for x in text.split(","))
        except ValueError:
            raise UsageError(f"{flag} {text!r}: expected comma-separated numbers, e.g. {flag} 0.25,0.5,1") from None

    summary = run(Options(
        base=args.base, step=args.step, domains=tuple(d.strip() for d in args.domains.split(",") if d.strip()),
        expert_tokens=args.expert_tokens, out=args.out, fractions=floats(args.fractions, "--fractions"),
        expert_fraction=args.expert_fraction, router=args.router, search=args.search, budget=args.budget,
        n_seeds=args.seeds, task_weights=_parse_weights(args.task_weights, "--task-weights") or None,
        loss_weights=_parse_weights(args.loss_weights, "--loss-weights") or None, bench_metric=args.bench_metric,
        min_weight=_parse_weights(args.min_weight, "--min-weight"), seed=args.seed, backend=args.backend,
        parallel=args.parallel, max_items=args.max_items, loss_batches=args.loss_batches,
        calib_batches=args.calib_batches, damping=args.damping, experts_dir=args.experts_dir, cache=args.cache,
        expert_eval_args=args.expert_eval_args,
        progress=_progress(args),
    ))
    print(json.dumps({k: summary[k] for k in ("mixture", "best_method", "searches", "merges_evaluated")}, indent=1))


# ------------------------------------------------------------------------------------------ parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="examples:\n" + "\n".join(textwrap.indent(v, "  ") for v in EXAMPLES.values()))
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, help_: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_, description=help_, epilog="example:\n" + textwrap.indent(EXAMPLES[name], "  "),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        add_verbosity_flags(p)
        return p

    p = add("collect", "moejax workdirs -> runs table CSV (one row per evaluated checkpoint).")
    p.add_argument("workdirs", nargs="+", help="training workdirs, or a directory whose sub-directories are workdirs")
    p.add_argument("--out", required=True, help="runs table CSV to write")
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
    p.set_defaults(func=cmd_collect)

    p = add("fit", "Fit one law to every validation domain of a runs table (+ bootstrap, + benchmark laws). "
                   "How many runs and sizes each law needs: `python -m data_mixture laws`.")
    p.add_argument("--runs", required=True, help="runs table CSV")
    p.add_argument("--law", required=True, help="law name: mixing_law | additive | regmix | regmix_linear | camel")
    p.add_argument("--out", required=True, help="fit JSON to write")
    p.add_argument("--force", action="store_true", help=FORCE_HELP)
    p.add_argument("--size-column", default="params_total", choices=("params_total", "params_active"))
    p.add_argument("--bootstrap", type=int, default=100, help="bootstrap resamples over runs (0: none)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--starts", type=int, default=64, help="random starts per fit")
    p.add_argument("--chance", nargs="*", action="extend", help="chance level per benchmark task, e.g. code=0.25 math=0")
    p.add_argument("--holdout", default="none",
                   help="rows to leave out of the fit, as evaluate chooses them: 'none' (default: fit every row), "
                        "'largest' (the largest size), 'size=N' (the size closest to N), 'runs=a,b,...'")
    p.add_argument("--fix", nargs="+", action="extend", metavar="NAME=VALUE",
                   help="hold law parameters constant (repeatable), e.g. --fix beta=0.28 s=0 t[1]=0.5: NAME fixes a "
                        "scalar or every entry of a vector, NAME[i] entry i (0-based); natural units, within the bounds")
    p.add_argument("--target", default=None, help="fit the law to this target alone: " + TARGET_HELP)
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_fit)

    p = add("laws", "Print each law's minimum number of model sizes and of runs for M training domains.")
    p.add_argument("--domains", type=int, default=None, help="M, the number of training domains (default: 2..8)")
    p.set_defaults(func=cmd_laws)

    p = add("predict", "Predict per-domain losses (and benchmark scores) for a query table.")
    p.add_argument("--fit", required=True, help="fit JSON written by `fit`")
    p.add_argument("--runs", required=True, help="query CSV: runs-table columns without the losses; extra columns are kept")
    p.add_argument("--out", required=True, help="CSV to write: the query plus pred:/lo:/hi: columns")
    p.add_argument("--force", action="store_true", help=FORCE_HELP)
    p.add_argument("--interval", type=float, default=0.9, help="bootstrap interval mass")
    p.add_argument("--target", default=None, help="also write pred:<target> (from the fit's domains): " + TARGET_HELP)
    p.set_defaults(func=cmd_predict)

    p = add("evaluate", "Compare laws with baselines on held-out sizes: decision accuracy (with the seed noise "
                        "floor and bootstrap intervals), errors, pick regret, and a one-line verdict.")
    p.add_argument("--runs", required=True, nargs="+", action="extend",
                   help="runs table CSV; several files with the same columns are concatenated (e.g. proxies + targets)")
    p.add_argument("--laws", default="mixing_law,additive,regmix,camel")
    p.add_argument("--holdout", default="largest",
                   help="'largest' (default: fit below the largest size, predict it), 'each' (every size above the "
                        "two smallest in turn, fitted on the sizes below it), 'size=N' (hold out the size closest to "
                        "N), 'runs=a,b,...', or 'none' (in-sample fit, scored at the largest size)")
    p.add_argument("--size-column", default="params_total", choices=("params_total", "params_active"))
    p.add_argument("--tokens", default="all", help="held-out rows to score: 'all' checkpoints or 'last' per run")
    p.add_argument("--seed", type=int, default=0, help="seed of the fits' random starts and of the bootstrap")
    p.add_argument("--starts", type=int, default=64, help="random starts per law fit")
    p.add_argument("--resamples", type=int, default=1000,
                   help="bootstrap resamples over mixtures for the decision-accuracy intervals (default 1000)")
    p.add_argument("--out-dir", default="results/dm_evaluate",
                   help="evaluation.json, evaluation.md, pred_vs_obs.png, decision_accuracy.png")
    p.add_argument("--force", action="store_true",
                   help="write into a non-empty --out-dir (files of the same names are replaced)")
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--target", default=None, help="score the laws on this target instead of every loss column: " + TARGET_HELP)
    p.add_argument("--registration", default=None,
                   help="registration JSON (`register`): check it against the table's started_at column and score "
                        "every registered comparison; the report says pre-registered only when the check passes")
    p.set_defaults(func=cmd_evaluate)

    p = add("register", "Pre-register a decision before its target runs: rule, candidate mixtures, each law's "
                        "predictions, git commit, UTC time and a sha256 of it all.")
    p.add_argument("--rule", required=True, help="the decision rule, in words")
    p.add_argument("--candidates", required=True, help='JSON file {"name": {"domain": weight, ...}, ...}')
    p.add_argument("--fits", nargs="*", action="extend", metavar="LAW=FIT.json", help="fits whose mean predicted loss per candidate is registered")
    p.add_argument("--predictions", default=None, help='JSON file {"law": {"candidate": value}} of other predictions')
    p.add_argument("--size", type=float, default=None, help="target model size (the size column); restricts the check "
                                                            "to the runs at it")
    p.add_argument("--tokens", type=float, default=None, help="target tokens (for --fits)")
    p.add_argument("--size-column", default="params_total", choices=("params_total", "params_active"))
    p.add_argument("--metric", default="loss:mean", help="what the rule compares: loss:mean, loss:<domain>, or a --target text "
                                                        "(e.g. knowledge=0.6,math=0.2,prose=0.2)")
    p.add_argument("--level", type=float, default=0.95, help="interval mass of the rule (default 0.95)")
    p.add_argument("--out", required=True, help="registration JSON to write")
    p.add_argument("--force", action="store_true", help=FORCE_HELP)
    p.set_defaults(func=cmd_register)

    p = add("optimize", "Best mixture at a target (size, tokens) under weight bounds and a repetition cap.")
    p.add_argument("--fit", required=True)
    p.add_argument("--size", type=float, required=True, help="target model size, in the fit's size column")
    p.add_argument("--tokens", type=float, required=True, help="target training tokens")
    p.add_argument("--objective", choices=("loss", "bench"), default="loss",
                   help="loss: minimise the weighted validation loss; bench: maximise weighted predicted accuracy")
    p.add_argument("--loss-weights", nargs="*", action="extend", help="validation-domain weights, e.g. code=1 prose=2 (default: equal)")
    p.add_argument("--task-weights", nargs="*", action="extend", help="benchmark-task weights (default: equal over the fit's tasks)")
    p.add_argument("--min-weight", nargs="*", action="extend", help="per-domain minimum share, e.g. code=0.1")
    p.add_argument("--max-weight", nargs="*", action="extend", help="per-domain maximum share, e.g. math=0.4")
    p.add_argument("--available", nargs="*", action="extend", help="available training tokens per domain, e.g. code=1e9 math=2e8")
    p.add_argument("--dataset", default=None,
                   help="read available tokens from a moejax dataset: a prepared dataset directory, or 'builtin'")
    p.add_argument("--cache-dir", default="", help="built-in corpus cache (default: $MOEJAX_CACHE or ~/.cache/moejax)")
    p.add_argument("--max-epochs", nargs="*", default=None,
                   help="repetition cap: a number (share x tokens <= available x max-epochs for every domain with "
                        "--available/--dataset tokens; default 1) or DOMAIN=EPOCHS per domain, e.g. code=4 (needs the "
                        "domain's unique tokens: --unique-tokens, --available/--dataset, or the fit's unique:<domain>)")
    p.add_argument("--unique-tokens", nargs="*", help="unique tokens of each scarce domain's pool at the target, e.g. "
                                                     "code=2e8 (repetition-aware laws and --max-epochs; default: the fit's)")
    p.add_argument("--target", default=None, help="minimise this target (a fit's own target is the default): " + TARGET_HELP)
    p.add_argument("--starts", type=int, default=16, help="local-optimiser starts")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--interval", type=float, default=0.9)
    p.add_argument("--no-bootstrap", action="store_true", help="skip re-optimising per bootstrap member")
    p.add_argument("--out", required=True, help="mixture JSON (launch.sh --config.data.mixture_file=...)")
    p.add_argument("--force", action="store_true", help=FORCE_HELP)
    p.set_defaults(func=cmd_optimize)

    p = add("plan", "Choose proxy runs (sizes, mixtures, tokens) under a FLOP budget (6 x N_active x tokens).")
    p.add_argument("--budget-flops", type=float, required=True)
    p.add_argument("--prior", default=None, help="fit JSON of a prior law fit to simulate from (default: a built-in prior)")
    p.add_argument("--law", default=None, help="law to plan for (default: the prior's)")
    p.add_argument("--target-size", type=float, required=True, help="target model size (the prior's size column)")
    p.add_argument("--target-tokens", type=float, required=True)
    p.add_argument("--presets", default=None,
                   help="size presets, JSON text or file: {name: {overrides...}} (default: the ladder presets)")
    p.add_argument("--tokens-per-param", default=None,
                   help="runs from scratch: candidate tokens/params ratios, comma-separated (default 20)")
    p.add_argument("--min-weight", nargs="*", action="extend")
    p.add_argument("--max-weight", nargs="*", action="extend")
    p.add_argument("--domains", default=None,
                   help="training domains, comma-separated (default: the prior's, else the --dataset's)")
    p.add_argument("--dataset", default=None,
                   help="a prepared dataset directory every planned run trains on (data.path); its domains "
                        "are the training domains unless --domains or --prior says otherwise")
    p.add_argument("--noise", type=float, default=0.01, help="relative noise of simulated losses")
    p.add_argument("--simulations", type=int, default=3, help="simulated ladders per candidate allocation")
    p.add_argument("--sim-starts", type=int, default=16, help="random starts per simulated fit")
    p.add_argument("--min-runs-per-size", type=int, default=3)
    p.add_argument("--min-sizes", type=int, default=0,
                   help="fewest size presets in a candidate ladder (default 0: the planned law's own minimum)")
    p.add_argument("--checkpoints", type=int, default=2,
                   help="evaluated checkpoints per run, evenly spaced (default 2: at half and at the end)")
    p.add_argument("--config", default="experiments/configs/tiny_moe.py",
                   help="config file each planned run starts from")
    p.add_argument("--batch", type=int, default=16, help="global batch size of the planned runs")
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--seed", type=int, default=0, help="simulation seed and the runs' train.seed (default 0)")
    p.add_argument("--seeds", type=int, default=1,
                   help="replicates of every run: train seeds SEED .. SEED+K-1 (default 1: none)")
    p.add_argument("--seed-sizes", default=None, help="presets that get the --seeds replicates, comma-separated "
                                                      "(default: every size)")
    p.add_argument("--mid-training", action="store_true",
                   help="at each size pretrain one base on --base-mixture, then continue from it on every mixture "
                        "(docs/data_mixture.md, 'Mid-training plans')")
    p.add_argument("--base-tokens-per-param", type=float, default=None,
                   help="mid-training: base tokens = this x size (default 20)")
    p.add_argument("--base-tokens", type=float, default=None, help="mid-training: base tokens at every size")
    p.add_argument("--mid-tokens-per-param", default=None,
                   help="mid-training: candidate mid-training tokens/params ratios, comma-separated (default 4)")
    p.add_argument("--mid-tokens", type=float, default=None, help="mid-training: mid-training tokens at every size")
    p.add_argument("--base-mixture", nargs="*", action="extend", help="mid-training: the bases' mixture, e.g. code=0.4 prose=0.6 "
                                                     "(default: uniform)")
    p.add_argument("--mid-lr-scale", type=float, default=1.0,
                   help="mid-training: peak lr = this x the experiment's optim.lr (default 1: re-warm to the base's peak)")
    p.add_argument("--target", default=None, help="plan for this target (simulated from the prior's domains): " + TARGET_HELP)
    p.add_argument("--unique-tokens", nargs="*", help="unique tokens of each scarce domain at the target run, e.g. code=2e7 "
                                                     "(every run trains on this pool; with --match-repetition, subsampled per proxy)")
    p.add_argument("--match-repetition", action="store_true",
                   help="give every proxy run a pool of unique tokens x its tokens / --target-tokens per scarce domain "
                        "(data.unique_tokens), so proxies repeat a scarce domain as often as the target run will")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--out", required=True, help="plan JSON to write")
    p.add_argument("--force", action="store_true", help=FORCE_HELP)
    p.set_defaults(func=cmd_plan)

    p = add("sweep", "Run a plan: train every run (moejax.main), evaluate its checkpoints (moejax.eval --all), "
                     "collect ROOT/runs.csv; rerun to skip finished runs and resume interrupted ones.")
    p.add_argument("--plan", required=True, help="plan JSON (written by `plan`; runs[]: name, config, overrides)")
    p.add_argument("--root", required=True, help="sweep directory: one run directory per plan run, runs.csv, sweep.log")
    p.add_argument("--backend", default="local", help="local (subprocesses on this machine) | ray (Ray tasks)")
    p.add_argument("--parallel", type=int, default=None,
                   help="runs at once (default: 1 local; ray: the cluster's CPUs (or GPUs) / the per-run share)")
    p.add_argument("--retries", type=int, default=1, help="extra attempts for a failed run (each resumes), default 1")
    p.add_argument("--eval-args", default="", help="extra moejax.eval flags, e.g. '--max-items 64 --loss-batches 4'")
    p.add_argument("--lease-timeout", type=float, default=300.0,
                   help="seconds without a heartbeat after which another runner may take a run over (default 300)")
    p.add_argument("--heartbeat", type=float, default=30.0, help="seconds between heartbeats (default 30)")
    p.add_argument("--grace", type=float, default=120.0,
                   help="seconds a run has to save its checkpoint after SIGTERM before it is killed (default 120)")
    p.add_argument("--wait-others", action="store_true",
                   help="wait for runs leased by other runners (take them over if their lease goes stale) and "
                        "collect them too; default: leave them to those runners")
    p.add_argument("--ray-address", default=None, help="Ray cluster address (ray start --head prints it); "
                                                      "default: start a local Ray cluster on this machine")
    p.add_argument("--ray-num-cpus", type=int, default=None, help="CPUs of the local Ray cluster (default: all)")
    p.add_argument("--cpus-per-run", type=float, default=1.0, help="Ray: CPUs reserved per run (default 1)")
    p.add_argument("--gpus-per-run", type=float, default=0.0, help="Ray: GPUs reserved per run (default 0)")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar, messages only (the default when stderr is not a terminal)")
    p.set_defaults(func=cmd_sweep)

    p = add("mergemix", "MergeMix: train one expert per domain from a base, merge them on device, search the merge "
                        "weights; the best is the mixture (OUT/mixture.json). Rerun to resume.")
    p.add_argument("--base", required=True, help="base workdir (a moejax training run)")
    p.add_argument("--step", type=int, default=None, help="base checkpoint step (default: its latest)")
    p.add_argument("--domains", required=True, help="training domains, comma-separated: one expert each")
    p.add_argument("--expert-tokens", type=float, required=True,
                   help="training tokens per expert (the paper: a few percent of the base's tokens)")
    p.add_argument("--out", required=True, help="output directory (experts/, cache.jsonl, mixture.json, search_*.json, plots)")
    p.add_argument("--fractions", default="0.125,0.25,0.5,1",
                   help="expert checkpoints kept, as fractions of --expert-tokens (default 0.125,0.25,0.5,1)")
    p.add_argument("--expert-fraction", type=float, default=1.0, help="which kept checkpoint is merged (default 1)")
    p.add_argument("--experts-dir", default="", help="experts directory (default OUT/experts; reused when trained)")
    p.add_argument("--router", default="linear", help="router treatment: linear (paper) | base | harc (calibrated)")
    p.add_argument("--search", default="mergemix", help="mergemix (regressor-guided, the paper) | cmaes | both")
    p.add_argument("--budget", type=int, default=60, help="merges evaluated per search (default 60)")
    p.add_argument("--seeds", type=int, default=40, help="seed design of the mergemix search (default 40)")
    p.add_argument("--task-weights", nargs="*", action="extend", help="objective: benchmark weights, e.g. know_type=2,math_copy=1 "
                                                      "(default: macro-average of every benchmark)")
    p.add_argument("--loss-weights", nargs="*", action="extend", help="objective: held-out loss weights (count negatively), e.g. code=1")
    p.add_argument("--bench-metric", default="accuracy",
                   help="what each benchmark term is: accuracy (default; exact match for generation tasks) | "
                        "gold_logprob (mean log-probability of the gold answer: continuous, no extra forward)")
    p.add_argument("--min-weight", nargs="*", action="extend", help="per-domain floors of the merge weights, e.g. code=0.05,math=0.05")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--backend", default="local", help="experts' training: local | ray")
    p.add_argument("--parallel", type=int, default=1, help="experts trained at once")
    p.add_argument("--max-items", type=int, default=64, help="benchmark items per task per merge")
    p.add_argument("--loss-batches", type=int, default=4, help="held-out batches per domain per merge")
    p.add_argument("--calib-batches", type=int, default=2, help="harc: training-split batches per domain")
    p.add_argument("--damping", type=float, default=0.1, help="harc: pull towards the linearly merged router")
    p.add_argument("--cache", default="", help="evaluation cache JSONL (default OUT/cache.jsonl)")
    p.add_argument("--expert-eval-args", default="--max-items 8 --loss-batches 1",
                   help="moejax.eval flags for the experts' own checkpoints (the sweep runner evaluates each)")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_mergemix)
    return parser


def main(argv: list[str] | None = None) -> int:
    """``data-mixture COMMAND ...`` (= ``python -m data_mixture COMMAND ...``): bad input (a
    :class:`moejax.errors.UserError`, which every error kind of data_mixture subclasses, or a
    missing file) ends in one paragraph and exit 2, Ctrl-C in one line and exit 130."""
    parser = build_parser()
    args = parser.parse_args(argv)
    os.environ.setdefault("MPLBACKEND", "Agg")

    def command() -> None:
        from data_mixture.user_files import check_inputs, check_outputs, resolve_paths

        resolve_paths(args)
        check_inputs(args)
        check_outputs(args)
        args.func(args)

    interrupted = f"interrupted: {INTERRUPTED[args.command]}" if args.command in INTERRUPTED else None
    return run(command, prog=f"{PROG} {args.command}", verbosity=args.verbosity, interrupted=interrupted,
               errors=(FileNotFoundError,))


def console(argv: list[str] | None = None) -> int:
    """The installed ``data-mixture COMMAND [arguments]`` = ``python -m data_mixture``, with mimalloc
    preloaded for the training runs a sweep or MergeMix starts (:func:`moejax.cli.preload_allocator`)."""
    args = sys.argv[1:] if argv is None else list(argv)
    if argv is None and not any(a in ("-h", "--help") for a in args[:1]):
        preload_allocator()
    return main(args)


if __name__ == "__main__":
    main()
