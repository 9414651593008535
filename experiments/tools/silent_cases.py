"""The fault drill's "no silent result" cases: every place where a check covered the first case and
not the rest. Each reproduces what a careless user did and checks what docs/checkpointing.md
promises; ``fault_drill.all_cases()`` adds them to ``fault_cases.CASES`` (the helpers are fault_cases')."""

from __future__ import annotations

import json
import logging
import os
import resource
import shutil
import signal
import subprocess
import sys
import textwrap
import time

from experiments.tools.fault_cases import (REPO, Case, Drill, DrillFailure, _prepared, call, expect, first_line,
                                           start_training, train)


def _scribble(path: str) -> None:
    """Random bytes behind the intact ``.npy`` header."""
    import numpy as np

    size = np.load(path, mmap_mode="r").nbytes
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) - size)
        f.write(os.urandom(size))


def later_shard(drill: Drill) -> str:
    """A dataset whose 4th training shard has random bytes behind its header: the run stops with
    exit 2 naming that shard when it first reads it, before any step trains on it."""
    dataset = _prepared(drill, "later_shard")
    shards = sorted(f for f in os.listdir(os.path.join(dataset, "prose")) if f.endswith(".train.tokens.npy"))
    expect(len(shards) >= 4, f"the drill's dataset has only {len(shards)} shards")
    shard = os.path.join(dataset, "prose", shards[3])
    _scribble(shard)
    workdir = os.path.join(drill.root, "later_shard_run")
    result = train(drill, workdir, f"--config.data.path={dataset}", '--config.data.schedule=[[0, {"prose": 1}]]')
    expect(result.code == 2 and shard in result.err and "does not match the sha256" in result.err,
           f"exit {result.code}, expected 2 naming {shard}:\n{result.err[-2000:]}")
    expect("loss=nan" not in result.out and "Traceback" not in result.err, "a step trained on the damaged shard")
    return "exit 2: " + first_line(result.err.split("error:")[-1], 140)


def damaged_corpus_cache(drill: Drill) -> str:
    """The built-in corpus cache's held-out file scribbled: rebuilt with one notice, and the run's
    evaluations are finite."""
    from moejax.data import corpus

    name = f"{corpus.CORPUS_VERSION}-seed0"
    corpus.load_tokenized_corpus(0, drill.cache_dir)  # the drill's cache, complete
    cache = os.path.join(drill.root, "damaged_cache")
    shutil.copytree(os.path.join(drill.cache_dir, name), os.path.join(cache, name))
    damaged = os.path.join(cache, name, "prose.heldout.tokens.npy")
    _scribble(damaged)
    result = train(drill, os.path.join(drill.root, "damaged_cache_run"), f"--config.data.cache_dir={cache}",
                   "--config.train.steps=2")
    notice = [line for line in result.err.splitlines() if "is damaged" in line]
    expect(result.code == 0 and len(notice) == 1 and damaged in notice[0] and "rebuilt" in notice[0],
           f"exit {result.code}; no single rebuild notice:\n{result.err[-2000:]}")
    expect("nan" not in result.out.split("done:")[-1], f"a nan in the summary:\n{result.out[-500:]}")
    return first_line(notice[0], 160)


_INJECT = textwrap.dedent("""
    import sys
    import numpy as np
    from moejax import main
    from moejax.train import default_hooks, startup
    where, last = sys.argv[1], int(sys.argv[2])
    module = default_hooks if where == "eval" else startup
    original, calls = module.to_global, []

    def damaged(batch, *args):  # a batch whose loss is non-finite (every loss_mask entry nan)
        calls.append(1)
        if where == "eval" or len(calls) == last:
            batch = dict(batch, loss_mask=np.full_like(batch["loss_mask"], np.nan))
        return original(batch, *args)

    module.to_global = damaged
    sys.exit(main.main(["moejax", *sys.argv[3:]]))
""")


def _nan_run(drill: Drill, name: str, where: str, last: int = 0):
    from experiments.tools.drill_runs import child_xla_flags

    workdir = os.path.join(drill.root, name)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", _INJECT, where, str(last), "--config", drill.config(), "--workdir",
                           workdir, f"--config.train.steps={drill.steps}"], cwd=REPO, capture_output=True, text=True,
                          env=dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=child_xla_flags(1)), timeout=600)
    return proc, workdir, time.perf_counter() - start


def nan_evaluation(drill: Drill) -> str:
    """Held-out batches whose loss is not finite (injected): the run stops at its first evaluation,
    exit 3, naming the step and the domains; no 'nan -> nan' summary."""
    proc, _, _ = _nan_run(drill, "nan_eval", "eval")
    expect(proc.returncode == 3 and "the evaluation at step 0 gave a non-finite held-out loss" in proc.stderr
           and "Likely cause:" in proc.stderr, f"exit {proc.returncode}:\n{proc.stderr[-2000:]}")
    expect("done:" not in proc.stdout, f"a summary line for a nan result:\n{proc.stdout[-500:]}")
    return "exit 3: " + first_line(proc.stderr.split("moejax: ")[-1], 140)


