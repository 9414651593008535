"""End to end: the loop trains, writes metrics/TensorBoard/checkpoints, and resumes exactly."""

import glob
import json
import os
import shutil

import pytest

from moejax.config import default_config
from moejax.train.loop import train


@pytest.fixture(scope="module")
def cache_dir(corpus_cache):
    """The run's shared corpus cache (tests/conftest.py)."""
    return corpus_cache


def small_run_cfg(cache_dir):
    cfg = default_config()
    t, m = cfg.train, cfg.model
    t.steps, t.global_batch_size, t.seq_len = 6, 8, 64
    t.log_every, t.eval_every, t.eval_batches = 1, 3, 1
    cfg.checkpoint.every_steps = 3
    cfg.optim.warmup_steps = 2
    m.d_model, m.num_layers, m.mlp_dim, m.first_k_dense = 32, 2, 64, 1
    m.num_heads, m.num_kv_heads, m.head_dim = 4, 2, 8
    m.moe.num_experts, m.moe.expert_dim, m.moe.shared_expert_dim, m.moe.tile_size = 4, 16, 16, 8
    cfg.mesh.data, cfg.mesh.fsdp = 4, 2
    cfg.data.cache_dir = cache_dir
    return cfg


def read_metrics(workdir):
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def train_small_run(workdir: str) -> None:
    """``small_run_cfg`` as it is (6 steps, checkpoints at 3 and 6), on the run's corpus cache."""
    train(small_run_cfg(os.environ["MOEJAX_CACHE"]), workdir)


@pytest.fixture(scope="module")
def small_run(run_once):
    """One finished ``small_run_cfg`` run per pytest run, shared (read-only) with test_checkpoint.py."""
    return run_once("small_run", train_small_run)


def copy_run(source: str, workdir) -> str:
    workdir = str(workdir)
    shutil.copytree(source, workdir)
    return workdir


def test_run_writes_outputs_and_resumes_exactly(tmp_path, cache_dir, small_run):
    cfg = small_run_cfg(cache_dir)
    workdir = copy_run(small_run, tmp_path / "run")

    records = read_metrics(workdir)
    train_records = [r for r in records if "loss" in r]
    assert [r["step"] for r in train_records] == [1, 2, 3, 4, 5, 6]
    for key in ("step", "loss", "lr", "grad_norm", "tokens_per_sec", "step_time_s", "flops_per_token",
                "mfu", "expert_load", "drop_rate", "max_vio"):
        assert key in train_records[-1], key
    assert train_records[-1]["mfu"] == "n/a"
    assert len(train_records[-1]["expert_load"]) == 1 and len(train_records[-1]["expert_load"][0]) == 4
    evals = {r["step"]: r["eval_loss"] for r in records if "eval_loss" in r}
    assert sorted(evals) == [0, 3, 6]
    assert evals[6] < evals[0]
    assert glob.glob(os.path.join(workdir, "events.out.tfevents.*"))
    assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["3", "6"]
    with open(os.path.join(workdir, "config.json")) as f:
        assert json.load(f)["train"]["steps"] == 6

    # Simulate a crash after the step-3 checkpoint: drop the later checkpoint and rerun.
    shutil.rmtree(os.path.join(workdir, "checkpoints", "6"))
    resumed = train(cfg, workdir)
    assert resumed["start_step"] == 3 and resumed["final_step"] == 6
    again_records = read_metrics(workdir)
    assert [r["step"] for r in again_records] == [r["step"] for r in records]  # one clean curve
    after = [r for r in again_records if "loss" in r and r["step"] > 3]
    assert [r["step"] for r in after] == [4, 5, 6]
    for original, again in zip(train_records[3:], after):
        assert again["loss"] == original["loss"]  # bit-for-bit on CPU
        assert again["grad_norm"] == original["grad_norm"]
        assert again["tokens/code"] == original["tokens/code"]  # per-domain accounting carries over


