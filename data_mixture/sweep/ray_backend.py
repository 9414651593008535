"""Ray backend: each attempt is a Ray task that runs the same subprocesses as the local backend.

``ray.remote(num_cpus=C, num_gpus=G)`` reserves the run's resources on some node of the cluster
(Ray sets ``CUDA_VISIBLE_DEVICES`` to the task's GPUs, which the moejax child inherits), and the
task calls :func:`data_mixture.sweep.attempt.run_job`: one process per training run, so JAX owns
exactly the devices Ray gave it. Leases, status, skip/resume/retry and the runs table stay with
the runner (the driver), as for the local backend.

Requirements on a multi-node cluster: the repository and its virtual environment at the same path
on every node (tasks run ``sys.executable`` of the driver in the driver's working directory), and
the sweep root on a filesystem every node sees (the tasks write checkpoints, evaluations and logs
there; the driver reads them). Stop requests reach a task through ``RUN_DIR/stop.request``, which
the task polls, so that a Ctrl-C waits for the checkpoint the child saves on SIGTERM; a second
Ctrl-C also cancels the tasks with ``force=True`` (Ray kills the worker and its children).

``ray`` is imported here only, so the local path and the rest of data_mixture never load it.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any


def _remote_job(job: dict[str, Any]) -> dict[str, Any]:
    """The task body: runs the attempt, polling ``RUN_DIR/stop.request`` for the runner's stop."""
    from data_mixture.sweep import record
    from data_mixture.sweep.attempt import run_job

    stop_path = Path(job["run_dir"]) / record.STOP

    def should_stop() -> int:
        try:
            return 2 if stop_path.read_text().strip() == "kill" else 1
        except FileNotFoundError:
            return 0

    return run_job(job, should_stop)


class RayBackend:
    name = "ray"

    def __init__(self, *, address: str | None, cpus_per_run: float, gpus_per_run: float, parallel: int | None,
                 init_kwargs: dict[str, Any] | None = None):
        try:
            import ray
        except ImportError:
            from data_mixture.sweep.targets import SweepError

            raise SweepError("--backend ray needs Ray, which the base install leaves out: pip install "
                             "'moejax[sweep]' (or --backend local, the default, on this machine).") from None

        self.ray = ray
        kwargs = dict(init_kwargs or {})
        kwargs.setdefault("include_dashboard", False)
        kwargs.setdefault("log_to_driver", False)
        # The task body is this package: workers import it from the driver's working directory.
        cwd = os.getcwd()
        pythonpath = os.pathsep.join(p for p in (cwd, os.environ.get("PYTHONPATH", "")) if p)
        kwargs.setdefault("runtime_env", {"env_vars": {"PYTHONPATH": pythonpath}})
        if not ray.is_initialized():
            ray.init(address=address, **kwargs)
        resources = ray.cluster_resources()
        self.cpus_per_run, self.gpus_per_run = cpus_per_run, gpus_per_run
        fits = []
        if cpus_per_run > 0:
            fits.append(int(resources.get("CPU", 0) // cpus_per_run))
        if gpus_per_run > 0:
            fits.append(int(resources.get("GPU", 0) // gpus_per_run))
        if fits and min(fits) < 1:
            from data_mixture.sweep.targets import SweepError

            ray.shutdown()
            raise SweepError(f"the Ray cluster at {address or 'localhost (started here)'} has {resources.get('CPU', 0):g} "
                             f"CPU(s) and {resources.get('GPU', 0):g} GPU(s); one run needs --cpus-per-run "
                             f"{cpus_per_run:g} and --gpus-per-run {gpus_per_run:g}. Lower them or add nodes.")
        self.slots = parallel or max(1, min(fits) if fits else 1)
        self.cluster = resources
        self._task = ray.remote(num_cpus=cpus_per_run, num_gpus=gpus_per_run, max_retries=0)(_remote_job)
        self._refs: dict[Any, str] = {}

    def describe(self) -> str:
        return (f"ray, {self.slots} at a time, {self.cpus_per_run:g} CPU + {self.gpus_per_run:g} GPU per run on a cluster "
                f"of {self.cluster.get('CPU', 0):g} CPU / {self.cluster.get('GPU', 0):g} GPU")

    def submit(self, key: str, job: dict[str, Any]) -> None:
        self._refs[self._task.remote(job)] = key

    def wait(self, timeout: float) -> list[tuple[str, dict[str, Any]]]:
        if not self._refs:
            time.sleep(timeout)
            return []
        ready, _ = self.ray.wait(list(self._refs), num_returns=len(self._refs), timeout=timeout)
        out = []
        for ref in ready:
            key = self._refs.pop(ref)
            try:
                result = self.ray.get(ref)
            except Exception as e:  # the task or its worker died (RayTaskError, WorkerCrashedError, cancelled)
                result = {"state": "failed", "phase": "ray", "returncode": None, "log": None, "seconds": 0.0,
                          "trained": False, "message": f"Ray task failed: {type(e).__name__}: {str(e)[:300]}"}
            out.append((key, result))
        return out

    def stop(self, key: str | None = None) -> None:
        """All runs (Ctrl-C): nothing to do here, the runner writes each run's ``stop.request``, which
        the task polls on any node. One run (its lease was lost): cancel its task without force (a
        KeyboardInterrupt in the task, on which the attempt sends its child SIGTERM and waits)."""
        if key is not None:
            for ref, k in list(self._refs.items()):
                if k == key:
                    self.ray.cancel(ref, force=False)

    def kill(self) -> None:
        for ref in list(self._refs):
            self.ray.cancel(ref, force=True)

    def close(self) -> None:
        if self.ray.is_initialized():
            self.ray.shutdown()
