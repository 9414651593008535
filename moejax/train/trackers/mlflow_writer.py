"""The ``mlflow`` writer: scalars to an MLflow run.

The run lives in experiment ``train.project`` of the tracking store ``train.mlflow_uri`` (""
means ``$MLFLOW_TRACKING_URI``, else a file store in ``WORKDIR/mlruns``). It carries the tag
``moejax.run_id`` (see :mod:`.run_id`), by which a resumed run finds and continues it; a new run
is named ``train.run_name``, tagged with ``train.tags`` (each a tag with an empty value) and gets
the resolved config as parameters. It ends FINISHED, KILLED (preempted, interrupted) or FAILED.

Metric names have ``.`` for ``/`` (``eval_loss.code``, ``max_vio.layer_0``), in every kind of
store: a file store keeps each metric as a file, where ``eval_loss`` and ``eval_loss/code`` cannot
both exist.

MLflow 3 keeps file stores in maintenance mode and refuses them unless
``MLFLOW_ALLOW_FILE_STORE=true``; a file store is what a run without a tracking server needs, so
this process sets that variable (if unset) when the tracking URI is a file store.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from moejax.errors import ConfigError
from moejax.train.trackers import RunSettings, scalars

RUN_ID_TAG = "moejax.run_id"
_BATCH = 1000  # MLflow's most metrics per log_batch call
_PARAM_BATCH = 100  # and parameters
_PARAM_CHARS = 500  # a parameter value's length that every MLflow store accepts


def tracking_uri(settings: RunSettings) -> str:
    """``train.mlflow_uri``, else ``$MLFLOW_TRACKING_URI``, else ``file:`` WORKDIR/mlruns."""
    return (settings.mlflow_uri or os.environ.get("MLFLOW_TRACKING_URI")
            or Path(settings.workdir, "mlruns").resolve().as_uri())


def is_file_store(uri: str) -> bool:
    return uri.startswith("file:") or "://" not in uri


class MlflowWriter:
    def __init__(self, settings: RunSettings):
        from mlflow.tracking import MlflowClient

        uri = tracking_uri(settings)
        if is_file_store(uri):
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        try:
            self.client = MlflowClient(tracking_uri=uri)
            self.run_id = self._run(settings)
        except Exception as e:
            raise ConfigError(
                f"train.loggers: the mlflow logger could not open run {settings.run_id!r} of experiment "
                f"{settings.project!r} in tracking store {uri!r}: {e}. Check train.mlflow_uri "
                "(e.g. file:runs/mlruns, sqlite:///mlflow.db or a server's http:// address)."
            ) from None

    def _run(self, s: RunSettings) -> str:
        """The id of the MLflow run tagged with ``s.run_id`` (continued), or of a new one."""
        experiment = self.client.get_experiment_by_name(s.project)
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(s.project)
        found = self.client.search_runs([experiment_id], filter_string=f"tags.`{RUN_ID_TAG}` = '{s.run_id}'",
                                        max_results=1)
        if found:
            self.client.update_run(found[0].info.run_id, status="RUNNING")
            return found[0].info.run_id
        tags = {**{tag: "" for tag in s.tags}, RUN_ID_TAG: s.run_id, "moejax.workdir": os.path.abspath(s.workdir)}
        run_id = self.client.create_run(experiment_id, run_name=s.run_name, tags=tags).info.run_id
        from mlflow.entities import Param

        params = [Param(key, str(value)[:_PARAM_CHARS]) for key, value in _flat(s.config).items()]
        for start in range(0, len(params), _PARAM_BATCH):
            self.client.log_batch(run_id, params=params[start:start + _PARAM_BATCH])
        return run_id

    def write(self, step: int, record: dict[str, Any]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(metric_name(key), float(value), now, step) for key, value in scalars(record).items()]
        for start in range(0, len(metrics), _BATCH):
            self.client.log_batch(self.run_id, metrics=metrics[start:start + _BATCH])

    def close(self, error: BaseException | None = None) -> None:
        if error is None:
            status = "FINISHED"
        elif isinstance(error, KeyboardInterrupt) or hasattr(error, "signum"):  # interrupted, preempted
            status = "KILLED"
        else:
            status = "FAILED"
        self.client.set_terminated(self.run_id, status=status)


def metric_name(key: str) -> str:
    """The MLflow name of a scalar: ``.`` for ``/``."""
    return key.replace("/", ".")


def _flat(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, dict) and value:
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def open_writer(settings: RunSettings) -> MlflowWriter:
    return MlflowWriter(settings)