def test_rerun_of_a_finished_run_does_nothing(tmp_path, cache_dir, small_run):
    workdir = copy_run(small_run, tmp_path / "run")
    again = train(small_run_cfg(cache_dir), workdir)
    assert again["start_step"] == again["final_step"] == 6
    assert [r["step"] for r in read_metrics(workdir)] == [r["step"] for r in read_metrics(small_run)]


def test_a_dense_model_trains_checkpoints_and_resumes(tmp_path, cache_dir):
    """No MoE layers: no routing state to save (orbax cannot save empty arrays), no routing metrics."""
    cfg = small_run_cfg(cache_dir)
    cfg.model.first_k_dense = cfg.model.num_layers
    cfg.train.steps, cfg.checkpoint.every_steps = 3, 1
    workdir = str(tmp_path / "dense")
    train(cfg, workdir)
    assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["1", "2", "3"]
    shutil.rmtree(os.path.join(workdir, "checkpoints", "3"))  # resume from 2 (the same config: one compile)
    assert train(cfg, workdir)["start_step"] == 2
    records = [r for r in read_metrics(workdir) if "loss" in r]
    assert [r["step"] for r in records] == [1, 2, 3] and "max_vio" not in records[-1]


def test_config_json_holds_the_weights_the_run_trains_on(tmp_path):
    """A mixture file's weights, normalised, become data.mixture (the file is then cleared); a
    schedule is stored as its normalised stages."""
    from moejax.train.startup import resolved_config

    (tmp_path / "m.json").write_text(json.dumps({"weights": {"code": 0.7, "prose": 0.7}}))
    cfg = default_config()
    cfg.data.mixture_file = str(tmp_path / "m.json")
    resolved = resolved_config(cfg)  # check_config warned about the normalisation; this is quiet
    assert dict(resolved.data.mixture) == {"code": 0.5, "prose": 0.5} and resolved.data.mixture_file == ""
    assert cfg.data.mixture_file == str(tmp_path / "m.json")  # the caller's config is left as it was
    cfg = default_config()
    cfg.data.schedule = '[[0, {"code": 3, "math": 1}], [10, {"prose": 2}]]'
    stages = json.loads(resolved_config(cfg).data.schedule)
    assert stages == [[0, {"code": 0.75, "math": 0.25}], [10, {"prose": 1.0}]]


def test_divergence_message_says_what_a_rerun_does():
    from moejax.train.default_hooks import _diverged_message

    assert "No checkpoint was saved before the trouble, so a rerun starts from scratch" in _diverged_message(8, 9, None)
    assert "step None" not in _diverged_message(8, 9, None)
    assert "The newest checkpoint (step 100) is from before the trouble" in _diverged_message(8, 109, 100)


def test_a_refused_run_leaves_no_empty_directory(tmp_path, monkeypatch):
    from moejax.errors import ConfigError
    from moejax.train import loop

    def refused(cfg, workdir, *args):
        os.makedirs(os.path.join(workdir, "checkpoints"))  # as the Checkpointer does
        raise ConfigError("refused after the workdir was made")

    monkeypatch.setattr(loop, "_train", refused)
    with pytest.raises(ConfigError):
        train(default_config(), str(tmp_path / "new" / "run"))
    assert not (tmp_path / "new" / "run").exists()
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    with pytest.raises(ConfigError):
        train(default_config(), str(tmp_path / "mine"))
    assert os.listdir(tmp_path / "mine") == ["notes.txt"]


def test_metrics_in_a_log_file_are_lines_and_skip_non_finite_tensorboard_values(tmp_path, capsys):
    from moejax.train.metrics import MetricsLogger

    logger = MetricsLogger(str(tmp_path), total_steps=4, start_step=0)
    assert logger.bar.disable  # pytest's stderr is not a terminal
    logger.advance()
    logger.log(2, {"loss": float("nan"), "lr": 0.1})
    logger.close()
    assert "[2/4] step=2 loss=nan lr=0.1" in capsys.readouterr().out
    assert '"loss": NaN' in (tmp_path / "metrics.jsonl").read_text()
