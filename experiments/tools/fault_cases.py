"""The fault drill's cases: what a careless or unlucky user does, and what must happen then.

Each case runs the normal command (the command line's ``main`` in this process, or training in
its own process, as a user would) against a small trained run or prepared dataset, and raises
``DrillFailure`` saying what went wrong when the behaviour differs from what
docs/checkpointing.md ("What happens when things go wrong") promises; it returns a one-line
detail (the message the user sees, trimmed) when it holds. ``experiments/tools/fault_drill.py``
runs them and prints a table; ``tests/test_fault_drill.py`` runs each as a test (the ones that
train in a process of their own are marked slow).
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import io
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class DrillFailure(AssertionError):
    """The behaviour differs from the promised one; the message says how."""


def expect(condition: bool, message: str) -> None:
    if not condition:
        raise DrillFailure(message)


@dataclasses.dataclass
class Drill:
    """Where a drill runs: ``root`` (scratch space), the corpus cache, and a trained reference run
    (``reference()``: checkpoints at steps 9 and 12 of a 12-step run, made on first use unless given)."""

    root: str
    cache_dir: str
    reference_dir: str | None = None
    steps: int = 12
    every: int = 3

    def config(self) -> str:
        """The drill's training config file (experiments/tools/drill_runs.py's template)."""
        from experiments.tools import drill_runs

        directory = os.path.join(self.root, "config")
        os.makedirs(directory, exist_ok=True)
        return drill_runs.write_config(directory, steps=self.steps, every=self.every, cache_dir=self.cache_dir)

    def reference(self) -> str:
        if self.reference_dir is None:
            from experiments.tools import drill_runs

            self.reference_dir = os.path.join(self.root, "reference")
            drill_runs.run_to_end(self.config(), self.reference_dir)
        return self.reference_dir

    def copy(self, name: str) -> str:
        """A copy of the reference run to damage."""
        target = os.path.join(self.root, name)
        shutil.copytree(self.reference(), target)
        return target


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    row: str  # what the user did, in a few words
    run: Callable[[Drill], str]
    slow: bool = False  # trains in a process of its own (tens of seconds)
    needs: str = ""  # a part of the library this case checks that lands separately, if any


# ------------------------------------------------------------------------------------------ helpers


@dataclasses.dataclass
class Result:
    code: int
    out: str
    err: str
    seconds: float


def call(main: Callable[[list[str]], object], argv: list[str]) -> Result:
    """A command line's ``main(argv)`` in this process: exit status, stdout, stderr, seconds."""
    out, err = io.StringIO(), io.StringIO()
    start = time.perf_counter()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
            code = int(code or 0)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return Result(code, out.getvalue(), err.getvalue(), time.perf_counter() - start)


def command(module: str, argv: list[str], timeout: float = 600) -> Result:
    """``python -m module argv`` in its own process (a command that reads checkpoints: in this
    process, what earlier commands left to the garbage collector would print into its stderr)."""
    from experiments.tools.drill_runs import child_xla_flags

    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", module, *argv], cwd=REPO, capture_output=True, text=True,
                          env=dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=child_xla_flags(1)), timeout=timeout)
    return Result(proc.returncode, proc.stdout, proc.stderr, time.perf_counter() - start)


def start_training(drill: Drill, workdir: str, *overrides: str, preexec: Callable[[], None] | None = None,
                   env: dict[str, str] | None = None) -> subprocess.Popen:
    """``python -m moejax.main --config <drill config> --workdir workdir [overrides]`` in its own process."""
    from experiments.tools.drill_runs import child_xla_flags

    command = [sys.executable, "-m", "moejax.main", "--config", drill.config(), "--workdir", workdir, *overrides]
    return subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=child_xla_flags(1), **(env or {})),
                            preexec_fn=preexec)


def train(drill: Drill, workdir: str, *overrides: str, preexec: Callable[[], None] | None = None,
          env: dict[str, str] | None = None, timeout: float = 600) -> Result:
    """Training to its end (``start_training``): exit status, stdout, stderr, seconds."""
    start = time.perf_counter()
    proc = start_training(drill, workdir, *overrides, preexec=preexec, env=env)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise DrillFailure(f"training into {workdir} was still running after {timeout:g} s (killed)") from None
    return Result(proc.returncode, out, err, time.perf_counter() - start)


