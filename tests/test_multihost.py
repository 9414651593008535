"""Multi-host on one machine: 2 processes x 4 fake CPU devices joined by ``jax.distributed`` (gloo
collectives) load only their rows, train exactly like 1 process with 8 devices, and resume.

Children start as on a cluster: the same command with JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES
and JAX_PROCESS_ID, or through MOEJAX_LOCAL_PROCESSES=2, which sets those itself. The config has
grad_accum_steps=2 on a (data=2, fsdp=2, expert=2) mesh, so each process holds a strided set of
rows (the same columns of both micro-batches), the case that a contiguous slice would get wrong.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from experiments.tools.fault_drill import child_xla_flags
from moejax.data.dataset import open_dataset
from moejax.errors import DataError
from moejax.data.from_config import make_data
from moejax.data.pipeline import make_eval_batches, make_train_iterator
from moejax.train.loop import train
from tests.test_train import read_metrics

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT_S = 300
# Observed: bit-equal except the cross-process reduction of a loss, which may differ in the last
# float32 bit (about 1e-7 relative).
RTOL = 1e-6

CONFIG = '''
from moejax.config import default_config

def get_config():
    c = default_config()
    t, m = c.train, c.model
    t.steps, t.global_batch_size, t.seq_len, t.grad_accum_steps = 4, 16, 32, 2
    t.log_every, t.eval_every, t.eval_batches = 1, 1000, 1
    c.checkpoint.every_steps = 2
    c.optim.warmup_steps = 2
    m.d_model, m.num_layers, m.mlp_dim, m.first_k_dense = 32, 1, 64, 0
    m.num_heads, m.num_kv_heads, m.head_dim = 4, 2, 8
    m.moe.num_experts, m.moe.expert_dim, m.moe.shared_expert_dim, m.moe.tile_size = 4, 16, 16, 8
    c.mesh.data, c.mesh.fsdp, c.mesh.expert, c.mesh.tensor = 2, 2, 2, 1
    c.data.cache_dir = {cache_dir!r}
    return c
'''

# One process of the batch-layout check: this process's rows, its local batch size, the global
# arrays it builds (gathered back to numpy), and the cross-process agreement helpers.
LAYOUT_CHILD = '''
import sys
import numpy as np
from moejax.main import maybe_initialize_distributed
maybe_initialize_distributed()
import jax
from jax.experimental import multihost_utils
from moejax import checks, config as config_lib, sharding
from moejax.errors import ConfigError
from moejax.data.from_config import make_data
from moejax.train.checkpoint import any_process, check_same_on_every_process
from moejax.train.state import process_rows, setup, to_global

namespace = {}
exec(open(sys.argv[1]).read(), namespace)
cfg, out_dir = namespace["get_config"](), sys.argv[2]
t = cfg.train
run = setup(cfg, sharding.make_mesh(checks.validate(cfg, jax.device_count())))
train_sharding, eval_sharding = run.batch_sharding(True), run.batch_sharding(False)
rows = {"train_rows": process_rows(train_sharding, t.global_batch_size, t.grad_accum_steps),
        "eval_rows": process_rows(eval_sharding, t.global_batch_size, None)}
data = make_data(cfg, **rows)
out = dict(rows)
for i in range(2):
    local = next(data.train_iter)
    out[f"train{i}_local_rows"] = len(local["inputs"])
    out[f"train{i}_domains"] = data.train_iter.global_domains
    for key, value in to_global(local, train_sharding, t.grad_accum_steps, t.global_batch_size).items():
        out[f"train{i}/{key}"] = multihost_utils.process_allgather(value, tiled=True)
local = data.eval_batches["code"][0]
out["eval_local_rows"] = len(local["inputs"])
for key, value in to_global(local, eval_sharding, None, t.global_batch_size).items():
    out[f"eval/{key}"] = multihost_utils.process_allgather(value, tiled=True)
check_same_on_every_process({"config": config_lib.to_dict(cfg), "data": data.train_iter.get_state()})
try:
    check_same_on_every_process({"config": config_lib.to_dict(cfg), "rows": rows["train_rows"].tolist()})
    out["disagreement"] = ""
except ConfigError as e:
    out["disagreement"] = str(e)
out["any_process"] = any_process(jax.process_index() == 1)
np.savez(f"{out_dir}/process_{jax.process_index()}.npz", **out)
'''


def load_config(path: str):
    namespace = {}
    with open(path) as f:
        exec(compile(f.read(), path, "exec"), namespace)
    return namespace["get_config"]()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def child_env(compile_cache: str) -> dict[str, str]:
    """The environment of a process of the job: 4 fake CPU devices, no inherited JAX settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "MOEJAX_", "XLA_"))}
    # The compile settings of the test session itself (tests/conftest.py): faster compiles, same numbers.
    env.update(JAX_PLATFORMS="cpu", XLA_FLAGS=child_xla_flags(4),
               PYTHONPATH=REPO, JAX_COMPILATION_CACHE_DIR=compile_cache)
    return env


