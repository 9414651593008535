"""Checkpointing and fault tolerance: retention, resharding, kills, preemption, corruption, NaNs,
mismatches and warm starts."""

import glob
import os
import shutil
import signal

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.tools import fault_drill
from moejax import sharding
from moejax.train.checkpoint import Checkpointer, CheckpointMismatch
from moejax.train.loop import Diverged, train
from moejax.train.state import init_state, setup, to_global
from moejax.train.step import make_train_step
from tests.test_sharding import batches, tiny_cfg
from tests.test_train import copy_run, read_metrics, small_run, small_run_cfg  # noqa: F401 (small_run: shared fixture)


@pytest.fixture(scope="module")
def cache_dir(corpus_cache):
    """The run's shared corpus cache (tests/conftest.py)."""
    return corpus_cache


def test_retention_keeps_last_n_and_every_mth(tmp_path):
    ckpt = Checkpointer(str(tmp_path / "c"), max_to_keep=1, keep_period=2)
    state = {"w": jnp.ones(3)}
    for step in range(1, 6):
        ckpt.save(step, state, {}, {})
        ckpt.wait()
    assert ckpt.steps() == [2, 4, 5]
    ckpt.close()


def test_restore_onto_another_mesh(tmp_path):
    cfg = tiny_cfg()
    mesh8 = sharding.make_mesh({"data": 2, "fsdp": 2, "expert": 2, "tensor": 1}, jax.devices())
    run8 = setup(cfg, mesh8)
    state = init_state(cfg, run8)
    with jax.set_mesh(mesh8):
        state, _ = make_train_step(cfg, run8)(state, to_global(batches(cfg, 1)[0], run8.batch_sharding(True), 1))
    saved = jax.device_get(state)
    ckpt = Checkpointer(str(tmp_path / "c"), max_to_keep=2)
    ckpt.save(1, state, {"iterator": {}}, {"tokenizer": "byte"})
    ckpt.close()

    mesh4 = sharding.make_mesh({"data": 1, "fsdp": 2, "expert": 1, "tensor": 2}, jax.devices()[:4])
    run4 = setup(cfg, mesh4)
    restored = Checkpointer(str(tmp_path / "c"), max_to_keep=2).restore_latest(run4.abstract_state)
    w = restored.state["params"]["layers"][1]["mlp"]["w_gate_edf"]
    assert w.sharding.spec == jax.sharding.PartitionSpec(None, "expert", "fsdp", "tensor")
    assert len(w.sharding.device_set) == 4
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(restored.state), saved)


# The kill/resume tests below share one uninterrupted reference run (in its own process, like
# theirs) of one drill config: same steps, hence the same compiled train step (a cache hit in every
# later process, tests/conftest.py). The checkpoint interval is host-side and does not change it.
DRILL_STEPS = 12


def drill_config(directory, cache_dir, every=3) -> str:
    return fault_drill.write_config(str(directory), steps=DRILL_STEPS, every=every, cache_dir=cache_dir)


@pytest.fixture(scope="module")
def drill_reference(run_once, cache_dir):
    """Uninterrupted drill run: checkpoints at 3, 6, 9, 12, the last two kept (max_to_keep=2)."""
    def build(root):
        os.makedirs(root)
        fault_drill.run_to_end(drill_config(root, cache_dir), os.path.join(root, "run"))

    return os.path.join(run_once("drill_reference", build), "run")


def test_sigkill_resumes_bit_for_bit(tmp_path, cache_dir, drill_reference):
    config, workdir = drill_config(tmp_path, cache_dir), str(tmp_path / "run")
    code = fault_drill.run_and_kill(config, workdir, at_step=5, sig=signal.SIGKILL)
    assert code == -signal.SIGKILL
    assert max(fault_drill.logged_steps(workdir)) >= 5  # killed mid-run (checkpoint interval 3)
    fault_drill.run_to_end(config, workdir)  # resumes from the newest readable checkpoint
    divergent = fault_drill.divergent_steps(fault_drill.logged_steps(drill_reference), fault_drill.logged_steps(workdir))
    assert divergent == []


@pytest.mark.slow
def test_sigkill_at_several_steps_resumes_bit_for_bit(tmp_path):
    done, divergent = fault_drill.drill(kills=4, steps=20, every=3, sig=signal.SIGKILL, seed=2, root=str(tmp_path))
    assert done >= 3 and divergent == []


def test_sigterm_saves_at_the_current_step_and_resumes(tmp_path, cache_dir, drill_reference):
    config = drill_config(tmp_path, cache_dir, every=100)
    workdir = str(tmp_path / "run")
    code = fault_drill.run_and_kill(config, workdir, at_step=4, sig=signal.SIGTERM)
    assert code == 128 + signal.SIGTERM
    saved = sorted(int(s) for s in os.listdir(os.path.join(workdir, "checkpoints")) if s.isdigit())
    assert len(saved) == 1 and 4 <= saved[0] < DRILL_STEPS  # saved on the signal, not on the (100-step) interval
    fault_drill.run_to_end(config, workdir)
    reference = fault_drill.logged_steps(drill_reference)
    assert fault_drill.divergent_steps(reference, fault_drill.logged_steps(workdir)) == []


