"""Metric writers (moejax/train/trackers/): the same scalars reach metrics.jsonl, TensorBoard, W&B
(offline) and MLflow (a local file store); expert loads reach TensorBoard and W&B as histograms;
a resumed run continues its W&B/MLflow run; a chosen tracker that is missing, an unknown logger
name or a list without jsonl is refused before anything is compiled."""

import glob
import json
import os
import shutil
from pathlib import Path

import pytest

from moejax import config as config_lib
from moejax.config import default_config
from moejax.errors import ConfigError
from moejax.train import trackers
from moejax.train.trackers.run_id import resolve_run_id
from tests.test_train import copy_run, read_metrics, small_run, small_run_cfg  # noqa: F401 (small_run: shared fixture)

ALL = ("jsonl", "tensorboard", "wandb", "mlflow")


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """W&B offline, MLflow in a local file store: nothing leaves the machine."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_DIR", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return f"file:{tmp_path / 'mlruns'}"


def settings(workdir, mlflow_uri, run_id="r1"):
    return trackers.RunSettings(workdir=str(workdir), project="moejax-tests", run_name="unit", tags=("a", "b"),
                                run_id=run_id, mlflow_uri=mlflow_uri, config={"train": {"steps": 2}})


def by_step(values: dict[int, dict[str, float]]):
    """{(step, name): value}, for pytest.approx (TensorBoard keeps float32)."""
    return {(step, key): value for step, row in values.items() for key, value in row.items()}


# --- reading back what each tracker kept ---------------------------------------------------------

def tensorboard_scalars(workdir) -> dict[int, dict[str, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(workdir), size_guidance={"scalars": 0, "histograms": 0}).Reload()
    out: dict[int, dict[str, float]] = {}
    for tag in events.Tags()["scalars"]:
        for event in events.Scalars(tag):
            out.setdefault(event.step, {})[tag] = event.value
    return out


def tensorboard_histograms(workdir) -> dict[tuple[int, str], list[float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(workdir), size_guidance={"histograms": 0}).Reload()
    return {(event.step, tag): list(event.histogram_value.bucket)
            for tag in events.Tags()["histograms"] for event in events.Histograms(tag)}


def wandb_records(path: str) -> list:
    """The protobuf records of an offline W&B run file (a LevelDB-style log: 7-byte header, 32 KiB
    blocks of chunks with a 7-byte header: crc, length, kind 1 full | 2 first | 3 middle | 4 last)."""
    from wandb.proto import wandb_internal_pb2

    data = Path(path).read_bytes()
    assert data[:4] == b":W&B"
    pos, block, chunks, records = 7, 32768, b"", []
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        chunks = (b"" if kind in (1, 2) else chunks) + data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunks)
            records.append(record)
    return records


def wandb_run(workdir) -> list[dict]:
    """Per offline run segment (in start order): its id, name, tags and logged history."""
    segments = []
    for run_file in sorted(glob.glob(os.path.join(workdir, "wandb", "offline-run-*", "run-*.wandb"))):
        segment = {"history": []}
        for record in wandb_records(run_file):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                segment.update(id=record.run.run_id, name=record.run.display_name, tags=list(record.run.tags))
            elif kind == "history":
                segment["history"].append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                                           for item in record.history.item})
        segments.append(segment)
    return segments


def mlflow_runs(uri: str, project: str = "moejax-tests"):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name(project)
    return client, client.search_runs([experiment.experiment_id])


def mlflow_scalars(client, run) -> dict[int, dict[str, float]]:
    out: dict[int, dict[str, float]] = {}
    for key in run.data.metrics:
        for metric in client.get_metric_history(run.info.run_id, key):
            out.setdefault(metric.step, {})[key.replace(".", "/")] = metric.value  # a redone step: its last
    return out


# --- the writers, with made-up records ----------------------------------------------------------

def test_writers_get_the_same_scalars_and_tensorboard_and_wandb_the_expert_load_histograms(tmp_path, offline):
    records = [
        {"step": 1, "loss": 2.5, "lr": 0.1, "mfu": "n/a", "stage": 0, "tokens/code": 512,
         "expert_load": [[0.5, 0.25, 0.125, 0.125], [0.25, 0.25, 0.25, 0.25]], "drop_rate": [0.0, 0.0]},
        {"step": 2, "loss": float("nan"), "lr": 0.2, "eval_loss": 2.25, "eval_loss/code": 2.0},
    ]
    writers = trackers.open_writers(ALL, settings(tmp_path, offline))
    for record in records:
        for writer in writers:
            writer.write(record["step"], record)
    for writer in writers:
        writer.close()

    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert lines[0] == json.dumps(records[0])  # the whole record, as before
    expected = {1: {"loss": 2.5, "lr": 0.1, "stage": 0, "tokens/code": 512},
                2: {"lr": 0.2, "eval_loss": 2.25, "eval_loss/code": 2.0}}  # NaN and strings: jsonl only
    assert by_step(tensorboard_scalars(tmp_path)) == pytest.approx(by_step(expected))
    (segment,) = wandb_run(tmp_path)
    assert (segment["id"], segment["name"], segment["tags"]) == ("r1", "unit", ["a", "b"])
    assert [{k: v for k, v in h.items() if not k.startswith(("_", "expert_load"))} for h in segment["history"]] \
        == [{"step": step, **values} for step, values in expected.items()]  # "step": every chart's x axis
    client, (run,) = mlflow_runs(offline)
    assert by_step(mlflow_scalars(client, run)) == pytest.approx(by_step(expected))
    assert run.info.status == "FINISHED" and {"a", "b"} <= set(run.data.tags)
    assert run.data.params["train.steps"] == "2"

    # Bucket e holds expert e's load, per MoE layer, in TensorBoard and W&B.
    histograms = tensorboard_histograms(tmp_path)
    assert histograms[(1, "expert_load/layer_0")] == pytest.approx([0.5, 0.25, 0.125, 0.125])
    assert histograms[(1, "expert_load/layer_1")] == pytest.approx([0.25] * 4)
    logged = segment["history"][0]
    assert logged["expert_load/layer_0/_type"] == "histogram"
    assert logged["expert_load/layer_0/values"] == pytest.approx([0.5, 0.25, 0.125, 0.125])
    assert logged["expert_load/layer_0/bins"] == [0, 1, 2, 3, 4]


def test_a_second_start_continues_the_same_mlflow_run_and_ends_it_with_the_runs_status(tmp_path, offline):
    for error in (None, RuntimeError("boom")):
        (writer,) = trackers.open_writers(("mlflow",), settings(tmp_path, offline))
        writer.write(1, {"step": 1, "loss": 1.0})
        writer.close(error)
    client, runs = mlflow_runs(offline)
    assert len(runs) == 1 and runs[0].data.tags["moejax.run_id"] == "r1"
    assert runs[0].info.status == "FAILED"
    assert [m.step for m in client.get_metric_history(runs[0].info.run_id, "loss")] == [1, 1]


def test_run_id_is_made_on_the_first_start_kept_in_the_workdir_and_the_config_wins(tmp_path):
    first = resolve_run_id("", str(tmp_path))
    assert first and json.loads((tmp_path / "tracker_run.json").read_text()) == {"run_id": first}
    assert resolve_run_id("", str(tmp_path)) == first
    assert resolve_run_id("mine-1", str(tmp_path)) == "mine-1"
    assert resolve_run_id("", str(tmp_path / "..")) != first  # another workdir, another run


# --- config errors ------------------------------------------------------------------------------

@pytest.mark.parametrize("loggers, message", [
    ("jsonl,tensorbord", "'tensorbord' is not a logger. Did you mean 'tensorboard'?"),
    ("jsonl,neptune", "a comma-separated list of jsonl | tensorboard | wandb | mlflow"),
    ("tensorboard,wandb", "a list that includes jsonl"),
])
def test_bad_logger_lists_are_refused_with_the_allowed_names(loggers, message):
    cfg = default_config()
    cfg.train.loggers = loggers
    with pytest.raises(ConfigError, match="train.loggers") as info:
        config_lib.check_values(cfg, 8)
    assert message in str(info.value)


def test_a_chosen_tracker_that_is_not_installed_is_refused_before_compiling(tmp_path, monkeypatch):
    from moejax.train import loop

    monkeypatch.setitem(trackers.WRITERS, "wandb", ("wandb_writer", "moejax_no_such_package"))
    monkeypatch.setattr(loop, "check_config", lambda *a: ({}, None))  # the config's and data's checks pass
    monkeypatch.setattr(loop, "_train", lambda *a: pytest.fail("got past the checks"))
    cfg = default_config()
    cfg.train.loggers = "jsonl,tensorboard,wandb"
    with pytest.raises(ConfigError) as info:
        loop.train(cfg, str(tmp_path / "run"))
    assert "the wandb logger needs the moejax_no_such_package package" in str(info.value)
    assert 'pip install "moejax[track]"' in str(info.value)
    assert not (tmp_path / "run").exists()


# --- one real run, resumed twice ----------------------------------------------------------------

def test_training_logs_the_same_scalars_everywhere_and_a_resume_continues_the_same_runs(tmp_path, offline,
                                                                                        small_run):
    from moejax.train.loop import train

    cfg = small_run_cfg(os.environ["MOEJAX_CACHE"])
    cfg.train.loggers, cfg.train.project, cfg.train.tags = ",".join(ALL), "moejax-tests", "smoke"
    cfg.train.mlflow_uri = offline
    workdir = Path(copy_run(small_run, tmp_path / "run"))  # 6 steps, checkpoints at 3 and 6

    # A crash after the step-3 checkpoint, then a rerun with every tracker on: steps 4-6 again.
    shutil.rmtree(workdir / "checkpoints" / "6")
    assert train(cfg, str(workdir))["start_step"] == 3
    jsonl = {r["step"]: trackers.scalars(r) for r in read_metrics(workdir) if r["step"] > 3}
    assert sorted(jsonl) == [4, 5, 6] and {"loss", "max_vio", "eval_loss", "tokens/code"} <= set(jsonl[6])
    assert by_step({s: v for s, v in tensorboard_scalars(workdir).items() if s > 3}) == pytest.approx(by_step(jsonl))
    (segment,) = wandb_run(workdir)
    run_id = json.loads((workdir / "tracker_run.json").read_text())["run_id"]
    assert (segment["id"], segment["name"], segment["tags"]) == (run_id, "run", ["smoke"])
    wandb_steps = {h["step"]: {k: v for k, v in h.items() if k != "step" and not k.startswith(("_", "expert_load"))}
                   for h in segment["history"]}
    assert by_step(wandb_steps) == pytest.approx(by_step(jsonl))
    assert segment["history"][-1]["expert_load/layer_0/_type"] == "histogram"
    client, (run,) = mlflow_runs(offline)
    assert by_step(mlflow_scalars(client, run)) == pytest.approx(by_step(jsonl))

    # Once more: the same W&B id, the same MLflow run.
    shutil.rmtree(workdir / "checkpoints" / "6")
    assert train(cfg, str(workdir))["start_step"] == 3
    first, second = wandb_run(workdir)
    assert second["id"] == first["id"] == run_id
    assert [h["step"] for h in second["history"]] == [4, 5, 6]
    client, (resumed,) = mlflow_runs(offline)
    assert resumed.info.run_id == run.info.run_id and resumed.info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "loss")] == [4, 5, 6, 4, 5, 6]
    assert [r["step"] for r in read_metrics(workdir) if "loss" in r] == [1, 2, 3, 4, 5, 6]
