"""launch.sh runs every process with mimalloc (moejax/allocator.py): XLA:CPU's per-step temporaries
are reused instead of being page-faulted in again at every step; a bad MOEJAX_ALLOCATOR is refused."""
import os
import subprocess
import sys

import pytest

from moejax import allocator

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A jitted function whose one temporary is 128 MB (32,768 pages of 4 KiB); prints the minor page
# faults per call after the first (compiling) call.
FAULTS_PER_CALL = """
import resource, jax, jax.numpy as jnp
a, b = jnp.ones((4096,)), jnp.ones((8192,))
f = jax.jit(lambda a, b: jnp.sum(jnp.sin(a[:, None] * b[None, :]) @ jnp.ones((8192, 8))))
f(a, b).block_until_ready()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(4):
    f(a, b).block_until_ready()
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 4)
"""


def launch_python(*args, allocator_choice: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "MOEJAX_ALLOCATOR", "MIMALLOC_PURGE_DELAY")}
    env.setdefault("MOEJAX_PYTHON", sys.executable)  # this environment, not a .venv launch.sh would make
    if allocator_choice is not None:
        env["MOEJAX_ALLOCATOR"] = allocator_choice
    return subprocess.run(["./launch.sh", "python", *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="cmeel-mimalloc is installed on Linux only")
def test_launch_preloads_mimalloc_and_the_step_temporaries_stop_faulting():
    lib = allocator.mimalloc_path()
    assert lib is not None and os.path.isfile(lib), "the base install (pyproject.toml) has cmeel-mimalloc"
    proc = launch_python("-c", "import os; from moejax import allocator; "
                         "print(allocator.active(), os.environ['LD_PRELOAD'], os.environ['MIMALLOC_PURGE_DELAY'])")
    assert proc.returncode == 0, proc.stderr
    active, preload, purge_delay = proc.stdout.split()
    assert active == "mimalloc" and preload.split(":")[0] == lib
    assert purge_delay == "-1"  # freed memory stays mapped between the loop's steps
    proc = launch_python("-c", FAULTS_PER_CALL)
    assert proc.returncode == 0, proc.stderr
    # glibc maps and unmaps the 128 MB buffer at every call: ~32,800 faults per call; mimalloc reuses it.
    assert float(proc.stdout.split()[-1]) < 3_000


def test_system_allocator_on_request_and_bad_choice_refused():
    proc = launch_python("-c", "import os; from moejax import allocator; print(allocator.active(), "
                         "os.environ.get('LD_PRELOAD', 'none'))", allocator_choice="system")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["system", "none"]
    proc = launch_python("-c", "print(1)", allocator_choice="jemalloc")
    assert proc.returncode == 2
    assert "MOEJAX_ALLOCATOR must be one of ('mimalloc', 'system'), got 'jemalloc'" in proc.stderr
    with pytest.raises(ValueError, match="got 'tcmalloc'"):
        allocator.preload("tcmalloc")
    assert allocator.preload("system") is None


def test_python_m_moejax_main_preloads_mimalloc_itself(tmp_path):
    """``python -m moejax.main`` (as the docs write it, without launch.sh) re-executes itself once
    with mimalloc, so it trains as fast as launch.sh and says nothing about a slower allocator;
    MOEJAX_ALLOCATOR=system keeps glibc's malloc."""
    experiment = tmp_path / "show_preload.py"
    experiment.write_text("import os, sys\nfrom moejax.config import default_config\n\n\ndef get_config():\n"
                          "    print('PRELOAD=' + os.environ.get('LD_PRELOAD', ''), file=sys.stderr)\n"
                          "    return default_config()\n")
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "MOEJAX_ALLOCATOR", "MOEJAX_CLI_PRELOADED")}
    command = [sys.executable, "-m", "moejax.main", "--config", str(experiment), "--workdir", str(tmp_path / "w"),
               "--config.train.steps=0"]  # refused before anything is built
    proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "train.steps" in proc.stderr
    assert "PRELOAD=" + allocator.mimalloc_path() in proc.stderr
    proc = subprocess.run(command, cwd=REPO, env={**env, "MOEJAX_ALLOCATOR": "system"}, capture_output=True,
                          text=True, timeout=300)
    assert "PRELOAD=\n" in proc.stderr