def run_processes(commands: list[list[str]], envs: list[dict[str, str]]) -> list[str]:
    """Runs the commands at once, each in its own process group; their stdout if all succeed.

    On a timeout or a failure every group is killed and the test fails with each one's stderr.
    """
    procs = [
        subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, start_new_session=True)
        for cmd, env in zip(commands, envs)
    ]
    results, timed_out = [], False
    for proc in procs:
        try:
            results.append(proc.communicate(timeout=TIMEOUT_S))
        except subprocess.TimeoutExpired:
            timed_out = True
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
            results.append(proc.communicate())
    if timed_out or any(p.returncode for p in procs):
        report = "\n".join(
            f"--- process {i}: exit code {p.returncode}\n{err[-6000:]}" for i, (p, (_, err)) in enumerate(zip(procs, results))
        )
        pytest.fail(f"{'timed out after ' + str(TIMEOUT_S) + ' s' if timed_out else 'a process failed'}:\n{report}")
    return [out for out, _ in results]


def launch_two_processes(config: str, workdir: str, compile_cache: str) -> str:
    """``MOEJAX_LOCAL_PROCESSES=2 python -m moejax.main ...``: the documented local launcher."""
    env = child_env(compile_cache) | {"MOEJAX_LOCAL_PROCESSES": "2"}
    (out,) = run_processes([[sys.executable, "-m", "moejax.main", "--config", config, "--workdir", workdir]], [env])
    return out


@pytest.fixture(scope="module")
def setup_dir(tmp_path_factory, corpus_cache):
    """Config file (on the run's corpus cache) and compilation cache shared by the tests of this module."""
    root = tmp_path_factory.mktemp("multihost")
    config = root / "config.py"
    config.write_text(CONFIG.format(cache_dir=corpus_cache))
    return root


@pytest.fixture(scope="module")
def corpus(corpus_cache):
    """The built-in corpus, tokenised once per run (tests/conftest.py) before any process needs it."""
    open_dataset("", corpus_cache)
    return corpus_cache


@pytest.fixture(scope="module")
def reference(setup_dir, corpus):
    """One process with the 8 devices of the test session: the metrics to match."""
    workdir = str(setup_dir / "one_process")
    train(load_config(str(setup_dir / "config.py")), workdir)
    return {r["step"]: r for r in read_metrics(workdir)}


@pytest.fixture(scope="module")
def two_process_run(setup_dir, corpus):
    workdir = str(setup_dir / "two_processes")
    out = launch_two_processes(str(setup_dir / "config.py"), workdir, str(setup_dir / "compile_cache"))
    return workdir, out


def assert_same_curve(records: dict[int, dict], expected: dict[int, dict], steps) -> None:
    for step in steps:
        got, want = records[step], expected[step]
        for key in ("loss", "total_loss", "grad_norm", "eval_loss"):
            if key in want:
                np.testing.assert_allclose(got[key], want[key], rtol=RTOL, err_msg=f"{key} at step {step}")
        tokens = {k: v for k, v in want.items() if k.startswith("tokens/")}
        assert {k: got[k] for k in tokens} == tokens, f"tokens per domain at step {step}"


def test_rows_pack_only_the_named_rows_and_keep_the_iterator_state(corpus):
    kwargs = dict(seq_len=32, global_batch_size=8, seed=3, cache_dir=corpus)
    mixture = {"code": 0.5, "math": 0.5}
    whole, strided = make_train_iterator(mixture, **kwargs), make_train_iterator(mixture, rows=[1, 4, 5], **kwargs)
    for _ in range(2):
        full, part = next(whole), next(strided)
        np.testing.assert_array_equal(part["inputs"], full["inputs"][[1, 4, 5]])
        np.testing.assert_array_equal(strided.global_domains, full["domain"])
    assert strided.get_state() == whole.get_state()  # one process's state serves every process
    (eval_full,), (eval_part,) = (
        make_eval_batches(["prose"], seq_len=32, batch_size=8, batches_per_domain=1, cache_dir=corpus, rows=rows)["prose"]
        for rows in (None, [6, 7])
    )
    np.testing.assert_array_equal(eval_part["targets"], eval_full["targets"][6:])
    for bad in ([3, 1], [0, 8], []):
        with pytest.raises(DataError, match=r"rows must be increasing row indices in \[0, 8\) \(the batch size\)"):
            make_train_iterator(mixture, rows=bad, **kwargs)