def nan_last_step(drill: Drill) -> str:
    """A run whose last step's loss is non-finite (injected) stops with exit 3 instead of ending on nan."""
    proc, workdir, _ = _nan_run(drill, "nan_last", "train", last=drill.steps)
    expect(proc.returncode == 3 and f"the last step ({drill.steps}) had a non-finite loss" in proc.stderr,
           f"exit {proc.returncode}:\n{proc.stderr[-2000:]}")
    expect(not os.path.isdir(os.path.join(workdir, "checkpoints", str(drill.steps))), "a checkpoint of the nan step")
    return "exit 3: " + first_line(proc.stderr.split("moejax: ")[-1], 140)


def disk_full_prepare(drill: Drill) -> str:
    """prepare whose writes fail for want of space (files may not grow past 64 KiB: EFBIG, as ENOSPC
    is on a full disk) in its worker processes: one paragraph, exit 2, nothing left behind."""
    source = os.path.join(drill.root, "disk_full.jsonl")
    with open(source, "w") as f:
        for i in range(3000):
            f.write(json.dumps({"text": f"document {i}: " + "some words " * 40}) + "\n")
    out = os.path.join(drill.root, "disk_full_out")

    def small_files() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))

    proc = subprocess.run([sys.executable, "-m", "moejax.data.prepare", "--source", f"prose={source}", "--out", out,
                           "--workers", "2", "--shard-mb", "0.5"], cwd=REPO, capture_output=True, text=True,
                          preexec_fn=small_files, timeout=300)
    expect(proc.returncode == 2 and "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
           and "is full" in proc.stderr, f"exit {proc.returncode}:\n{proc.stderr[-2000:]}")
    expect(not os.path.exists(out), f"{out} was left behind")
    return first_line(proc.stderr.split("error:")[-1], 150)


def generate_not_utf8(drill: Drill) -> str:
    """generate --prompt with bytes that are not UTF-8 (a Latin-1 terminal): one paragraph, exit 2."""
    from moejax import generate as generate_cli

    prompt = b"caf\xe9".decode("utf-8", "surrogateescape")  # what Python makes of such an argument
    result = call(generate_cli.main, ["--workdir", drill.reference(), "--prompt", prompt])
    expect(result.code == 2 and "byte 0xe9 at position 3 is not valid UTF-8" in result.err
           and "Traceback" not in result.err, f"exit {result.code}\n{result.err[-2000:]}")
    return first_line(result.err.split("error:")[-1], 150)


def sweep_keeps_checkpoints(drill: Drill) -> str:
    """A sweep runner SIGKILLed and restarted: its runs' off-cadence checkpoints (saved on each stop)
    never push a scheduled checkpoint out before it is evaluated."""
    import numpy as np

    from data_mixture.sweep.targets import targets_from_plan
    from moejax.train.checkpoint import Checkpointer

    plan = {"runs": [{"name": "r", "overrides": {"train.steps": 30, "checkpoint.every_steps": 10}}]}
    (target,) = targets_from_plan(plan, os.path.join(drill.root, "sweep_keep"))
    keep = target.resolved_config["checkpoint"]
    checkpointer = Checkpointer(os.path.join(drill.root, "sweep_keep_ckpt"), max_to_keep=keep["max_to_keep"],
                                keep_period=keep["keep_period"])
    for step in (10, 13, 17, 20, 24, 30):  # 13, 17, 24: a child stopped by each kill of its runner
        checkpointer.save(step, {"w": np.zeros(2, np.float32)}, {}, {})
        checkpointer.wait()
    kept = checkpointer.steps()
    expect({10, 20, 30} <= set(kept), f"scheduled checkpoints lost before evaluation: kept {kept}")
    return f"checkpoints kept {kept} (max_to_keep {keep['max_to_keep']}, keep_period {keep['keep_period']})"


def double_sigterm(drill: Drill) -> str:
    """Two SIGTERMs 0.3 s apart: the first one's checkpoint is still saved, the second is answered
    with one line, exit 143."""
    workdir = os.path.join(drill.root, "double_term")
    proc = start_training(drill, workdir, "--config.train.steps=400")
    deadline = time.monotonic() + 300
    while not os.path.isfile(os.path.join(workdir, "metrics.jsonl")) or os.path.getsize(
            os.path.join(workdir, "metrics.jsonl")) < 200:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise DrillFailure(f"training did not start:\n{proc.communicate()[1][-2000:]}")
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    steps = [int(s) for s in os.listdir(os.path.join(workdir, "checkpoints")) if s.isdigit()]
    expect(proc.returncode == 143 and "checkpoint saved" in err and steps,
           f"exit {proc.returncode}, checkpoints {steps}:\n{err[-2000:]}")
    return " / ".join(line for line in err.splitlines() if "SIGTERM" in line)[:200]