@pytest.mark.parametrize("damage", ["truncate", "missing_item"])
def test_corrupt_latest_checkpoint_is_set_aside_and_previous_used(tmp_path, cache_dir, drill_reference, damage):
    # Separate processes, as after a real crash (tensorstore caches what a process wrote itself).
    config = drill_config(tmp_path, cache_dir)
    workdir = str(tmp_path / "run")
    shutil.copytree(drill_reference, workdir)  # checkpoints 9 and 12
    latest = os.path.join(workdir, "checkpoints", "12")
    if damage == "truncate":
        for path in glob.glob(os.path.join(latest, "state", "**", "d", "*"), recursive=True):  # array data
            with open(path, "r+b") as f:
                f.truncate(os.path.getsize(path) // 2)
    else:
        os.rename(os.path.join(latest, "data"), os.path.join(latest, "data_gone"))
    reference = fault_drill.logged_steps(workdir)
    err = fault_drill.run_to_end(config, workdir)
    assert "checkpoints/12 is unreadable" in err and "falling back to the previous checkpoint" in err
    kept = glob.glob(os.path.join(workdir, "checkpoints_corrupt", "12-*"))
    assert len(kept) == 1 and os.listdir(kept[0])  # moved aside, not deleted
    assert sorted(os.listdir(os.path.join(workdir, "checkpoints")), key=int) == ["9", "12"]  # 12 saved anew
    assert fault_drill.divergent_steps(reference, fault_drill.logged_steps(workdir)) == []


def test_non_finite_step_is_skipped_and_leaves_state_unchanged():
    cfg = tiny_cfg()
    mesh = sharding.make_mesh({"data": 1, "fsdp": 1, "expert": 1, "tensor": 1}, jax.devices()[:1])
    run = setup(cfg, mesh)
    state = init_state(cfg, run)
    before = jax.device_get(state)
    batch = batches(cfg, 1)[0]
    batch["loss_mask"] = batch["loss_mask"].copy()
    batch["loss_mask"][0, 0] = np.nan
    with jax.set_mesh(mesh):
        after, metrics = make_train_step(cfg, run)(state, to_global(batch, run.batch_sharding(True), 1))
    assert bool(metrics["skipped"])
    assert int(after["step"]) == 1
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(after["params"]), before["params"])
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(after["opt_state"]), before["opt_state"])


def test_consecutive_bad_steps_stop_the_run_keeping_a_good_checkpoint(tmp_path, cache_dir):
    cfg = small_run_cfg(cache_dir)
    cfg.train.steps, cfg.train.max_bad_steps, cfg.checkpoint.every_steps = 12, 3, 1
    cfg.optim.lr, cfg.optim.warmup_steps, cfg.optim.clip_norm = 1e30, 0, 0.0  # blows up after one step
    workdir = str(tmp_path / "run")
    with pytest.raises(Diverged, match=r"3 consecutive steps .* non-finite .* newest checkpoint \(step (\d+)\)"):
        train(cfg, workdir)
    records = [r for r in read_metrics(workdir) if "skipped_steps" in r]
    saved = sorted(int(s) for s in os.listdir(os.path.join(workdir, "checkpoints")))
    # Checkpoints stop at the last good step; every later step was skipped.
    assert saved and all(s < records[-1]["step"] for s in saved)
    assert records[-1]["skipped_steps"] == 3


def test_incompatible_config_names_the_mismatched_parameters(tmp_path, cache_dir, small_run):
    cfg = small_run_cfg(cache_dir)
    workdir = copy_run(small_run, tmp_path / "run")  # checkpoints at 3 and 6
    cfg.model.mlp_dim = 48
    with pytest.raises(CheckpointMismatch, match=r"layers/0/mlp/w_gate_df: checkpoint \(1, 32, 64\) vs model \(1, 32, 48\)"):
        train(cfg, workdir)
    assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["3", "6"]  # nothing moved or deleted


def test_init_from_takes_parameters_only(tmp_path, cache_dir, small_run):
    cfg = small_run_cfg(cache_dir)  # the shared run's config: its compiled step is reused
    source_eval_loss = [r for r in read_metrics(small_run) if "eval_loss" in r][-1]["eval_loss"]

    cfg.checkpoint.init_from = small_run
    cfg.data.mixture = {"code": 1.0, "prose": 0.0, "math": 0.0, "knowledge": 0.0}
    warm = train(cfg, str(tmp_path / "warm"))
    assert warm["start_step"] == 0
    assert warm["initial_eval_loss"] == pytest.approx(source_eval_loss, rel=1e-6)  # same params
    records = read_metrics(str(tmp_path / "warm"))
    assert records[-1]["tokens/prose"] == 0  # the new mixture, from a fresh data stream
