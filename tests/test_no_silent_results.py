"""Smaller cases of "no silent result": a second SIGTERM while the first one's checkpoint is saved,
orbax's notes about a checkpoint without metadata, a relative script path given to launch.sh."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import textwrap

from tests.test_train import small_run  # noqa: F401 (shared fixture)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_a_second_sigterm_does_not_cut_the_first_ones_save_short():
    """Two SIGTERMs 0.3 s apart (a scheduler that repeats itself): the first one's save goes on, and
    the second is answered with one line saying so; a third after the save is ignored (the process
    exits with its own status); a second Ctrl-C still exits at once, saying so."""
    script = textwrap.dedent("""
        import os, signal, sys, time
        from moejax.train.preemption import PreemptionGuard
        sig = getattr(signal, sys.argv[1])
        with PreemptionGuard(grace_seconds=30) as guard:
            os.kill(os.getpid(), sig)
            time.sleep(0.3)
            os.kill(os.getpid(), sig)
            time.sleep(0.3)
            print("still saving", guard.signum, flush=True)
        os.kill(os.getpid(), sig)  # after the save, on the way out: ignored, the exit status stays ours
        time.sleep(0.3)
        print("exiting", flush=True)
    """)
    term = subprocess.run([sys.executable, "-c", script, "SIGTERM"], cwd=REPO, capture_output=True, text=True,
                          timeout=60)
    assert term.returncode == 0 and "still saving 15" in term.stdout and "exiting" in term.stdout, (term.returncode,
                                                                                                   term.stderr)
    assert "second SIGTERM" in term.stderr and "checkpoint" in term.stderr and len(term.stderr.splitlines()) == 1
    ctrl_c = subprocess.run([sys.executable, "-c", script, "SIGINT"], cwd=REPO, capture_output=True, text=True,
                            timeout=60)
    assert ctrl_c.returncode == 130 and "still saving" not in ctrl_c.stdout
    assert "second SIGINT" in ctrl_c.stderr and "without" in ctrl_c.stderr, ctrl_c.stderr


def test_a_checkpoint_without_its_metadata_file_gives_no_absl_notes(small_run, tmp_path, caplog):  # noqa: F811
    from moejax.train.checkpoint import Checkpointer

    workdir = shutil.copytree(small_run, tmp_path / "run")
    os.remove(os.path.join(workdir, "checkpoints", "6", "_CHECKPOINT_METADATA"))
    with caplog.at_level(logging.INFO):
        checkpointer = Checkpointer(os.path.join(workdir, "checkpoints"), max_to_keep=3)
        assert checkpointer.latest_step() == 6
    assert "Metadata file does not exist" not in caplog.text


def test_a_size_extrapolation_warning_is_one_line_without_a_source_line(tmp_path):
    from experiments.tools import fault_cases

    drill = fault_cases.Drill(root=str(tmp_path), cache_dir=str(tmp_path / "cache"))
    fit = fault_cases._mixture_fit(drill, (3e6,), "one_size")
    proc = subprocess.run([sys.executable, "-m", "data_mixture", "optimize", "--fit", fit, "--size", "1e9",
                           "--tokens", "2e10", "--no-bootstrap", "--out", str(tmp_path / "mix.json")],
                          cwd=REPO, capture_output=True, text=True, timeout=300, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "size term is not identified" in line]
    assert len(lines) == 1 and lines[0].startswith("python -m data_mixture optimize: warning: "), proc.stderr
    assert "Warning:" not in proc.stderr and "warnings.warn" not in proc.stderr, proc.stderr


def test_launch_sh_python_runs_a_relative_script_from_the_user_s_directory(tmp_path):
    (tmp_path / "hello.py").write_text("import sys; print('ran', __file__, sys.argv[1:])\n")
    env = {**os.environ, "MOEJAX_PYTHON": sys.executable, "MOEJAX_ALLOCATOR": "system", "MOEJAX_CHECK_PINS": "0"}
    proc = subprocess.run([os.path.join(REPO, "launch.sh"), "python", "hello.py", "a.txt"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and f"ran {tmp_path / 'hello.py'} ['a.txt']" in proc.stdout, proc.stderr
    missing = subprocess.run([os.path.join(REPO, "launch.sh"), "python", "nowhere.py"], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=120)
    assert missing.returncode != 0 and str(tmp_path / "nowhere.py") in missing.stderr, missing.stderr
    # a script of the repository's, named as from its root, still runs from anywhere
    repo = subprocess.run([os.path.join(REPO, "launch.sh"), "python", "moejax/envcheck.py", "list", "--extras", ""],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert repo.returncode == 0 and "jax" in repo.stdout.split(), repo.stderr


def test_a_failed_saves_unretrieved_orbax_futures_are_hidden_and_others_are_not():
    """asyncio's 'exception was never retrieved' reports of orbax's write tasks repeat a failed save
    that moejax reports itself: hidden; the same report from other code stays."""
    from moejax.train.checkpoint import _orbax_futures_hidden

    def record_from(filename: str) -> logging.LogRecord:
        namespace: dict = {}
        exec(compile("def write():\n    raise ValueError('Failed writing')\n", filename, "exec"), namespace)
        try:
            namespace["write"]()
        except ValueError:
            exc_info = sys.exc_info()
        return logging.LogRecord("asyncio", logging.ERROR, __file__, 1, "_GatheringFuture exception was never "
                                 "retrieved\nfuture: <_GatheringFuture finished exception=ValueError()>", None, exc_info)

    assert not _orbax_futures_hidden(record_from("/site-packages/orbax/checkpoint/_src/serialization/fake.py"))
    assert _orbax_futures_hidden(record_from("/home/user/my_pipeline.py"))
