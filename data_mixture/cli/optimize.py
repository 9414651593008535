"""``python -m data_mixture optimize``: the best mixture at a target size and token budget
(:func:`data_mixture.optimize.optimize_mixture`), written as a mixture file ``launch.sh`` reads."""

from __future__ import annotations

import argparse

from data_mixture.cli.flags import (FIT_SIZE_HELP, FORCE_HELP, PROG, TARGET_HELP, UsageError, dataset_path_type,
                                    parse_weights, path_type, target)

HELP = "Best mixture at a target (size, tokens) under weight bounds and a repetition cap."
EXAMPLE = (f"{PROG} optimize --fit fit.json --size 3.1e6 --tokens 5e8 --objective loss "
           "--min-weight code=0.1 --max-weight math=0.4 --dataset builtin --max-epochs 4 --out mixture.json\n"
           f"{PROG} optimize --fit fit.json --size 3.1e6 --tokens 5e8 --target code=0.6,prose=0.4 "
           "--unique-tokens code=2e7 --max-epochs code=4 --out mixture.json\n"
           "./launch.sh experiments/configs/tiny_moe.py --config.data.mixture_file=mixture.json --config.train.steps=122071")
INTERRUPTED = "nothing was written (--out is unchanged). Rerun the command."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--fit", type=path_type, required=True, help="fit JSON written by `fit`")
    p.add_argument("--size", type=float, required=True, help=FIT_SIZE_HELP)
    p.add_argument("--tokens", type=float, required=True, help="target training tokens")
    p.add_argument("--objective", choices=("loss", "bench"), default="loss",
                   help="loss: minimise the weighted validation loss; bench: maximise weighted predicted accuracy")
    p.add_argument("--loss-weights", nargs="*", action="extend",
                   help="validation-domain weights, e.g. code=1 prose=2 (default: equal)")
    p.add_argument("--task-weights", nargs="*", action="extend",
                   help="benchmark-task weights (default: equal over the fit's tasks)")
    p.add_argument("--min-weight", nargs="*", action="extend", help="per-domain minimum share, e.g. code=0.1")
    p.add_argument("--max-weight", nargs="*", action="extend", help="per-domain maximum share, e.g. math=0.4")
    p.add_argument("--available", nargs="*", action="extend",
                   help="available training tokens per domain, e.g. code=1e9 math=2e8")
    p.add_argument("--dataset", type=dataset_path_type, default=None,
                   help="read available tokens from a moejax dataset: a prepared dataset directory, or 'builtin'")
    p.add_argument("--cache-dir", type=path_type, default="",
                   help="built-in corpus cache (default: $MOEJAX_CACHE or ~/.cache/moejax)")
    p.add_argument("--max-epochs", nargs="*", default=None,
                   help="repetition cap: a number (share x tokens <= available x max-epochs for every domain with "
                        "--available/--dataset tokens; default 1) or DOMAIN=EPOCHS per domain, e.g. code=4 (needs the "
                        "domain's unique tokens: --unique-tokens, --available/--dataset, or the fit's unique:<domain>)")
    p.add_argument("--unique-tokens", nargs="*", help="unique tokens of each scarce domain's pool at the target, e.g. "
                                                     "code=2e8 (repetition-aware laws and --max-epochs; default: the fit's)")
    p.add_argument("--target", default=None,
                   help="minimise this target (a fit's own target is the default): " + TARGET_HELP)
    p.add_argument("--starts", type=int, default=16, help="local-optimiser starts")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--interval", type=float, default=0.9)
    p.add_argument("--no-bootstrap", action="store_true", help="skip re-optimising per bootstrap member")
    p.add_argument("--robust", default="mean",
                   help="with a bootstrapped fit, the mixture minimising the members' mean predicted loss ('mean', "
                        "default) or a quantile ('q90'), with its odds against the baselines; 'none': the point fit's "
                        "optimum")
    p.add_argument("--baselines", default=None,
                   help='JSON file {"name": {"domain": weight}} the robust pick is compared with (default: uniform, '
                        "proportional and UniMax when every pool is known, the target-capped practitioner rules)")
    p.add_argument("--out", type=path_type, required=True,
                   help="mixture JSON (launch.sh --config.data.mixture_file=...)")
    p.add_argument("--force", action="store_true", help=FORCE_HELP)


