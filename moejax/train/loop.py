"""The training loop: check, lock the workdir, set up (moejax/train/startup.py), then train steps and
fire hooks after each (moejax/train/hooks.py; the built-in ones in moejax/train/default_hooks.py).

Multi-host: every process runs this same loop in lockstep and fires every hook, so all take the
same branches (evaluation, checkpoint, stop); process 0 alone writes files. See docs/multihost.md.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import jax

from moejax import paths
from moejax.checks import check_config
from moejax.data.dataset import DatasetInfo
from moejax.train import default_hooks, trackers
from moejax.train.checkpoint import any_process
from moejax.train.default_hooks import Diverged  # noqa: F401 - what a diverged run raises
from moejax.train.hooks import Hook, StepInfo, check_hooks, fire
from moejax.train.lock import WorkdirLock, WorkdirLocked
from moejax.train.preemption import PreemptionGuard
from moejax.train.startup import Training, resolved_config, start


def train(cfg, workdir: str, *, changed: Sequence[str] = (), hooks: Sequence[Hook] = ()) -> dict[str, Any]:
    """Trains ``cfg`` into ``workdir``, resuming from its latest checkpoint. Returns a summary.

    ``hooks``: the caller's own :class:`~moejax.train.hooks.Hook` s, fired after each step they are
    due. ``changed``: the config keys set on the command line (for the config errors' wording).
    Refuses a workdir another run is training in (``WorkdirLocked``). A run refused or interrupted
    before its first checkpoint leaves no empty directory behind."""
    mesh_shape, data_info = check_config(cfg, changed, workdir)
    trackers.check_installed(cfg.train.loggers)  # a chosen W&B/MLflow that is missing: before compiling
    hooks = check_hooks(hooks)
    cfg = resolved_config(cfg)
    existed = os.path.isdir(workdir)
    paths.make_dir(workdir, "--workdir")
    try:
        lock = _lock(workdir)
        try:
            return _train(cfg, workdir, mesh_shape, data_info, hooks)
        finally:
            lock.release()
    except WorkdirLocked:  # the workdir is the other run's: nothing here to tidy
        raise
    except BaseException:
        _remove_if_empty(os.path.join(workdir, "checkpoints"))
        if not existed:
            _remove_if_empty(workdir)
        raise


def _lock(workdir: str) -> WorkdirLock:
    """The workdir's lock, taken by process 0 (release it when done); every process raises if it is
    held elsewhere."""
    lock = WorkdirLock(workdir, enabled=jax.process_index() == 0)
    refused = None
    try:
        lock.acquire()
    except WorkdirLocked as error:
        refused = error
    if any_process(refused is not None):
        raise refused or WorkdirLocked(f"process 0 found workdir {workdir} in use by another training run "
                                       "(its own message says which).")
    return lock


def _train(cfg, workdir: str, mesh_shape: dict[str, int], data_info: DatasetInfo, hooks=()) -> dict[str, Any]:
    tr = start(cfg, workdir, mesh_shape, data_info)  # resume, compile while the data loads, writers
    stopped_by: BaseException | None = None  # what ended the run early, for the trackers' run status
    try:
        with jax.set_mesh(tr.mesh), PreemptionGuard(cfg.checkpoint.grace_seconds) as tr.preemption:
            default_hooks.begin(tr)
            run_steps(tr, default_hooks.hooks(tr, hooks))
    except BaseException as error:
        stopped_by = error
        raise
    finally:
        tr.close(stopped_by)
    return default_hooks.finish(tr)


def run_steps(tr: Training, hooks: Sequence[Hook]) -> None:
    """Trains from ``tr.step`` to ``train.steps``: one step, then every hook that is due."""
    steps = tr.cfg.train.steps
    while tr.step < steps:
        tr.state, metrics = tr.train_step(tr.state, tr.next_batch())
        tr.step += 1
        fire(hooks, StepInfo(step=tr.step, state=tr.state, metrics=metrics, last=tr.step == steps))


def _remove_if_empty(path: str) -> None:
    try:
        os.rmdir(path)
    except OSError:  # not empty, already gone, or another process's
        pass
