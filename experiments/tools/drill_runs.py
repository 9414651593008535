"""Training runs for the fault drill: a tiny config, runs to the end, runs killed at a step, and
the kill drill (SIGKILL or SIGTERM at random steps, each time rerun, compared bit for bit with an
uninterrupted run). ``fault_drill`` (the command) and ``fault_cases`` (the cases) use them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
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
    os.makedirs(root, exist_ok=True)
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