def test_each_process_loads_only_its_rows_of_the_same_global_batches(setup_dir, corpus):
    config = str(setup_dir / "config.py")
    out_dir = setup_dir / "layout"
    out_dir.mkdir()
    port = free_port()
    envs = [
        child_env(str(setup_dir / "compile_cache"))
        | {"JAX_COORDINATOR_ADDRESS": f"localhost:{port}", "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": str(i)}
        for i in range(2)
    ]
    run_processes([[sys.executable, "-c", LAYOUT_CHILD, config, str(out_dir)]] * 2, envs)
    got = [dict(np.load(out_dir / f"process_{i}.npz")) for i in range(2)]

    # Process i holds the same 4 columns of both micro-batches of 8 rows, and one half of an eval batch.
    np.testing.assert_array_equal(got[0]["train_rows"], [0, 1, 2, 3, 8, 9, 10, 11])
    np.testing.assert_array_equal(got[1]["train_rows"], [4, 5, 6, 7, 12, 13, 14, 15])
    np.testing.assert_array_equal(got[0]["eval_rows"], np.arange(8))
    np.testing.assert_array_equal(got[1]["eval_rows"], np.arange(8, 16))
    for g in got:
        assert g["train0_local_rows"] == g["train1_local_rows"] == g["eval_local_rows"] == 8  # half each

    # The global arrays are exactly one process's batches, micro-batch a = rows [8a, 8a + 8).
    one = make_data(load_config(config))
    for i in range(2):
        batch = next(one.train_iter)
        for key, value in batch.items():
            if key == "domain":
                for g in got:
                    np.testing.assert_array_equal(g[f"train{i}_domains"], value)
                continue
            for g in got:
                np.testing.assert_array_equal(g[f"train{i}/{key}"], value.reshape(2, 8, *value.shape[1:]))
    for key, value in one.eval_batches["code"][0].items():
        if key != "domain":
            for g in got:
                np.testing.assert_array_equal(g[f"eval/{key}"], value)

    # Same config and data state everywhere passes; a per-process value is named.
    for g in got:
        assert str(g["disagreement"]).startswith("the processes of this run disagree on: rows (processes [1] vs process 0)")
        assert bool(g["any_process"])


def test_two_processes_train_like_one_process(two_process_run, reference):
    workdir, out = two_process_run
    records = read_metrics(workdir)
    assert [r["step"] for r in records] == [0, 1, 2, 3, 4]  # written once: by process 0 only
    assert_same_curve({r["step"]: r for r in records}, reference, steps=range(5))
    assert out.count("done: step 4") == 1
    assert len([f for f in os.listdir(workdir) if f.startswith("events.out.tfevents")]) == 1
    with open(os.path.join(workdir, "config.json")) as f:
        assert json.load(f)["train"]["grad_accum_steps"] == 2
    assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["2", "4"]
    state_files = os.listdir(os.path.join(workdir, "checkpoints", "4", "state"))
    assert {"ocdbt.process_0", "ocdbt.process_1"} <= set(state_files)  # each process wrote its shards


def test_two_processes_resume_from_their_checkpoint(two_process_run, reference, setup_dir):
    workdir = str(setup_dir / "two_processes_resumed")
    shutil.copytree(two_process_run[0], workdir)
    shutil.rmtree(os.path.join(workdir, "checkpoints", "4"))  # as if killed after the step-2 checkpoint
    out = launch_two_processes(str(setup_dir / "config.py"), workdir, str(setup_dir / "compile_cache"))
    assert "resuming from step 2" in out
    records = read_metrics(workdir)
    assert [r["step"] for r in records] == [0, 1, 2, 3, 4]  # one clean curve
    uninterrupted = {r["step"]: r for r in read_metrics(two_process_run[0])}
    resumed = {r["step"]: r for r in records}
    for step in (3, 4):
        assert resumed[step]["loss"] == uninterrupted[step]["loss"]  # bit for bit
    assert_same_curve(resumed, reference, steps=(3, 4))


@pytest.mark.slow
def test_sigterm_to_one_process_stops_both_at_the_same_checkpoint(setup_dir, corpus):
    workdir = str(setup_dir / "preempted")
    port = free_port()
    command = [sys.executable, "-m", "moejax.main", "--config", str(setup_dir / "config.py"), "--workdir", workdir,
               "--config.train.steps=40", "--config.checkpoint.every_steps=1000"]
    envs = [
        child_env(str(setup_dir / "compile_cache"))
        | {"JAX_COORDINATOR_ADDRESS": f"localhost:{port}", "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": str(i)}
        for i in range(2)
    ]
    procs = [subprocess.Popen(command, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True, start_new_session=True) for env in envs]
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while not any(r.get("step", 0) >= 2 for r in _records_so_far(workdir)):
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs), "no step 2 in time"
            time.sleep(0.5)
        procs[1].send_signal(signal.SIGTERM)  # the signal reaches one host only
        errors = [p.communicate(timeout=TIMEOUT_S)[1] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    assert [p.returncode for p in procs] == [128 + signal.SIGTERM] * 2, "\n".join(e[-3000:] for e in errors)
    saved = os.listdir(os.path.join(workdir, "checkpoints"))
    assert len(saved) == 1 and 2 <= int(saved[0]) < 40  # one checkpoint, at the step both stopped


def _records_so_far(workdir: str) -> list[dict]:
    try:
        with open(os.path.join(workdir, "metrics.jsonl")) as f:
            return [json.loads(line) for line in f if line.endswith("\n")]
    except FileNotFoundError:
        return []
