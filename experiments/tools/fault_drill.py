"""Fault drill: everything a careless or unlucky user does, run as one command, as a table.

    python -m experiments.tools.fault_drill [--fast] [--cases NAME,...] [--kills 20 --steps 60]

Every case of ``experiments/tools/fault_cases.py`` (a damaged checkpoint in eval, generate and a
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
import subprocess
import sys
import tempfile
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CONFIG_TEMPLATE = '''
from moejax.config import default_config

def get_config():
    c = default_config()
    c.train.steps, c.train.global_batch_size, c.train.seq_len = {steps}, 8, 64
    c.train.log_every, c.train.eval_every, c.train.eval_batches = 1, 1000, 1
    c.checkpoint.every_steps, c.checkpoint.max_to_keep = {every}, 2
    c.optim.warmup_steps = 5
    m = c.model
    m.d_model, m.num_layers, m.mlp_dim, m.first_k_dense = 32, 2, 64, 1
    m.num_heads, m.num_kv_heads, m.head_dim = 4, 2, 8
    m.moe.num_experts, m.moe.expert_dim, m.moe.shared_expert_dim, m.moe.tile_size = 4, 16, 16, 8
    c.data.cache_dir = {cache_dir!r}
    return c
'''


def write_config(directory: str, *, steps: int, every: int, cache_dir: str) -> str:
    path = os.path.join(directory, "drill_config.py")
    with open(path, "w") as f:
        f.write(CONFIG_TEMPLATE.format(steps=steps, every=every, cache_dir=cache_dir))
    return path


def logged_steps(workdir: str) -> dict[int, dict]:
    """step -> record of the training lines in metrics.jsonl (a line cut short by a kill is skipped)."""
    out = {}
    path = os.path.join(workdir, "metrics.jsonl")
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if "loss" in record:
                    out[record["step"]] = record
    return out


def child_xla_flags(devices: int | None) -> str:
    """``XLA_FLAGS`` for a child training process: the caller's flags (e.g. the test suite's compile
    settings) without their fake-device count, plus ``devices`` fake CPU devices (None: one, XLA's
    default)."""
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if "xla_force_host_platform_device_count" not in f]
    if devices is not None:
        flags.insert(0, f"--xla_force_host_platform_device_count={devices}")
    return " ".join(flags)


def launch(config: str, workdir: str) -> subprocess.Popen:
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=child_xla_flags(1))
    return subprocess.Popen(
        [sys.executable, "-m", "moejax.main", "--config", config, "--workdir", workdir],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )


def run_to_end(config: str, workdir: str, timeout: float = 600) -> str:
    """Runs (or resumes) the training to its last step; returns what it wrote to stderr."""
    proc = launch(config, workdir)
    _, err = proc.communicate(timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"training failed (exit {proc.returncode}):\n{err[-3000:]}")
    return err


def run_and_kill(config: str, workdir: str, at_step: int, sig: int, timeout: float = 600) -> int:
    """Starts (or resumes) the run and sends ``sig`` once metrics show ``at_step``; returns the exit code."""
    proc = launch(config, workdir)
    deadline = time.monotonic() + timeout
    while proc.poll() is None:
        if max(logged_steps(workdir), default=0) >= at_step:
            proc.send_signal(sig)
            break
        if time.monotonic() > deadline:
            proc.kill()
            raise TimeoutError(f"step {at_step} not reached in {timeout} s")
        time.sleep(0.02)
    proc.communicate(timeout=timeout)
    return proc.returncode


def divergent_steps(reference: dict[int, dict], resumed: dict[int, dict]) -> list[int]:
    """Steps whose loss or grad norm differ at all (or that are missing) in the resumed run."""
    return [
        step for step, ref in reference.items()
        if step not in resumed
        or resumed[step]["loss"] != ref["loss"]
        or resumed[step]["grad_norm"] != ref["grad_norm"]
    ]


def drill(kills: int, steps: int, every: int, sig: int, seed: int, root: str) -> tuple[int, list[int]]:
    """Runs the reference and the killed run under ``root``; returns (kills done, divergent steps)."""
    cache_dir = os.path.join(root, "cache")
    config = write_config(root, steps=steps, every=every, cache_dir=cache_dir)
    reference_dir, drill_dir = os.path.join(root, "reference"), os.path.join(root, "drill")
    run_to_end(config, reference_dir)
    rng = np.random.default_rng(seed)
    kill_steps = np.sort(rng.integers(1, steps, size=kills))
    done = 0
    for at_step in kill_steps:
        if max(logged_steps(drill_dir), default=0) >= steps:
            break
        run_and_kill(config, drill_dir, int(at_step), sig)
        done += 1
    run_to_end(config, drill_dir)
    return done, divergent_steps(logged_steps(reference_dir), logged_steps(drill_dir))


def run_cases(names: list[str], root: str, cache_dir: str, *, kills: int, steps: int, sig: int, seed: int,
              every: int) -> list[dict]:
    """Runs the named cases under ``root``; one row per case: name, what was done, ok, seconds, detail."""
    import functools

    from experiments.tools import fault_cases

    drill = fault_cases.Drill(root=root, cache_dir=cache_dir)
    by_name = {case.name: case for case in fault_cases.CASES}
    rows = []
    for name in names:
        case = by_name[name]
        run = case.run
        if name == "kill-and-resume":
            run = functools.partial(case.run, kills=kills, steps=steps, every=every, sig=sig, seed=seed)
        start = time.perf_counter()
        try:
            detail, ok = run(drill), True
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
    from experiments.tools import fault_cases

    names = [case.name for case in fault_cases.CASES]
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
        slow = {case.name for case in fault_cases.CASES if case.slow}
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
