"""Evaluate a run's checkpoints: ``python -m moejax.eval --workdir DIR [--step N | --all] [--tasks ...]``.

Writes ``DIR/eval/step_N.json`` per checkpoint and prints a table; ``--all`` evaluates every
checkpoint (reusing a ``step_N.json`` made with the same settings) and plots
``DIR/eval/curves.png``. A ``step_N.json`` made with other settings is kept unless ``--force``;
results are written under a temporary name and renamed into place. Keys and defaults:
``docs/eval.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys

from moejax import paths
from moejax.config import BENCHMARK_VERSIONS
from moejax.errors import ConfigError
from moejax.eval.evaluate import (
    DEFAULT_BATCH_SIZE, DEFAULT_MAX_ITEMS, DEFAULT_MAX_NEW_TOKENS, Settings, Evaluator, make_settings,
)
from moejax.eval.plots import plot_curves
from moejax.eval.report import format_result
from moejax.eval.restore import open_run
from moejax.log import add_verbosity_flags
from moejax.runner import run
from moejax.train.precompile import use_persistent_cache

log = logging.getLogger(__name__)


@paths.path_flag_type
def _task(text: str) -> str:
    """A built-in task's name as it is (names have no suffix), or a JSONL task file resolved as the user meant it."""
    return paths.user_path(text) if text.endswith(".jsonl") or os.sep in text else text


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m moejax.eval", description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", required=True, type=paths.path_type, help="training run directory (holds checkpoints/)")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--step", type=int, default=None, help="checkpoint step (default: the latest)")
    which.add_argument("--all", action="store_true", help="every checkpoint, then plot the curves")
    parser.add_argument(
        "--tasks", nargs="*", default=None, type=_task,
        help="built-in task names (of either benchmarks version, e.g. code_chars know_type or v1's code prose "
             "math knowledge) and/or JSONL files; default: the tasks of --benchmarks for runs on the built-in "
             "corpus, none otherwise; '--tasks' alone: none",
    )
    parser.add_argument(
        "--benchmarks", choices=BENCHMARK_VERSIONS, default=None,
        help="built-in benchmarks version of the default tasks (default: the run's data.benchmarks, "
             f"{BENCHMARK_VERSIONS[-1]} unless set)",
    )
    parser.add_argument("--max-items", type=int, default=DEFAULT_MAX_ITEMS, help="items per task (0: all)")
    parser.add_argument("--loss-batches", type=int, default=None,
                        help="held-out batches per domain (default: the run's train.eval_batches)")
    parser.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE, help="rows per benchmark batch")
    parser.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS, help="exact-match budget")
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress bars (there are none when stderr is not a terminal)")
    parser.add_argument("--force", action="store_true",
                        help="replace an eval/step_N.json made with other settings (default: refuse)")
    add_verbosity_flags(parser)
    args = parser.parse_args(argv)
    for name in ("max_items", "loss_batches", "batch_size", "max_new_tokens"):
        value = getattr(args, name)
        if value is not None and (value < 0 or (value == 0 and name != "max_items")):
            parser.error(f"--{name.replace('_', '-')} must be positive, got {value}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    use_persistent_cache()  # evaluating again (or the next checkpoint of the shape) skips the compiles
    return run(lambda: _evaluate(args), prog="moejax.eval", verbosity=args.verbosity, quiet_absl=True,
               interrupted=f"interrupted; the results already written are in {os.path.join(args.workdir, 'eval')}. "
                           "Rerun the command (with --all, finished checkpoints are reused).")


def _evaluate(args: argparse.Namespace) -> None:
    """Evaluates the checkpoints ``args`` name, writing one JSON result per checkpoint."""
    erun = open_run(args.workdir)
    settings = make_settings(
        erun, tasks=args.tasks, max_items=args.max_items, loss_batches=args.loss_batches,
        batch_size=args.batch_size, max_new_tokens=args.max_new_tokens, benchmarks=args.benchmarks,
    )
    # bars only on a terminal: redirected to a file, a bar's redraws would fill it
    evaluator = Evaluator(erun, settings, progress=not args.no_progress and sys.stderr.isatty())
    # the default: the newest checkpoint that reads (a damaged latest one is reported and skipped)
    loaded = {ckpt.step: ckpt for ckpt in [erun.load(None)]} if not args.all and args.step is None else {}
    steps = erun.steps if args.all else list(loaded) or [args.step]
    out_dir = os.path.join(erun.workdir, "eval")
    paths.make_dir(out_dir, "--workdir (its eval/ directory)")
    for step in steps:
        if step not in erun.steps:
            erun.load(step)  # the error that names the steps there are
        _check_replaceable(os.path.join(out_dir, f"step_{step}.json"), settings, args.force)
    results = []
    for step in steps:
        path = os.path.join(out_dir, f"step_{step}.json")
        result = _reusable(path, settings) if args.all else None
        if result is None:
            result = evaluator.evaluate(loaded.pop(step, None) or erun.load(step))
            paths.write_file(path, lambda f: json.dump(result, f, indent=1))
            print(format_result(result) + f"\n\nwrote {path}\n")
        else:
            log.info(f"step {step}: reusing {path} (same settings)")
        results.append(result)
    if args.all:
        print(f"wrote {plot_curves(results, os.path.join(out_dir, 'curves.png'))}")


def _check_replaceable(path: str, settings: Settings, force: bool) -> None:
    """Refuses to replace a saved result made with other settings (or unreadable) unless ``force``."""
    if not os.path.exists(path) or force or _reusable(path, settings) is not None:
        return
    raise ConfigError(f"{path} holds a result made with other settings (tasks, items, batches); refusing "
                      "to overwrite it. Pass --force to replace it, or move it aside first.")


def _reusable(path: str, settings: Settings) -> dict | None:
    """A saved result made with the same settings, or None."""
    if not os.path.isfile(path):
        return None
    try:
        with open(path) as f:
            result = json.load(f)
    except (OSError, ValueError):  # cut short or not ours
        return None
    same = isinstance(result, dict) and result.get("settings") == json.loads(json.dumps(dataclasses.asdict(settings)))
    return result if same else None


if __name__ == "__main__":
    main()
