"""`./launch.sh gpu-check --smoke` runs every part of the GPU check on CPU at tiny sizes, end to end."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from moejax.model.grouped_matmul import tokamax_installed

ROOT = Path(__file__).resolve().parent.parent


def _env() -> dict:
    """This test's Python as the environment, one CPU device as a user's shell has."""
    flags = re.sub(r"--xla_force_host_platform_device_count=\d+", "", os.environ.get("XLA_FLAGS", ""))
    return {**os.environ, "MOEJAX_PYTHON": sys.executable, "XLA_FLAGS": flags, "MOEJAX_CHECK_PINS": "0"}


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_check") / "gpu_check.json"
    proc = subprocess.run([str(ROOT / "launch.sh"), "gpu-check", "--smoke", "--out", str(out)], env=_env(),
                          capture_output=True, text=True, timeout=1800)
    return proc, out


@pytest.mark.slow  # every part of the GPU check compiled on CPU (45 s of the default suite's budget); -m slow runs it
def test_smoke_runs_every_part_into_one_json_and_a_table(smoke):
    proc, out = smoke
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["smoke"] and set(report["parts"]) == {"gpu_mfu", "llep", "peer_step"}
    assert all(p["returncode"] == 0 for p in report["parts"].values())
    mfu = report["parts"]["gpu_mfu"]["result"]["rows"]
    want = {"dense", "8e ragged"} | ({"8e tokamax"} if tokamax_installed() else set())
    assert set(mfu) == want and all(r["tokens_per_sec"] > 0 and 0 < r["mfu"] for r in mfu.values())
    assert mfu["8e ragged"]["params_total"] > mfu["dense"]["params_total"]  # 8 experts hold more than their active width
    assert report["parts"]["llep"]["result"]["targets"]
    assert {r["candidate"] for r in report["parts"]["peer_step"]["result"]["rows"]} == {"dropless", "capacity", "dense"}
    assert report["host"]["cpu_model"] and "isa" in report["host"]
    table = proc.stdout[proc.stdout.index("gpu_check on cpu"):]
    assert "8e ragged" in table and "x dense" in table and "llep" in table


def test_without_a_gpu_the_gpu_run_stops_naming_what_jax_sees(tmp_path):
    proc = subprocess.run([str(ROOT / "launch.sh"), "gpu-check", "--out", str(tmp_path / "x.json")], env=_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "JAX sees no GPU in this environment (cpu" in proc.stderr and "--smoke" in proc.stderr
