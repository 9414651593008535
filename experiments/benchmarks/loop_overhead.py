"""The full training loop (what ``./launch.sh`` runs) against the bare jitted step, then evaluation
and generation throughput of the checkpoint it wrote.

    python -m experiments.benchmarks.loop_overhead [--steps 60] [--out results/loop_overhead.json]

1. The bare step: :func:`experiments.benchmarks.step_time.measure` on the tiny default config
   (median step time, no data loading, no logging).
2. The loop: ``python -m moejax.main`` (the command ``launch.sh`` runs) on the same config for
   ``--steps`` steps into a temporary workdir, with the default logging, evaluation and
   checkpointing scaled to the run (eval and a checkpoint at the end). Reported: wall time of the
   whole command (start-up, data, compilation included), the loop's steady tokens/s as it logs
   them (``tokens_per_sec`` in metrics.jsonl, evaluation and checkpoints excluded), and
   tokens/s over the training part of the wall time.
3. ``python -m moejax.eval`` on the final checkpoint: tokens/s of held-out scoring, of
   multiple-choice scoring and of greedy generation with the KV cache (its ``throughput``).

The ratio loop/bare is the loop's host overhead (data, metrics, syncs), but it compares two
processes. ``--host-only`` runs the in-process comparison instead (also part of the full run):
the train step on the built-in corpus's batches in blocks of 8 steps, alternated: as the loop
runs it (next batch, ``to_global``, the step, the per-step ``skipped`` sync), on batches made
beforehand with the same sync, and on batches made beforehand without syncs; plus the host work
alone (next batch and ``to_global``); and the time the built-in hooks take on a step where none
logs, evaluates or saves.
"""

from __future__ import annotations

import argparse
import copy
import glob
import json
import os
import subprocess
import sys
import tempfile
import time

import jax
import numpy as np

from experiments.benchmarks.step_time import measure
from experiments.benchmarks.timing import machine, write_json
from experiments.configs import tiny_moe


def run_loop(steps: int, workdir: str) -> dict:
    cmd = [sys.executable, "-m", "moejax.main", "--config", "experiments/configs/tiny_moe.py", "--workdir", workdir,
           f"--config.train.steps={steps}", f"--config.train.eval_every={steps}",
           f"--config.checkpoint.every_steps={steps}", f"--config.optim.warmup_steps={max(1, steps // 10)}"]
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    records = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
    logged = [r["tokens_per_sec"] for r in records if "tokens_per_sec" in r][1:]  # the first includes compilation
    return {"steps": steps, "wall_s": wall, "logged_tokens_per_sec_median": float(np.median(logged)),
            "command": " ".join(cmd)}


def host_overhead(cfg, rounds: int = 6, block: int = 8) -> dict:
    """Median ms per step of each way of feeding the step (module docstring), in one process."""
    from moejax import sharding
    from moejax.data.from_config import make_data
    from moejax.train.state import init_state, process_rows, setup, to_global
    from moejax.train.step import make_train_step

    t = cfg.train
    mesh = sharding.make_mesh({"data": 1, "fsdp": 1, "expert": 1, "tensor": 1}, jax.devices()[:1])
    run = setup(cfg, mesh)
    target = run.batch_sharding(True)
    batches = make_data(cfg, train_rows=process_rows(target, t.global_batch_size, 1)).train_iter
    next_global = lambda: to_global(next(batches), target, 1, t.global_batch_size)
    state, step = init_state(cfg, run), make_train_step(cfg, run)
    secs: dict[str, list[float]] = {"loop": [], "prefetched_synced": [], "prefetched_async": [], "host_only": []}

    def timed(name, body):
        start = time.perf_counter()
        body()
        secs[name].append((time.perf_counter() - start) / block)

    def run_steps(feed, sync):
        nonlocal state
        for batch in feed():
            state, metrics = step(state, batch)
            if sync:
                bool(metrics["skipped"])
        jax.block_until_ready(state)

    with jax.set_mesh(mesh):
        run_steps(lambda: (next_global() for _ in range(2 * block)), True)  # compile; routing moves off init
        for _ in range(rounds):
            timed("loop", lambda: run_steps(lambda: (next_global() for _ in range(block)), True))
            ready = [next_global() for _ in range(block)]
            timed("prefetched_synced", lambda: run_steps(lambda: ready, True))
            ready = [next_global() for _ in range(block)]
            timed("prefetched_async", lambda: run_steps(lambda: ready, False))
            timed("host_only", lambda: [jax.block_until_ready(next_global()) for _ in range(block)])
    return {name: 1e3 * float(np.median(v)) for name, v in secs.items()}