def listing(directory: str) -> dict[str, int]:
    """Every file under ``directory`` with its size: what must stay intact."""
    return {os.path.relpath(os.path.join(root, f), directory): os.path.getsize(os.path.join(root, f))
            for root, _, files in os.walk(directory) for f in files}


def first_line(text: str, limit: int = 160) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    line = lines[0] if lines else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def damage_latest(workdir: str) -> str:
    """Truncates the array data of the newest checkpoint (as a crash mid-copy would); its step dir."""
    steps = sorted(int(s) for s in os.listdir(os.path.join(workdir, "checkpoints")) if s.isdigit())
    latest = os.path.join(workdir, "checkpoints", str(steps[-1]))
    for path in glob.glob(os.path.join(latest, "state", "**", "d", "*"), recursive=True):
        with open(path, "r+b") as f:
            f.truncate(os.path.getsize(path) // 2)
    return latest


# -------------------------------------------------------------------------------------------- cases


def export_onto_source(drill: Drill) -> str:
    """An export whose target is the workdir, its parent or a directory inside it is refused, with
    --force too, and nothing is deleted; --force over a directory the export did not write is refused."""
    from moejax.interop.hf import cli as hf_cli

    parent = os.path.join(drill.root, "export_parent")
    os.makedirs(parent)
    workdir = os.path.join(parent, "run")
    shutil.copytree(drill.reference(), workdir)
    with open(os.path.join(parent, "notes.txt"), "w") as f:
        f.write("a sibling file the user keeps")
    before = listing(parent)
    details = []
    for target, how in ((workdir, "is the workdir itself"), (parent, "contains the workdir"),
                        (os.path.join(workdir, "hf"), "lies inside the workdir")):
        result = call(hf_cli.main, ["export", "--workdir", workdir, "--hf-dir", target, "--force"])
        expect(result.code == 2, f"export --hf-dir {target} --force: exit {result.code}, expected 2\n{result.err[-2000:]}")
        expect(how in result.err, f"export --hf-dir {target}: the message does not say it {how}: {result.err[-500:]}")
        expect(listing(parent) == before, f"export --hf-dir {target} changed the files under {parent}")
        details.append(how)
    foreign = os.path.join(drill.root, "export_foreign")
    os.makedirs(foreign)
    with open(os.path.join(foreign, "keep.txt"), "w") as f:
        f.write("not written by an export")
    result = call(hf_cli.main, ["export", "--workdir", workdir, "--hf-dir", foreign, "--force"])
    expect(result.code == 2 and "--force replaces only a previous export" in result.err,
           f"export --force over a directory of other files: exit {result.code}\n{result.err[-1000:]}")
    expect(os.listdir(foreign) == ["keep.txt"], f"{foreign} was changed: {os.listdir(foreign)}")
    return "refused (exit 2), nothing deleted: " + "; ".join(details) + "; --force over others' files"


def _one_notice(err: str, who: str) -> None:
    """One notice: its first line, then one indented line per damaged step; no traceback."""
    lines = err.splitlines()
    first = next(i for i, line in enumerate(lines) if "is damaged; using step" in line)
    block = [lines[first]] + [line for line in lines[first + 1:first + 4] if line.startswith("  step ")]
    expect("Traceback" not in err and len(block) == 2 and len(block[1]) < 600,
           f"{who}'s notice is not one line per damaged step:\n{err[-3000:]}")


def damaged_checkpoint_eval(drill: Drill) -> str:
    """eval on a workdir whose latest checkpoint is damaged: one notice, the previous step used; its
    stderr, a file here (not a terminal), gets no progress-bar redraws without --no-progress."""
    workdir = drill.copy("damaged_eval")
    damage_latest(workdir)
    result = command("moejax.eval", ["--workdir", workdir, "--tasks", "--loss-batches", "1"])
    expect(result.code == 0, f"eval exit {result.code}\n{result.err[-3000:]}")
    expect("\r" not in result.err, f"eval drew progress bars into a file:\n{result.err[-1000:]!r}")
    expect("is damaged; using step 9, the newest that reads" in result.err,
           f"eval did not say which step it used:\n{result.err[-2000:]}")
    _one_notice(result.err, "eval")
    expect(os.path.isfile(os.path.join(workdir, "eval", "step_9.json")), "eval wrote no result for step 9")
    return first_line(result.err)


def damaged_checkpoint_generate(drill: Drill) -> str:
    """generate on a workdir whose latest checkpoint is damaged: one notice, the previous step used;
    a damaged --step is a clear error."""
    workdir = drill.copy("damaged_generate")
    latest = damage_latest(workdir)
    result = command("moejax.generate", ["--workdir", workdir, "--prompt", "def ", "--max-new-tokens", "4"])
    expect(result.code == 0, f"generate exit {result.code}\n{result.err[-3000:]}")
    expect("--- step 9" in result.out and "using step 9" in result.err,
           f"generate did not use and name step 9:\n{result.out}\n{result.err[-2000:]}")
    _one_notice(result.err, "generate")
    asked = command("moejax.generate", ["--workdir", workdir, "--prompt", "def ", "--step", "12"])
    expect(asked.code == 2 and f"checkpoint {latest} is damaged" in asked.err and "Choose another --step" in asked.err,
           f"generate --step 12 (damaged): exit {asked.code}\n{asked.err[-2000:]}")
    return first_line(result.err)


def damaged_checkpoint_resume(drill: Drill) -> str:
    """Training resumes past a damaged latest checkpoint with a notice of a few lines: which step,
    which file, where it was moved."""
    workdir = drill.copy("damaged_resume")
    latest = damage_latest(workdir)
    result = train(drill, workdir)
    expect(result.code == 0, f"resume exit {result.code}\n{result.err[-3000:]}")
    notice = [line for line in result.err.splitlines() if "unreadable" in line]
    expect(len(notice) == 1, f"no single unreadable notice:\n{result.err[-3000:]}")
    block = result.err[result.err.index(notice[0]):].splitlines()[:3]
    text = "\n".join(block)
    expect(f"checkpoint {latest} is unreadable" in text and "checkpoints_corrupt" in text
           and "falling back to the previous checkpoint" in text, f"the notice lacks the step or the move:\n{text}")
    expect("OUT_OF_RANGE" in text and "local file" in text and "TensorStore({" not in result.err,
           f"the notice does not name the damaged file in one line:\n{text}")
    return " / ".join(line.strip() for line in block)[:200]


def _prepared(drill: Drill, name: str) -> str:
    from moejax.data.prepare import prepare_dataset

    source = os.path.join(drill.root, f"{name}.jsonl")
    with open(source, "w") as f:
        for i in range(400):
            f.write(json.dumps({"text": f"document {i}: " + "some words " * (i % 11 + 30)}) + "\n")
    out = os.path.join(drill.root, name)
    prepare_dataset([f"prose={source}"], out, heldout_fraction=0.2, shard_mb=0.02, workers=1, progress=False)
    return out


def _damaged_shard(drill: Drill, name: str, damage: Callable[[str], None], expected: str) -> str:
    dataset = _prepared(drill, name)
    shard = os.path.join(dataset, "prose", "shard-00000.train.tokens.npy")
    damage(shard)
    workdir = os.path.join(drill.root, f"{name}_run")
    result = train(drill, workdir, f"--config.data.path={dataset}", '--config.data.schedule=[[0, {"prose": 1}]]')
    expect(result.code == 2, f"training on a damaged shard: exit {result.code}, expected 2\n{result.err[-3000:]}")
    expect(expected in result.err and shard in result.err, f"the error does not name {shard}:\n{result.err[-2000:]}")
    expect("compiled" not in result.out + result.err and "step=" not in result.out,
           "the run compiled or trained before refusing the data")
    expect(not os.path.exists(os.path.join(workdir, "checkpoints")), "the refused run left a checkpoints/ directory")
    return f"exit 2 in {result.seconds:.1f} s, before compiling: " + first_line(result.err.split("error:")[-1], 120)


def truncated_shard(drill: Drill) -> str:
    """A truncated token shard is refused before anything compiles, naming the file."""
    def cut(path: str) -> None:
        with open(path, "r+b") as f:
            f.truncate(os.path.getsize(path) - 100)

    return _damaged_shard(drill, "truncated", cut, "is cut short (truncated)")


def overwritten_shard(drill: Drill) -> str:
    """A token shard whose bytes were replaced (header intact) fails its recorded checksum before
    anything compiles, instead of training on garbage ids (every step non-finite)."""
    def scramble(path: str) -> None:
        size = os.path.getsize(path)
        with open(path, "r+b") as f:
            f.seek(size // 2)
            f.write(os.urandom(size - size // 2))

    return _damaged_shard(drill, "overwritten", scramble, "does not match the sha256 recorded in its manifest")


def generate_too_long(drill: Drill) -> str:
    """generate --max-new-tokens 100000000 --beyond-context is refused before allocating."""
    from moejax import generate as generate_cli

    result = call(generate_cli.main, ["--workdir", drill.reference(), "--prompt", "def ",
                                      "--max-new-tokens", "100000000", "--beyond-context"])
    expect(result.code == 2 and "GiB generation may use" in result.err and "Use --max-new-tokens" in result.err,
           f"exit {result.code}\n{result.err[-2000:]}")
    return f"exit 2 in {result.seconds:.1f} s: " + first_line(result.err.split("error:")[-1], 140)


def prepare_failure(drill: Drill) -> str:
    """A failed prepare leaves nothing behind; non-UTF-8 input is refused naming the byte and line."""
    from moejax.data import prepare

    bad = os.path.join(drill.root, "bad")
    os.makedirs(bad)
    with open(os.path.join(bad, "a.jsonl"), "w") as f:
        for i in range(300):
            f.write(json.dumps({"text": f"fine document {i} " * 20}) + "\n")
    with open(os.path.join(bad, "b.jsonl"), "w") as f:
        f.write("{not json\n")
    out = os.path.join(drill.root, "bad_out")
    result = call(prepare.main, ["--source", f"prose={bad}", "--out", out, "--workers", "1", "--shard-mb", "0.01"])
    expect(result.code == 2 and "is not valid JSON" in result.err, f"exit {result.code}\n{result.err[-2000:]}")
    expect(not os.path.exists(out), f"{out} was left behind: {os.listdir(out) if os.path.isdir(out) else ''}")
    latin = os.path.join(drill.root, "latin1.txt")
    with open(latin, "wb") as f:
        f.write("first line\ncaf\u00e9\n".encode("latin-1"))
    utf = call(prepare.main, ["--source", f"prose={latin}", "--out", out, "--workers", "1"])
    expect(utf.code == 2 and "byte 14 (line 2) is not valid UTF-8" in utf.err, f"exit {utf.code}\n{utf.err[-2000:]}")
    expect(not os.path.exists(out), f"{out} was left behind by the non-UTF-8 run")
    return "nothing left; " + first_line(utf.err.split("error:")[-1], 110)


def dead_lease(drill: Drill) -> str:
    """A sweep lease whose runner died on this host is taken over at once, not after the timeout."""
    from data_mixture.sweep import record

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    run_dir = os.path.join(drill.root, "sweep_run")
    killed = {**record.new_owner(), "pid": proc.pid}
    expect(record.try_acquire(run_dir, killed, timeout=300)[0], "could not set up the dead runner's lease")
    mine = record.new_owner()
    got, holder = record.try_acquire(run_dir, mine, timeout=300)
    expect(got, f"a fresh lease of dead pid {proc.pid} was not taken over: held by {holder}")
    return record.stale_reason(killed, 0.0, 300) or ""


def _mixture_fit(drill: Drill, sizes: tuple[float, ...], name: str) -> str:
    import numpy as np

    from data_mixture.__main__ import main as dm_main
    from data_mixture.synthetic import draw_design, synthetic_table
    from data_mixture.table import write_runs

    domains = ("prose", "math", "code")
    design = draw_design(mix_domains=domains, sizes=sizes, runs_per_size=12, seed=0)
    table = synthetic_table(lambda v, n, d, mix: 1.5 + 30 / n**0.3 + 50 / d**0.3 + 0.3 * np.exp(-2 * mix[:, v]),
                            design, domains, domains=domains)
    runs, fit = os.path.join(drill.root, f"{name}.csv"), os.path.join(drill.root, f"{name}_fit.json")
    write_runs(table, runs)
    result = call(dm_main, ["fit", "--runs", runs, "--law", "regmix_linear", "--out", fit, "--bootstrap", "0",
                            "--no-progress"])
    expect(result.code == 0, f"fit exit {result.code}\n{result.err[-2000:]}")
    return fit


def repeated_bounds(drill: Drill) -> str:
    """Every repetition of --min-weight/--max-weight counts."""
    from data_mixture.__main__ import main as dm_main

    fit = _mixture_fit(drill, (1e6, 3e6), "bounds")
    out = os.path.join(drill.root, "bounds_mix.json")
    result = call(dm_main, ["optimize", "--fit", fit, "--size", "3e6", "--tokens", "6e7", "--no-bootstrap", "--out", out,
                            "--min-weight", "prose=0.3", "--min-weight", "math=0.4"])
    expect(result.code == 0, f"optimize exit {result.code}\n{result.err[-2000:]}")
    with open(out) as f:
        weights = json.load(f)["weights"]
    expect(weights["prose"] >= 0.3 - 1e-9 and weights["math"] >= 0.4 - 1e-9, f"a bound was dropped: {weights}")
    return "weights " + ", ".join(f"{k}={v:.3f}" for k, v in weights.items()) + " (prose >= 0.3, math >= 0.4)"


def size_extrapolation(drill: Drill) -> str:
    """optimize --size 1e9 on a one-size fit warns that the size term is not identified, in one line
    of the command's own (not Python's warning format with a library source line)."""
    fit = _mixture_fit(drill, (3e6,), "one_size")
    result = command("data_mixture", ["optimize", "--fit", fit, "--size", "1e9", "--tokens", "2e10",
                                      "--no-bootstrap", "--out", os.path.join(drill.root, "one_size_mix.json")])
    expect(result.code == 0, f"optimize exit {result.code}\n{result.err[-2000:]}")
    found = [line for line in result.err.splitlines() if "size term is not identified" in line]
    expect(len(found) == 1 and found[0].startswith("python -m data_mixture optimize: warning: "),
           f"no one-line size warning:\n{result.err[-2000:]}")
    expect("Warning:" not in result.err and "warnings.warn" not in result.err,
           f"Python's warning format:\n{result.err[-2000:]}")
    return first_line(found[0], 150)


def kill_and_resume(drill: Drill, *, kills: int = 3, steps: int = 20, every: int = 3, sig: int = signal.SIGKILL,
                    seed: int = 0) -> str:
    """SIGKILL at random steps, rerun each time: the curve is bit-identical to an uninterrupted run."""
    from experiments.tools import drill_runs

    done, divergent = drill_runs.drill(kills, steps, every, sig, seed, os.path.join(drill.root, "kills"))
    expect(not divergent, f"{done} kills, divergent steps {divergent}")
    return f"{done} kills, 0 divergent steps"


def workdir_lock(drill: Drill) -> str:
    """A second training command into a running workdir is refused at once, naming the running
    process; after that process is killed, the next run takes the stale lock over."""
    workdir = os.path.join(drill.root, "locked")
    first = start_training(drill, workdir, "--config.train.steps=400")
    try:
        deadline = time.monotonic() + 300
        while not os.path.isfile(os.path.join(workdir, "metrics.jsonl")):
            expect(first.poll() is None and time.monotonic() < deadline, "the first run did not start training")
            time.sleep(0.2)
        second = train(drill, workdir, "--config.train.steps=400", timeout=90)
        expect(second.code != 0 and str(first.pid) in second.err,
               f"the second run: exit {second.code}; its message does not name pid {first.pid}:\n{second.err[-2000:]}")
        expect(second.seconds < 60, f"the second run took {second.seconds:.0f} s to refuse")
    finally:
        first.kill()
        first.communicate()
    third = train(drill, workdir, f"--config.train.steps={drill.steps}")
    expect(third.code == 0, f"the run after the kill: exit {third.code} (a stale lock must be taken over)\n"
                            f"{third.err[-2000:]}")
    return f"refused in {second.seconds:.1f} s: " + first_line(second.err.split("error:")[-1], 120)


def failed_save(drill: Drill) -> str:
    """A save that fails (an injected write error: files may not grow past a limit) stops the run
    with one paragraph naming the step and the last good checkpoint; earlier checkpoints stay intact."""
    workdir = drill.copy("failed_save")  # checkpoints 9 and 12 of a 12-step run
    before = listing(os.path.join(workdir, "checkpoints"))
    limit = 64 * 1024  # smaller than one checkpoint's array data, larger than a metrics line

    def small_files() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    # no compilation cache: its entries would hit the limit too, and its warnings are not the point
    result = train(drill, workdir, "--config.train.steps=15", preexec=small_files,
                   env={"JAX_ENABLE_COMPILATION_CACHE": "false"})
    expect(result.code != 0, f"the run went on after a failed save (exit 0)\n{result.err[-2000:]}")
    expect("Traceback" not in result.err and len(result.err.strip().splitlines()) <= 8,
           f"not one paragraph ({len(result.err.splitlines())} lines):\n{result.err[-3000:]}")
    expect("15" in result.err and "12" in result.err, f"the message names neither step 15 nor step 12:\n{result.err}")
    after = listing(os.path.join(workdir, "checkpoints"))
    expect(all(after.get(path) == size for path, size in before.items()), "an earlier checkpoint was changed")
    return first_line(result.err, 160)


def all_steps_skipped(drill: Drill) -> str:
    """A run whose every step is non-finite (and so skipped) stops with a clear error, not exit 0."""
    workdir = os.path.join(drill.root, "all_skipped")
    # a z-loss weight that is inf in float32: every step's total loss is inf, whatever the batch
    result = train(drill, workdir, "--config.model.moe.balancing=(('z_loss', {'weight': 1e300}),)",
                   "--config.train.steps=4")
    expect(result.code != 0, f"every step skipped, and exit 0:\n{result.out[-1000:]}")
    expect("Traceback" not in result.err and ("skipped" in result.err or "non-finite" in result.err),
           f"exit {result.code} without a clear message:\n{result.err[-2000:]}")
    return f"exit {result.code}: " + first_line(result.err.split("error:")[-1], 140)


CASES = (
    Case("export-onto-source", "export --hf-dir = the workdir, its parent or inside it, --force", export_onto_source),
    Case("workdir-lock", "the same training command twice into one workdir", workdir_lock, slow=True,
         needs="the workdir lock (training loop)"),
    Case("repeated-bounds", "optimize --min-weight a=.. --min-weight b=..", repeated_bounds),
    Case("overwritten-shard", "a token shard's bytes replaced (header intact), then train", overwritten_shard),
    Case("all-steps-skipped", "a run whose every step is non-finite", all_steps_skipped, slow=True,
         needs="the all-steps-skipped stop (training loop)"),
    Case("failed-save", "a checkpoint save that fails (write error)", failed_save, slow=True,
         needs="the failed-save stop (training loop)"),
    Case("damaged-checkpoint-eval", "eval on a damaged latest checkpoint", damaged_checkpoint_eval),
    Case("damaged-checkpoint-generate", "generate on a damaged latest checkpoint", damaged_checkpoint_generate),
    Case("generate-too-long", "generate --max-new-tokens 100000000 --beyond-context", generate_too_long),
    Case("damaged-checkpoint-resume", "training resumes past a damaged latest checkpoint", damaged_checkpoint_resume,
         slow=True),
    Case("dead-lease", "a sweep restarted right after its runner was SIGKILLed", dead_lease),
    Case("size-extrapolation", "optimize --size 1e9 on a one-size fit", size_extrapolation),
    Case("prepare-failure", "prepare fails (bad JSONL line; non-UTF-8 text)", prepare_failure),
    Case("truncated-shard", "a truncated token shard, then train", truncated_shard),
    Case("kill-and-resume", "SIGKILL at random steps, rerun each time", kill_and_resume, slow=True),
)