def run(args: argparse.Namespace) -> None:
    max_epochs, domain_epochs = parse_max_epochs(args.max_epochs)
    bounds = parse_weights(args.min_weight, "--min-weight"), parse_weights(args.max_weight, "--max-weight")
    loss_weights = parse_weights(args.loss_weights, "--loss-weights") or None
    task_weights = parse_weights(args.task_weights, "--task-weights") or None
    unique_tokens = parse_weights(args.unique_tokens, "--unique-tokens") or None
    explicit = parse_weights(args.available, "--available") if args.available else None
    robust = None if args.robust == "none" else args.robust
    if robust is not None and not (robust == "mean" or (robust[:1] == "q" and robust[1:].isdigit() and 0 < int(robust[1:]) < 100)):
        raise UsageError(f"--robust {args.robust!r}; allowed: mean, qNN with 0 < NN < 100 (e.g. q90), or none.")
    baselines = None
    if args.baselines:
        from data_mixture.cli.register import read_candidates

        baselines = read_candidates(args.baselines, "--baselines")

    from data_mixture.fit import Fit
    from data_mixture.optimize import Constraints, available_tokens, optimize_mixture, write_mixture

    fit = Fit.load(args.fit)
    available = None
    if args.available or args.dataset is not None:
        available = available_tokens(explicit=explicit, dataset=args.dataset, cache_dir=args.cache_dir,
                                     domains=fit.mix_domains)
    constraints = Constraints(min_weight=bounds[0], max_weight=bounds[1], available_tokens=available,
                              max_epochs=max_epochs, domain_epochs=domain_epochs)
    result = optimize_mixture(
        fit, size=args.size, tokens=args.tokens, objective=args.objective, loss_weights=loss_weights,
        task_weights=task_weights, constraints=constraints, starts=args.starts, seed=args.seed,
        bootstrap=not args.no_bootstrap, interval=args.interval, target=target(args), unique_tokens=unique_tokens,
        robust=robust, baselines=baselines,
    )
    result["fit_file"] = str(args.fit)
    write_mixture(result, args.out)
    w = ", ".join(f"{d} {v:.3f}" for d, v in result["weights"].items())
    print(f"optimal mixture ({result['objective']['kind']} {result['objective']['value']:.4f}): {w}")
    boot = result["bootstrap"]
    if result.get("robust"):
        from data_mixture.robust import format_robust

        pw = ", ".join(f"{d} {v:.3f}" for d, v in result["point"].items())
        print("\n".join([*format_robust(result["robust"]), f"  (the point fit's optimum: {pw})"]))
    if boot.get("weights"):
        iv = ", ".join(f"{d} [{s['lo']:.3f}, {s['hi']:.3f}]" for d, s in boot["weights"].items())
        print(f"{boot['interval']:.0%} interval of the optimal weights over {boot['members']} bootstrap optima: {iv}")
    from data_mixture.sweep.targets import mixture_command

    # the dataset the mixture's domains are from, and the steps --tokens assumed
    print(f"wrote {args.out}; train with: {mixture_command(args.out, args.tokens, 'runs/optimized', dataset=args.dataset)}")


def parse_max_epochs(items: list[str] | None) -> tuple[float, dict[str, float]]:
    """``--max-epochs 4`` (every domain with available tokens) or ``--max-epochs code=4 math=8``."""
    if not items:
        return 1.0, {}
    if len(items) == 1 and "=" not in items[0]:
        try:
            return float(items[0]), {}
        except ValueError:
            raise UsageError(f"--max-epochs {items[0]!r}: expected a number or DOMAIN=EPOCHS, e.g. --max-epochs code=4") from None
    return 1.0, parse_weights(items, "--max-epochs")
