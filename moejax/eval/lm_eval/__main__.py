"""Run lm-evaluation-harness tasks on a moejax checkpoint, offline.

    python -m moejax.eval.lm_eval --workdir DIR --tasks T [T ...] [--include_path DIR] [--step N]
        [--batch_size 32] [--num_fewshot K] [--limit N] [--output_path FILE] [--log_samples]

prints lm-eval's results table and, with ``--output_path``, writes lm-eval's results as JSON.

    python -m moejax.eval.lm_eval run --model moejax --model_args workdir=DIR --tasks T ... [any lm-eval option]

is lm-eval's own command line (``lm_eval run ...``) with the ``moejax`` model registered: every lm-eval
option works. Both set ``HF_DATASETS_OFFLINE=1`` and ``HF_HUB_OFFLINE=1`` and refuse, before the model
is loaded, a task that needs a dataset download (:mod:`.offline`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from moejax import paths

PROG = "python -m moejax.eval.lm_eval"
LM_EVAL_COMMANDS = ("run", "ls", "validate")


def go_offline() -> None:
    """No downloads: the environment of this process and of the ``datasets`` library if already imported."""
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    os.environ["HF_HUB_OFFLINE"] = "1"
    if "datasets" in sys.modules:  # read its flag at import time
        import datasets.config

        datasets.config.HF_HUB_OFFLINE = datasets.config.HF_DATASETS_OFFLINE = True


@paths.path_flag_type
def _tasks(text: str) -> str:
    """Comma-separated task names as they are, and task YAML files resolved as the user meant them."""
    return ",".join(paths.user_path(t) if t.endswith((".yaml", ".yml")) else t for t in text.split(","))


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", required=True, type=paths.path_type, help="training run directory (holds checkpoints/)")
    parser.add_argument("--tasks", nargs="+", required=True, type=_tasks,
                        help="lm-eval task, group or tag names or task YAML files (space- or comma-separated)")
    parser.add_argument("--include_path", action="append", default=None, type=paths.path_type,
                        help="directory of task YAML files (repeatable)")
    parser.add_argument("--step", type=int, default=None, help="checkpoint step (default: the latest)")
    parser.add_argument("--batch_size", type=int, default=32, help="rows per forward / prompts per decode batch")
    parser.add_argument("--num_fewshot", type=int, default=None, help="few-shot examples (default: the task's)")
    parser.add_argument("--limit", type=float, default=None,
                        help="items per task (below 1: a fraction); for quick checks, not for reported numbers")
    parser.add_argument("--output_path", default=None, type=paths.path_type, help="write lm-eval's results to this JSON file")
    parser.add_argument("--log_samples", action="store_true", help="keep every request and response in the JSON")
    parser.add_argument("--seed", type=int, default=0, help="seed of lm-eval's few-shot sampling and shuffles")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)
    args.tasks = [t for spec in args.tasks for t in spec.split(",") if t]
    if args.batch_size < 1:
        parser.error(f"--batch_size must be positive, got {args.batch_size}")
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        import lm_eval  # noqa: F401
    except ImportError:
        sys.stderr.write(f"{PROG}: error: the lm-eval adapter needs lm-evaluation-harness, which the base install "
                         "leaves out: pip install 'moejax[eval]'.\n")
        sys.exit(2)
    go_offline()
    from moejax.train.precompile import use_persistent_cache

    use_persistent_cache()  # a second evaluation of the run (or of a run of its shape) skips the compiles
    if argv and argv[0] in LM_EVAL_COMMANDS:
        _lm_eval_cli(argv)
        return 0
    args = parse_args(argv)
    from moejax.runner import run

    return run(lambda: _evaluate(args), prog=PROG, verbosity=-1, quiet_absl=True)


def _record_moejax_version() -> None:
    """lm-eval records the git commit of the current directory by running ``git describe`` there,
    which prints ``fatal: not a git repository`` anywhere else; the results record moejax's
    version (and commit, from its own checkout) instead, without running git in the user's directory."""
    import lm_eval.evaluator

    from moejax import code_version

    lm_eval.evaluator.get_git_commit_hash = code_version


def _evaluate(args: argparse.Namespace) -> None:
    from lm_eval import simple_evaluate
    from lm_eval.utils import handle_non_serializable, make_table

    from moejax.eval.lm_eval.model import MoejaxLM
    from moejax.eval.lm_eval.offline import check_offline, task_manager

    _record_moejax_version()
    include_path = args.include_path
    manager = task_manager(args.tasks, include_path)
    check_offline(manager, args.tasks)
    lm = MoejaxLM(args.workdir, step=args.step, batch_size=args.batch_size,
                  progress=not args.no_progress)
    results = simple_evaluate(
        model=lm, tasks=args.tasks, num_fewshot=args.num_fewshot, limit=args.limit, task_manager=manager,
        log_samples=args.log_samples, random_seed=args.seed, numpy_random_seed=args.seed,
        torch_random_seed=None, fewshot_random_seed=args.seed,  # no torch in moejax: not imported to seed it
    )
    if results is None:
        return
    print(f"moejax ({lm.erun.workdir}, step {lm.ckpt.step}), limit: {args.limit}, num_fewshot: {args.num_fewshot}, "
          f"batch_size: {lm.batch_size}")
    print(make_table(results))
    if results.get("groups"):
        print("\n" + make_table(results, "groups"))
    if args.output_path:
        text = json.dumps(results, indent=2, default=handle_non_serializable, ensure_ascii=False)
        path = args.output_path
        paths.write_file(path, lambda f: f.write(text))
        print(f"wrote {path}")


def _lm_eval_cli(argv: list[str]) -> None:
    """lm-eval's command line, with ``moejax`` registered and the offline check of the tasks it names."""
    from lm_eval._cli import HarnessCLI
    from lm_eval.utils import setup_logging

    import moejax.eval.lm_eval.model  # noqa: F401  registers "moejax"
    from moejax.eval.lm_eval.offline import OfflineTaskError, check_offline, task_manager

    if argv[0] == "run":
        known, _ = _task_options().parse_known_args(argv[1:])
        if known.tasks:
            specs = [t for spec in known.tasks for t in spec.split(",") if t]
            try:
                check_offline(task_manager(specs, [known.include_path] if known.include_path else None), specs)
            except OfflineTaskError as e:
                sys.stderr.write(f"{PROG}: error: {e}\n")
                sys.exit(2)
    setup_logging()
    _record_moejax_version()
    sys.argv = ["lm-eval", *argv]
    cli = HarnessCLI()
    cli.execute(cli.parse_args())


def _task_options() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--tasks", "-t", nargs="+", default=None)
    parser.add_argument("--include_path", default=None)
    return parser


if __name__ == "__main__":
    main()
