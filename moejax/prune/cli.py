"""The command line: ``python -m moejax.prune`` (see :mod:`moejax.prune`)."""

from __future__ import annotations

import argparse

from moejax import paths
from moejax.log import add_verbosity_flags
from moejax.runner import run
from moejax.prune.prune import DEFAULT_CALIB_TOKENS, METHODS, Budget, describe, prune_workdir


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m moejax.prune",
        description="Write a pruned copy of a workdir's checkpoint whose MoE layers hold fewer experts "
                    "(docs/pruning.md).",
    )
    parser.add_argument("--workdir", required=True, type=paths.path_type, help="the trained (or imported) workdir to prune")
    parser.add_argument("--step", type=int, default=None, help="its checkpoint step (default: the latest)")
    parser.add_argument("--method", required=True, choices=METHODS, help="how the kept experts are chosen")
    parser.add_argument("--keep", type=int, default=None, help="experts each MoE layer keeps")
    parser.add_argument("--ratio", type=float, default=None, help="fraction of each MoE layer's experts removed")
    parser.add_argument("--auto", action="store_true",
                        help="per-layer counts at each layer's distortion knee; with --keep or --ratio, "
                             "that many experts kept over all layers")
    parser.add_argument("--out", required=True, type=paths.path_type, help="the new workdir to write (must not exist)")
    parser.add_argument("--layers", type=int, nargs="+", default=None,
                        help="decoder layers to prune (MoE layers; default: all)")
    parser.add_argument("--refit", action=argparse.BooleanOptionalAction, default=None,
                        help="refit the kept experts' down projections after the selection (default: on for "
                             "step only; --refit with schur_astar was the best variant measured, docs/pruning.md)")
    parser.add_argument("--calib-tokens", type=int, default=DEFAULT_CALIB_TOKENS,
                        help="calibration tokens from the training split (default %(default)s)")
    parser.add_argument("--max-nodes", type=int, default=200_000,
                        help="schur_astar: search nodes per layer before falling back to the best found")
    parser.add_argument("--max-seconds", type=float, default=60.0,
                        help="schur_astar: seconds per layer before falling back to the best found")
    add_verbosity_flags(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    return run(lambda: _prune(args), prog="moejax", verbosity=args.verbosity, quiet_absl=True)


def _prune(args: argparse.Namespace) -> None:
    record = prune_workdir(
        args.workdir, args.out, args.method,
        Budget(keep=args.keep, ratio=args.ratio, auto=args.auto), step=args.step,
        calib_tokens=args.calib_tokens, max_nodes=args.max_nodes, max_seconds=args.max_seconds,
        layers=tuple(args.layers) if args.layers else None, refit=args.refit,
    )
    print(describe(record))
    print(f"wrote {args.out}")
