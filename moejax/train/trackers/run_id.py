"""One W&B/MLflow run id per workdir, so a resumed run continues the run it started.

``train.run_id`` wins when set. Otherwise the first start makes an id and writes it to
``WORKDIR/tracker_run.json``; every later start in that workdir (a resume) reads it back.
"""

from __future__ import annotations

import json
import os
import secrets

from moejax import paths
from moejax.errors import ConfigError

FILE = "tracker_run.json"


def resolve_run_id(configured: str, workdir: str) -> str:
    """``configured`` if set; else the workdir's id, made and stored on the first start."""
    if configured:
        return configured
    path = os.path.join(workdir, FILE)
    if os.path.exists(path):
        try:
            with open(path) as f:
                run_id = json.load(f)["run_id"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ConfigError(f"{path} holds no run id ({e}); it names the W&B/MLflow run this workdir "
                              "logs to. Delete it to start a new run, or set --config.train.run_id=ID "
                              "to continue a known one.") from None
        if isinstance(run_id, str) and run_id:
            return run_id
        raise ConfigError(f"{path}: run_id {run_id!r} is not a run id; delete the file to start a new run.")
    run_id = secrets.token_hex(6)  # 12 characters that W&B and MLflow tags accept
    paths.write_file(path, lambda f: json.dump({"run_id": run_id}, f))
    return run_id
