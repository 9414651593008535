"""Fault drill: everything a careless or unlucky user does, run as one command, as a table.

    python -m experiments.tools.fault_drill [--fast] [--cases NAME,...] [--kills 20 --steps 60]

Every case of ``experiments/tools/fault_cases.py`` and ``silent_cases.py`` (a damaged checkpoint in eval, generate and a
resume; an export onto its own source; damaged token shards; a failed save; the workdir lock; a
dead sweep runner's lease; ...) runs against a small trained run, and a table says for each what
was done, PASS or FAIL, the seconds and the message the user saw (exit code 1 if any case fails;
``--out`` gets the same as JSON). ``--fast`` leaves out the cases that train in processes of their
own (minutes on 2 CPU cores).

The kill drill (``--cases kill-and-resume``, or the whole drill): SIGKILL (or SIGTERM) the
training process once its metrics show a randomly chosen step, rerun the same command, which
resumes from the newest checkpoint, and compare every logged step's loss and grad norm with an
uninterrupted run of the same config: ``20 kills, 0 divergent steps``. The run trains on one CPU
device, so results must match bit for bit.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time

from experiments.tools.drill_runs import (  # noqa: F401 - the helpers tests and studies import from here
    CONFIG_TEMPLATE,
    REPO,
    child_xla_flags,
    divergent_steps,
    drill,
    launch,
    logged_steps,
    run_and_kill,
    run_to_end,
    write_config,
)


def all_cases() -> tuple:
    """Every case of the drill: fault_cases' and silent_cases' (which builds on fault_cases' helpers)."""
    from experiments.tools import fault_cases, silent_cases

    return fault_cases.CASES + silent_cases.CASES


def run_cases(names: list[str], root: str, cache_dir: str, *, kills: int, steps: int, sig: int, seed: int,
              every: int) -> list[dict]:
    """Runs the named cases under ``root``; one row per case: name, what was done, ok, seconds, detail."""
    import functools

    from experiments.tools import fault_cases

    ctx = fault_cases.Drill(root=root, cache_dir=cache_dir)
    by_name = {case.name: case for case in all_cases()}
    rows = []
    for name in names:
        case = by_name[name]
        run = case.run
        if name == "kill-and-resume":
            run = functools.partial(case.run, kills=kills, steps=steps, every=every, sig=sig, seed=seed)
        start = time.perf_counter()
        try:
            detail, ok = run(ctx), True
        except Exception as e:  # noqa: BLE001 - a case that breaks is a FAIL row, and the drill goes on
            detail, ok = f"{type(e).__name__}: {e}", False
        rows.append({"case": name, "what": case.row, "ok": ok, "seconds": round(time.perf_counter() - start, 1),
                     "detail": detail, "needs": case.needs})
        print(_table_row(rows[-1]), flush=True)
    return rows


def _table_row(row: dict) -> str:
    detail = " ".join(str(row["detail"]).split())
    detail = detail if len(detail) <= 150 else detail[:147] + "..."
    return f"| {row['case']:<27} | {'PASS' if row['ok'] else 'FAIL'} | {row['seconds']:>6.1f} | {detail} |"


def main() -> None:
    names = [case.name for case in all_cases()]
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default="", help=f"comma-separated cases (default: all): {', '.join(names)}")
    parser.add_argument("--fast", action="store_true", help="only the cases that do not train a process of their own")
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--every", type=int, default=4, help="checkpoint interval (steps) of the kill drill")
    parser.add_argument("--signal", choices=("KILL", "TERM"), default="KILL")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="results/fault_drill.json")
    args = parser.parse_args()
    chosen = [n.strip() for n in args.cases.split(",") if n.strip()] or names
    unknown = sorted(set(chosen) - set(names))
    if unknown:
        parser.error(f"--cases: unknown {', '.join(unknown)}; the cases are: {', '.join(names)}")
    if args.fast:
        slow = {case.name for case in all_cases() if case.slow}
        chosen = [n for n in chosen if n not in slow]
    print(f"| {'case':<27} | result | {'s':>6} | what the user sees |\n|{'-' * 29}|--------|{'-' * 8}|---|", flush=True)
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as root:
        cache_dir = os.environ.get("MOEJAX_CACHE") or os.path.join(root, "cache")
        rows = run_cases(chosen, root, cache_dir, kills=args.kills, steps=args.steps,
                         sig=getattr(signal, f"SIG{args.signal}"), seed=args.seed, every=args.every)
    failed = [row for row in rows if not row["ok"]]
    print(f"{len(rows) - len(failed)} of {len(rows)} cases pass" + (
        "; failed: " + ", ".join(row["case"] + (f" (needs {row['needs']})" if row["needs"] else "") for row in failed)
        if failed else ""))
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"cases": rows, "passed": len(rows) - len(failed), "failed": len(failed)}, f, indent=2)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
