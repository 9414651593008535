"""``python -m data_mixture sweep``: every run of a plan trained, evaluated and collected
(:func:`data_mixture.sweep.run_sweep`); a rerun skips finished runs and resumes interrupted ones."""

from __future__ import annotations

import argparse
import sys

from data_mixture.cli.flags import PROG, path_type, progress

HELP = ("Run a plan: train every run (moejax.main), evaluate its checkpoints (moejax.eval --all), "
        "collect ROOT/runs.csv; rerun to skip finished runs and resume interrupted ones.")
EXAMPLE = (f"{PROG} sweep --plan plan.json --root sweeps/ladder --parallel 2 --retries 1 --eval-args '--max-items 64'\n"
           f"{PROG} sweep --plan plan.json --root /shared/sweeps/ladder --backend ray --ray-address HEAD:6379 "
           "--cpus-per-run 4 --gpus-per-run 1")
INTERRUPTED = None  # a sweep handles Ctrl-C itself: its runs save and resume


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--plan", type=path_type, required=True,
                   help="plan JSON (written by `plan`; runs[]: name, config, overrides)")
    p.add_argument("--root", type=path_type, required=True,
                   help="sweep directory: one run directory per plan run, runs.csv, sweep.log")
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


def run(args: argparse.Namespace) -> None:
    import shlex

    from data_mixture.sweep import SweepOptions, run_sweep

    options = SweepOptions(
        root=args.root, backend=args.backend, parallel=args.parallel, retries=args.retries,
        eval_args=shlex.split(args.eval_args), lease_timeout=args.lease_timeout, heartbeat=args.heartbeat,
        grace=args.grace, wait_others=args.wait_others, progress=progress(args),
        ray_address=args.ray_address,
        cpus_per_run=args.cpus_per_run, gpus_per_run=args.gpus_per_run,
        ray_init_kwargs={"num_cpus": args.ray_num_cpus} if args.ray_num_cpus else {},
    )
    result = run_sweep(args.plan, options)
    sys.exit(result.exit_code)
