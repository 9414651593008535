"""The command line: ``moejax upcycle`` / ``python -m moejax.upcycle`` (see :mod:`moejax.upcycle`)."""

from __future__ import annotations

import argparse
import os

from moejax import paths
from moejax.commands import train_command
from moejax.errors import ConfigError
from moejax.log import add_verbosity_flags
from moejax.runner import run
from moejax.upcycle.experts import METHODS, Plan

DEFAULT_DROP_RATIO = 0.5  # the ratio the Drop-Upcycling paper recommends


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="moejax upcycle",
        description="Make a dense model (a moejax workdir or a Hugging Face Llama/Qwen2/Qwen3 directory) into an "
                    "MoE in a new workdir (docs/upcycling.md).",
    )
    parser.add_argument("--from", dest="source", required=True, metavar="WORKDIR_OR_HF_DIR", type=paths.path_type,
                        help="the dense model: a moejax workdir (its latest checkpoint) or a save_pretrained directory")
    parser.add_argument("--workdir", required=True, type=paths.path_type, help="the new workdir to write (must not exist or be empty)")
    parser.add_argument("--experts", type=int, required=True, help="routed experts per layer")
    parser.add_argument("--top-k", type=int, required=True, help="experts each token is routed to")
    parser.add_argument("--shared-expert", action="store_true",
                        help="add one always-on shared expert, a copy of the dense MLP (shared and routed halves "
                             "add up to the dense MLP)")
    parser.add_argument("--method", choices=METHODS, default="copy",
                        help="copy: every expert is the dense MLP (or a slice of it), the start computes the dense "
                             "model; drop: Drop-Upcycling, a share of each expert's units re-initialised "
                             "(default: %(default)s)")
    parser.add_argument("--drop-ratio", type=float, default=None,
                        help=f"drop: share of each expert's intermediate units re-initialised (default {DEFAULT_DROP_RATIO})")
    parser.add_argument("--expert-width", type=int, default=None,
                        help="each expert's width, a divisor of the dense MLP's width (default: the whole width); "
                             "narrower experts are slices of the dense MLP")
    parser.add_argument("--seed", type=int, default=0, help="seed of the router's and drop's draws (default 0)")
    add_verbosity_flags(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    target = args.workdir
    return run(lambda: _upcycle(args), prog="moejax", verbosity=args.verbosity, quiet_absl=True,
               interrupted=f"interrupted; nothing was written to {target} (it is renamed into place only when "
                           "complete). Rerun the command.")


def _upcycle(args: argparse.Namespace) -> None:
    from moejax.upcycle.workdir import upcycle

    if args.method == "copy" and args.drop_ratio is not None:
        raise ConfigError(f"--drop-ratio {args.drop_ratio} is given with --method copy, which re-initialises "
                          "nothing; use --method drop, or leave --drop-ratio out.")
    plan = Plan(experts=args.experts, top_k=args.top_k, expert_width=args.expert_width,
                shared_expert=args.shared_expert, method=args.method,
                drop_ratio=DEFAULT_DROP_RATIO if args.drop_ratio is None else args.drop_ratio, seed=args.seed)
    source, workdir = args.source, args.workdir
    record = upcycle(source, workdir, plan)
    start = ("computes the dense model (function-preserving start)" if record["function_preserving"]
             else "does not compute the dense model at the start"
             + (" (drop re-initialises units)" if plan.method == "drop"
                else f" (top-k {plan.top_k} is not a multiple of the {record['slices']} slices)"))
    print(f"upcycled {args.source} into {args.workdir}: {plan.experts} experts of width {record['expert_width']} "
          f"(dense {record['dense_width']}), top-{plan.top_k}, {plan.method}"
          + (", one shared expert" if plan.shared_expert else "") + f"; it {start}")
    print(f"train from it with: {train_command(os.path.join(workdir, 'experiment.py'), 'runs/NAME', [])}")
