"""``python -m data_mixture register``: a decision registered before its target runs
(:func:`data_mixture.register.register`)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from data_mixture.cli.flags import FORCE_HELP, PROG, UsageError, named_path_type, parse_pairs, path_type

HELP = ("Pre-register a decision before its target runs: rule, candidate mixtures, each law's "
        "predictions, git commit, UTC time and a sha256 of it all.")
EXAMPLE = (f"{PROG} register --rule 'a beats b when the 95% paired t-interval over 3 seeds of loss(a) - loss(b) "
           "lies below 0' --candidates candidates.json --fits camel=fit_camel.json additive=fit_additive.json "
           "--size 6e5 --tokens 2.4e6 --out registration.json\n"
           f"{PROG} evaluate --runs proxies.csv targets.csv --registration registration.json --out-dir results/eval")
INTERRUPTED = "nothing was written (--out is unchanged). Rerun the command."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rule", required=True, help="the decision rule, in words")
    p.add_argument("--candidates", type=path_type, required=True,
                   help='JSON file {"name": {"domain": weight, ...}, ...}')
    p.add_argument("--fits", type=named_path_type, nargs="*", action="extend", metavar="LAW=FIT.json",
                   help="fits whose mean predicted loss per candidate is registered")
    p.add_argument("--predictions", type=path_type, default=None,
                   help='JSON file {"law": {"candidate": value}} of other predictions')
    p.add_argument("--comparisons", type=path_type, default=None,
                   help='JSON file [["a", "b"], ...] of the candidate pairs the rule decides (default: every pair)')
    p.add_argument("--size", type=float, default=None, help="the target model's parameter count in --size-column "
                                                            "(params_total: every parameter; params_active: used per "
                                                            "token); restricts the check to the runs at it")
    p.add_argument("--tokens", type=float, default=None, help="target tokens (for --fits)")
    p.add_argument("--size-column", default="params_total", choices=("params_total", "params_active"),
                   help="which parameter count --size and the fits' sizes mean (default params_total, as fit's)")
    p.add_argument("--metric", default="loss:mean",
                   help="what the rule compares: loss:mean, loss:<domain>, or a --target text "
                        "(e.g. knowledge=0.6,math=0.2,prose=0.2)")
    p.add_argument("--level", type=float, default=0.95, help="interval mass of the rule (default 0.95)")
    p.add_argument("--baselines-from", type=path_type, nargs="+", default=None, metavar="RUNS.csv",
                   help="add the baselines at the target as candidates (uniform, proportional and UniMax when every "
                        "pool is known, best-at-proxy and the practitioner rules target-capped/proxy-capped at 4 and "
                        "16 epochs; docs/mixture/baselines.md), from this proxy runs table; needs --tokens")
    p.add_argument("--unique-tokens", nargs="*", help="the scarce domains' pools at the target for --baselines-from, "
                                                     "e.g. knowledge=2.5e5 (default: the table's largest)")
    p.add_argument("--out", type=path_type, required=True, help="registration JSON to write")
    p.add_argument("--force", action="store_true", help=FORCE_HELP)


def run(args: argparse.Namespace) -> None:
    candidates = read_candidates(args.candidates)
    fits = dict(parse_pairs(args.fits or [], "--fits"))
    if fits and (args.size is None or args.tokens is None):
        raise UsageError("--fits needs --size and --tokens: the target point the laws predict.")
    if args.baselines_from and args.tokens is None:
        raise UsageError("--baselines-from needs --tokens: the practitioner rules cap each pool at the target's budget.")
    from data_mixture.register import register, with_baselines, write

    if args.baselines_from:
        from data_mixture.cli.flags import parse_weights
        from data_mixture.table import read_runs

        candidates = with_baselines(candidates, read_runs(*args.baselines_from), metric=args.metric, tokens=args.tokens,
                                    size_column=args.size_column,
                                    unique_tokens=parse_weights(args.unique_tokens, "--unique-tokens") or None)

    predictions = {law: predict_candidates(law, path, candidates, args.size, args.tokens) for law, path in fits.items()}
    if args.predictions:
        predictions.update(json.loads(Path(args.predictions).read_text()))
    target = ({"size_column": args.size_column, "size": args.size, "tokens": args.tokens} if args.size is not None else None)
    reg = register({"rule": args.rule, "metric": args.metric, "level": args.level}, candidates, predictions=predictions,
                   comparisons=read_comparisons(args.comparisons) if args.comparisons else None, target=target)
    write(reg, args.out)
    print(json.dumps({k: reg[k] for k in ("registered_at", "code_version", "sha256")}, indent=1))
    print(f"wrote {args.out}: {len(reg['candidates'])} candidates, {len(reg['comparisons'])} comparisons, "
          f"predictions of {', '.join(reg['predictions']) or 'no law'}")


def read_candidates(path: str, flag: str = "--candidates") -> dict:
    """``--candidates`` (or ``flag``): a JSON object of mixtures, {"name": {"domain": weight, ...}, ...}."""
    try:
        candidates = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise UsageError(f"{flag} {path}: not a readable JSON file ({e}); allowed: a JSON object "
                         '{"name": {"domain": weight, ...}, ...}.') from None
    if not isinstance(candidates, dict) or not all(isinstance(w, dict) for w in candidates.values()):
        raise UsageError(f"{flag} {path} is not an object of mixtures; allowed: "
                         '{"name": {"domain": weight, ...}, ...}.')
    return candidates


def read_comparisons(path: str) -> list:
    """``--comparisons``: a JSON list of candidate-name pairs, [["a", "b"], ...]."""
    try:
        pairs = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise UsageError(f"--comparisons {path}: not a readable JSON file ({e}); allowed: a JSON list of pairs "
                         '[["a", "b"], ...].') from None
    if not isinstance(pairs, list) or not all(isinstance(p, list) and all(isinstance(n, str) for n in p) for p in pairs):
        raise UsageError(f"--comparisons {path} is not a list of name pairs; allowed: [[\"a\", \"b\"], ...].")
    return pairs


def predict_candidates(law: str, path: str, candidates: dict, size: float, tokens: float) -> dict[str, float]:
    """One ``--fits LAW=PATH``: its mean predicted loss of every candidate at the target point."""
    import numpy as np

    from data_mixture.fit import Fit
    from data_mixture.register import RegistrationError

    fit = Fit.load(path, "--fits")
    names = list(candidates)
    absent = sorted({d for w in candidates.values() for d in w} - set(fit.mix_domains))
    if absent:
        raise RegistrationError(f"--fits {law}={path} was fitted on {', '.join(fit.mix_domains)}; the candidates "
                                f"also weigh {', '.join(absent)}.")
    mix_rm = np.array([[float(candidates[n].get(d, 0.0)) for d in fit.mix_domains] for n in names])
    pred_rv = fit.predict_losses(np.full(len(names), size), np.full(len(names), tokens), mix_rm)
    return dict(zip(names, pred_rv.mean(axis=1).tolist()))