def metadata_notes(drill: Drill) -> str:
    """A checkpoint without its _CHECKPOINT_METADATA file: no absl 'Metadata file does not exist'
    lines ahead of moejax's own messages."""
    from moejax.train.checkpoint import Checkpointer

    workdir = drill.copy("no_metadata")
    os.remove(os.path.join(workdir, "checkpoints", "12", "_CHECKPOINT_METADATA"))
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())  # type: ignore[method-assign]
    absl = logging.getLogger("absl")
    absl.addHandler(handler)
    try:
        latest = Checkpointer(os.path.join(workdir, "checkpoints"), max_to_keep=2).latest_step()
    finally:
        absl.removeHandler(handler)
    shown = [r for r in records if "Metadata file does not exist" in r]
    expect(latest == 12 and not shown, f"latest {latest}; absl said: {shown[:2]}")
    return "no absl notes; latest step 12 reads"


def launch_script(drill: Drill) -> str:
    """./launch.sh python script.py from another directory runs that directory's script.py."""
    here = os.path.join(drill.root, "elsewhere")
    os.makedirs(here, exist_ok=True)
    with open(os.path.join(here, "hello.py"), "w") as f:
        f.write("print('ran', __file__)\n")
    env = {**os.environ, "MOEJAX_PYTHON": sys.executable, "MOEJAX_ALLOCATOR": "system", "MOEJAX_CHECK_PINS": "0"}
    proc = subprocess.run([os.path.join(REPO, "launch.sh"), "python", "hello.py"], cwd=here, env=env,
                          capture_output=True, text=True, timeout=120)
    expect(proc.returncode == 0 and os.path.join(here, "hello.py") in proc.stdout,
           f"exit {proc.returncode}:\n{proc.stdout[-500:]}{proc.stderr[-1500:]}")
    return proc.stdout.strip()[:150]


def path_flags_elsewhere(drill: Drill) -> str:
    """``register --fits NAME=F.json`` (and its other path flags) from another directory, through
    launch.sh: the user's files are read and written there, not the repository's."""
    from experiments.tools.fault_cases import _mixture_fit

    here = os.path.join(drill.root, "user_dir")
    os.makedirs(here, exist_ok=True)
    shutil.copy(_mixture_fit(drill, (1e6, 3e6), "elsewhere"), os.path.join(here, "fit.json"))
    with open(os.path.join(here, "candidates.json"), "w") as f:
        json.dump({"even": {"prose": 0.34, "math": 0.33, "code": 0.33},
                   "math": {"prose": 0.2, "math": 0.6, "code": 0.2}}, f)
    env = {**os.environ, "MOEJAX_PYTHON": sys.executable, "MOEJAX_ALLOCATOR": "system", "MOEJAX_CHECK_PINS": "0",
           "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([os.path.join(REPO, "launch.sh"), "python", "-m", "data_mixture", "register", "--rule",
                           "lower", "--candidates", "candidates.json", "--fits", "regmix=fit.json", "--size", "3e6",
                           "--tokens", "6e7", "--out", "registration.json"], cwd=here, env=env, capture_output=True,
                          text=True, timeout=300)
    out = os.path.join(here, "registration.json")
    expect(proc.returncode == 0 and os.path.isfile(out), f"exit {proc.returncode}:\n{proc.stderr[-2000:]}")
    expect(not os.path.exists(os.path.join(REPO, "registration.json")), "written into the repository")
    from data_mixture.cli.register import predict_candidates, read_candidates

    with open(out) as f:
        registered = json.load(f)["predictions"]["regmix"]
    mine = predict_candidates("regmix", os.path.join(here, "fit.json"), read_candidates(
        os.path.join(here, "candidates.json")), 3e6, 6e7)
    expect(registered == mine, f"registered {registered}, the user's fit predicts {mine}")
    return "registered the user's fit's predictions: " + ", ".join(f"{k} {v:.4f}" for k, v in registered.items())


CASES = (
    Case("later-shard", "the 4th training shard scribbled behind its header, then train", later_shard, slow=True),
    Case("damaged-corpus-cache", "the built-in corpus cache's held-out file scribbled, then train",
         damaged_corpus_cache, slow=True),
    Case("nan-evaluation", "held-out batches whose loss is not finite", nan_evaluation, slow=True),
    Case("nan-last-step", "a run whose last step's loss is not finite", nan_last_step, slow=True),
    Case("disk-full-prepare", "prepare's workers run out of space", disk_full_prepare),
    Case("generate-not-utf8", "generate --prompt in Latin-1 bytes", generate_not_utf8),
    Case("sweep-keeps-checkpoints", "a sweep runner killed and restarted (off-cadence checkpoints)",
         sweep_keeps_checkpoints),
    Case("double-sigterm", "two SIGTERMs 0.3 s apart", double_sigterm, slow=True),
    Case("metadata-notes", "a checkpoint without its _CHECKPOINT_METADATA file", metadata_notes),
    Case("launch-script", "./launch.sh python script.py from another directory", launch_script),
    Case("path-flags-elsewhere", "register --fits NAME=F.json from another directory", path_flags_elsewhere,
         slow=True),
)