def hook_overhead(cfg, calls: int = 2000) -> float:
    """Median microseconds per step of firing the built-in hooks on a step where none logs,
    evaluates or saves (the steady state between log lines): the loop's cost over the bare step."""
    from moejax.checks import check_config
    from moejax.train import default_hooks
    from moejax.train.hooks import StepInfo, fire
    from moejax.train.startup import start

    cfg = copy.deepcopy(cfg)
    cfg.train.steps = cfg.train.log_every = cfg.train.eval_every = cfg.checkpoint.every_steps = 10 ** 9
    with tempfile.TemporaryDirectory() as workdir:
        mesh_shape, data_info = check_config(cfg, (), workdir)
        tr = start(cfg, workdir, mesh_shape, data_info)
        with jax.set_mesh(tr.mesh):
            tr.state, metrics = tr.train_step(tr.state, tr.next_batch())
            jax.block_until_ready(metrics)
            hooks = default_hooks.hooks(tr)
            fire(hooks, StepInfo(step=1, state=tr.state, metrics=metrics, last=False))  # the first step's extras
            times = []
            for step in range(2, calls + 2):
                start_s = time.perf_counter()
                fire(hooks, StepInfo(step=step, state=tr.state, metrics=metrics, last=False))
                times.append(time.perf_counter() - start_s)
        tr.close(None)
    return 1e6 * float(np.median(times))


def run_eval(workdir: str) -> dict:
    subprocess.run([sys.executable, "-m", "moejax.eval", "--workdir", workdir], check=True, stdout=subprocess.DEVNULL)
    path = sorted(glob.glob(os.path.join(workdir, "eval", "step_*.json")))[-1]
    return json.load(open(path))["throughput"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--bare-steps", type=int, default=10)
    parser.add_argument("--host-only", action="store_true", help="only the in-process comparison")
    parser.add_argument("--out", default="results/loop_overhead.json")
    args = parser.parse_args()
    cfg = tiny_moe.get_config()
    host = host_overhead(cfg)
    for name, ms in host.items():
        print(f"in process, {name:18s} {ms:7.1f} ms/step")
    hooks_us = hook_overhead(cfg)
    print(f"in process, the built-in hooks {hooks_us:7.1f} us/step (a step that logs nothing)")
    if args.host_only:
        write_json(args.out, {"host_overhead_ms_per_step": host, "hooks_us_per_step": hooks_us, "machine": machine()})
        return
    bare = measure(cfg, args.bare_steps)
    with tempfile.TemporaryDirectory() as workdir:
        loop = run_loop(args.steps, workdir)
        throughput = run_eval(workdir)
    ratio = loop["logged_tokens_per_sec_median"] / bare["tokens_per_sec"]
    print(f"bare step        {bare['tokens_per_sec']:8.0f} tokens/s")
    print(f"loop (logged)    {loop['logged_tokens_per_sec_median']:8.0f} tokens/s  = {ratio:.2f} x bare")
    print(f"loop wall        {loop['wall_s']:8.1f} s for {args.steps} steps (start-up, compile, eval, checkpoint incl.)")
    for phase, v in throughput.items():
        print(f"eval {phase:16s} {v['tokens_per_sec']:8.0f} tokens/s ({v['tokens']} tokens in {v['seconds']:.1f} s)")
    write_json(args.out, {"bare": bare, "loop": loop, "loop_over_bare": ratio, "eval_throughput": throughput,
                          "host_overhead_ms_per_step": host, "hooks_us_per_step": hooks_us, "machine": machine()})


if __name__ == "__main__":
    main()
