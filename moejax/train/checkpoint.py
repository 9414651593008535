"""Orbax checkpoints: train state, data-iterator state and run metadata, with safe recovery.

Layout: ``WORKDIR/checkpoints/<step>/{state,data,meta}``. ``state`` is the sharded train-state
pytree (parameters, optimizer state, balancing state, step), restored straight into the shardings
of the current mesh, so a run saved on 8 devices resumes on 4 or under another fsdp/expert split.
``data`` is the grain iterator state and per-domain token counts; ``meta`` holds the resolved
config, the tokenizer id and the code version (all JSON).

Saves are asynchronous (orbax writes in a background thread and commits a checkpoint atomically,
by renaming a temporary directory, only once every item is on disk), so a kill mid-save leaves
the previous checkpoints untouched. A checkpoint that fails to read (truncated file, missing
item) is reported and moved to ``WORKDIR/checkpoints_corrupt/`` (never deleted) and the previous
one is used. Retention: the last ``max_to_keep`` plus every ``keep_period``-th step.

Several processes (multi-host) save and restore together: every process calls ``save`` and
``restore`` at the same steps and writes the shards of ``state`` its devices hold; orbax writes
the JSON items (``data``, ``meta``) from process 0 only, which is right because they are the same
on every process (``check_same_on_every_process`` checks it at startup: the data-iterator state
does not depend on which rows a process packs, see ``moejax.data.pipeline``). Choices that must
agree (fall back from a checkpoint one process cannot read, save on a preemption signal that
reached one process) go through ``any_process``. The checkpoint directory must be on a filesystem
that every process sees.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import logging
import os
import shutil
import time
import traceback
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from jax.experimental import multihost_utils

from moejax.errors import ConfigError, RunStopped
from moejax.train.checkpoint_damage import quiet_closed_loop_callbacks, unreadable_reason

log = logging.getLogger(__name__)


class CheckpointMismatch(ConfigError):
    """The checkpoint's parameters do not fit the configured model (different shapes or tree)."""


class ParamsOnlyCheckpoint(CheckpointMismatch):
    """The checkpoint holds parameters but no optimizer state (e.g. a Hugging Face import):
    training starts from it with ``checkpoint.init_from``, it is not resumed."""


class SaveFailed(RunStopped):
    """A checkpoint could not be written (a full disk, a vanished mount): the run stops; the
    checkpoints written before stay as they were."""

    exit_code = 74  # EX_IOERR


@dataclasses.dataclass
class Restored:
    step: int
    state: Any
    data: dict
    meta: dict


def flat_shapes(tree: Any) -> dict[str, tuple[int, ...]]:
    """'blocks/0/attn/w_q_dnh' -> shape, for a pytree of arrays or orbax array metadata."""
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {
        "/".join(str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path): tuple(leaf.shape)
        for path, leaf in flat
    }


def describe_mismatch(saved: dict[str, tuple], wanted: dict[str, tuple]) -> list[str]:
    """Human-readable differences between two {parameter path: shape} tables."""
    lines = []
    for name in sorted(set(saved) | set(wanted)):
        if name not in wanted:
            lines.append(f"{name}: in the checkpoint {saved[name]}, not in the model")
        elif name not in saved:
            lines.append(f"{name}: in the model {wanted[name]}, not in the checkpoint")
        elif saved[name] != wanted[name]:
            lines.append(f"{name}: checkpoint {saved[name]} vs model {wanted[name]}")
    return lines


def _handlers() -> dict[str, ocp.CheckpointHandler]:
    """Item handlers, so metadata can be read before (or without) a restore."""
    return {
        "state": ocp.StandardCheckpointHandler(),
        "data": ocp.JsonCheckpointHandler(),
        "meta": ocp.JsonCheckpointHandler(),
    }


class Checkpointer:
    """Saves ``{state, data, meta}`` per step; restores the newest readable checkpoint."""

    def __init__(self, directory: str, *, max_to_keep: int, keep_period: int = 0, owner: bool = False):
        """``owner``: the training run that holds the workdir (moejax/train/lock.py): it removes the
        files of saves cut short (a kill, a full disk); a reader (eval) must not, a save may be on."""
        self.directory = os.path.abspath(directory)
        self.corrupt_dir = self.directory.rstrip("/") + "_corrupt"
        options = ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep, keep_period=keep_period or None, create=True,
            cleanup_tmp_directories=owner,
        )
        absl_logger = logging.getLogger("absl")  # before the manager, which reads every step's metadata
        if _orbax_errors_hidden not in absl_logger.filters:
            absl_logger.addFilter(_orbax_errors_hidden)
        asyncio_logger = logging.getLogger("asyncio")
        if _orbax_futures_hidden not in asyncio_logger.filters:
            asyncio_logger.addFilter(_orbax_futures_hidden)
        self.manager = ocp.CheckpointManager(self.directory, options=options, item_handlers=_handlers())
        self._saving: int | None = None  # the step of the save started last

    def steps(self) -> list[int]:
        return sorted(self.manager.all_steps())

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, step: int, state: Any, data_state: dict, meta: dict) -> None:
        """Starts an asynchronous save (a no-op if ``step`` is already saved)."""
        if step in self.manager.all_steps():
            return
        self.wait()  # the previous save's failure is that step's
        args = ocp.args.Composite(
            state=ocp.args.StandardSave(state),
            data=ocp.args.JsonSave(data_state),
            meta=ocp.args.JsonSave(meta),
        )
        self._saving = step
        try:
            self.manager.save(step, args=args, force=True)
        except Exception as error:  # noqa: BLE001 - any write failure stops the run the same way
            raise self._failed(error) from None
        log.debug(f"moejax: saving checkpoint {step} to {self.directory} (in the background)")

    def check_compatible(self, step: int, abstract_state: Any) -> None:
        """Raises CheckpointMismatch naming every parameter whose shape or presence differs."""
        saved = self.manager.item_metadata(step)["state"]
        saved = getattr(saved, "tree", saved)
        missing = sorted(set(abstract_state) - set(saved))
        if "params" in saved and missing:
            workdir = os.path.dirname(self.directory)
            raise ParamsOnlyCheckpoint(
                f"checkpoint {self.directory}/{step} holds {sorted(saved)} but no {missing}: parameters only "
                "(as `python -m moejax.interop.hf import` writes), so it cannot be resumed. Train from its "
                f"parameters in a new workdir with --config.checkpoint.init_from={workdir} (an import's "
                "experiment.py sets it), or import with --with-optimizer to resume the workdir itself."
            )
        saved_params = flat_shapes(saved["params"])
        wanted_params = flat_shapes(abstract_state["params"])
        problems = describe_mismatch(saved_params, wanted_params)
        if problems:
            shown = "\n  ".join(problems[:20]) + ("\n  ..." if len(problems) > 20 else "")
            raise CheckpointMismatch(
                f"checkpoint {self.directory}/{step} does not fit the configured model "
                f"({len(problems)} parameter(s) differ):\n  {shown}\n"
                "Use the config the checkpoint was trained with (its meta/ item holds it), or start "
                "from its parameters only with checkpoint.init_from."
            )

    def restore(self, step: int, abstract_state: Any) -> Restored:
        args = ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state),
            data=ocp.args.JsonRestore(),
            meta=ocp.args.JsonRestore(),
        )
        restored = self.manager.restore(step, args=args)
        return Restored(step, restored.state, restored.data, restored.meta)

    def restore_latest(self, abstract_state: Any) -> Restored | None:
        """The newest checkpoint that reads back on every process; unreadable ones are reported
        and set aside."""
        quiet_closed_loop_callbacks()  # a failed read's late reports would bury the notice
        for step in reversed(self.steps()):
            restored, error = None, None
            try:
                self.check_compatible(step, abstract_state)
                restored = self.restore(step, abstract_state)
            except CheckpointMismatch:
                raise
            except Exception as e:  # noqa: BLE001 - any read failure means a damaged checkpoint
                error = e
            # A process reads only its own shards: one may fail where the others succeed.
            if not any_process(error is not None):
                return restored
            self._quarantine(step, error)
        return None

    def _quarantine(self, step: int, error: Exception | None) -> None:
        source = os.path.join(self.directory, str(step))
        target = os.path.join(self.corrupt_dir, f"{step}-{time.strftime('%Y%m%d-%H%M%S')}")
        reason = unreadable_reason(source, error)
        if jax.process_index() == 0:
            os.makedirs(self.corrupt_dir, exist_ok=True)
            shutil.move(source, target)
            log.warning(f"moejax: checkpoint {source} is unreadable:\n  {reason}\n  moved it to {target} and "
                        "falling back to the previous checkpoint.")
        if jax.process_count() > 1:  # nobody lists the steps again before process 0 has moved it
            multihost_utils.sync_global_devices(f"moejax_quarantine_{step}")
        self.manager.reload()

    def failure(self) -> SaveFailed | None:
        """What went wrong with a background save that has ended, if anything (no waiting)."""
        if self._saving is None or self.manager.is_saving_in_progress():
            return None
        try:
            self.wait()  # ended: returns at once, or raises its error
        except SaveFailed as failed:
            return failed
        self._saving = None  # on disk: nothing more to check
        return None

    def wait(self) -> None:
        """Waits for the save in progress; ``SaveFailed`` if it failed."""
        try:
            self.manager.wait_until_finished()
        except Exception as error:  # noqa: BLE001
            raise self._failed(error) from None

    def close(self) -> None:
        try:
            self.wait()
        finally:
            self.manager.close()

    def _failed(self, error: BaseException) -> SaveFailed:
        """The one-paragraph ``SaveFailed`` of the save in progress."""
        step, saved = self._saving, [s for s in ocp.utils.checkpoint_steps(self.directory) if s != self._saving]
        self._saving = None  # reported once
        text = str(error)
        if getattr(error, "errno", None) == errno.ENOSPC or "no space left on device" in text.lower():
            reason = "no space left on device"
        else:
            reason = f"{type(error).__name__}: {text.splitlines()[0][:300] if text else ''}"
        last = (f"the last good checkpoint is step {max(saved)}" if saved else "no checkpoint was saved before")
        rerun = (f"rerun the same command to resume from step {max(saved)}" if saved
                 else "rerun the same command to start again")
        return SaveFailed(f"{reason} while saving step {step} in {self.directory}; {last}, and the run stops "
                          f"here. Make room (or train into another --workdir), then {rerun}.")


def _orbax_errors_hidden(record: logging.LogRecord) -> bool:
    """A filter on the ``absl`` logger: orbax's own error reports (a traceback from each thread of a
    failed save) are left out, because moejax reports every checkpoint failure itself in one
    paragraph (``SaveFailed``, an unreadable checkpoint set aside), and so are its notes on a step
    without its ``_CHECKPOINT_METADATA`` file (the step reads without it, or is reported as
    unreadable); ``-v`` shows them."""
    if "orbax" not in record.pathname or logging.getLogger("moejax").isEnabledFor(logging.DEBUG):
        return True
    return record.levelno < logging.ERROR and not str(record.msg).startswith("Metadata file does not exist")


def _orbax_futures_hidden(record: logging.LogRecord) -> bool:
    """A filter on the ``asyncio`` logger: after a failed save, orbax's write tasks leave futures
    whose errors nobody retrieved, and asyncio reports each (with its traceback) when it collects
    them, often as the process exits. They repeat the failure ``SaveFailed`` has reported in one
    paragraph, so they are left out; ``-v`` shows them."""
    if logging.getLogger("moejax").isEnabledFor(logging.DEBUG) or "exception was never retrieved" not in str(record.msg):
        return True
    tb = record.exc_info[2] if record.exc_info else None
    files = [frame.f_code.co_filename for frame, _ in traceback.walk_tb(tb)] if tb else []
    return not any("orbax" in f for f in files)


def any_process(flag: bool) -> bool:
    """``flag`` or'ed over all processes.

    Saving and restoring are collective, so every process must take the same branch, e.g. save
    now because a preemption signal reached one host, or skip a checkpoint one host cannot read.
    """
    if jax.process_count() == 1:
        return flag
    return bool(np.any(multihost_utils.process_allgather(np.asarray(flag))))


def any_processes(*flags: bool) -> tuple[bool, ...]:
    """Each of ``flags`` or'ed over all processes, in one collective."""
    if jax.process_count() == 1:
        return flags
    gathered = multihost_utils.process_allgather(np.asarray(flags, bool))
    return tuple(bool(v) for v in np.any(np.reshape(gathered, (-1, len(flags))), axis=0))


def check_same_on_every_process(items: dict[str, Any]) -> None:
    """Raises ConfigError naming each JSON item (config, data state...) that differs between processes.

    Process 0 alone writes the JSON items of a checkpoint, so they must hold for every process;
    a host launched with other overrides, code or a different copy of the dataset is caught here
    instead of training on inconsistent batches.
    """
    if jax.process_count() == 1:
        return
    digests = np.array(
        [np.frombuffer(hashlib.sha256(json.dumps(v, sort_keys=True).encode()).digest()[:4], np.uint32)[0]
         for v in items.values()], np.uint32,
    )
    gathered = multihost_utils.process_allgather(digests)  # [processes, items]
    differing = {
        name: np.flatnonzero(gathered[:, i] != gathered[0, i]).tolist() for i, name in enumerate(items)
    }
    problems = [f"{name} (processes {ps} vs process 0)" for name, ps in differing.items() if ps]
    if problems:
        raise ConfigError(
            f"the processes of this run disagree on: {', '.join(problems)}. Launch the same command "
            "with the same code on every host, with the dataset on a shared filesystem (or identical "
            "copies) and the same --config overrides."
        )


def _init_from_step(path: str, step: int | None) -> tuple[str, int]:
    """(the checkpoints directory, the step) that ``checkpoint.init_from=path`` names."""
    path = os.path.abspath(path)
    if os.path.isdir(os.path.join(path, "checkpoints")):
        path = os.path.join(path, "checkpoints")
    if os.path.basename(path).isdigit() and step is None:
        path, step = os.path.dirname(path), int(os.path.basename(path))
    if not os.path.isdir(path):
        raise ConfigError(f"config key 'checkpoint.init_from' has value {path!r}; no such directory.")
    steps = sorted(ocp.utils.checkpoint_steps(path))  # finished (committed) ones
    step = steps[-1] if step is None and steps else step
    if step is None or step not in steps:
        raise ConfigError(
            f"config key 'checkpoint.init_from' has value {path!r}; it holds no checkpoint"
            + (f" at step {step}" if step is not None else "") + f" (steps: {steps})."
        )
    return path, step


def init_from_meta(path: str, step: int | None = None) -> tuple[str, dict]:
    """(the step directory, its run metadata: config, tokenizer id, ...) of the checkpoint that
    ``load_params(path, ..., step)`` reads; the metadata is {} if the checkpoint has none."""
    path, step = _init_from_step(path, step)
    meta = epath.Path(path) / str(step) / "meta"
    found = ocp.JsonCheckpointHandler().restore(meta, args=ocp.args.JsonRestore()) if meta.is_dir() else None
    return os.path.join(path, str(step)), found or {}


def load_params(path: str, abstract_params: Any, step: int | None = None) -> tuple[Any, int]:
    """Parameters only from a checkpoint (a workdir, its checkpoints/ dir, or one step's dir).

    For continued training with a fresh optimizer and data mixture, and for MergeMix experts.
    Checks shapes first and names every mismatched parameter.
    """
    path, step = _init_from_step(path, step)
    # The state item's own handler, not a CheckpointManager: a manager restoring one item logs a
    # warning for each other item of the step (meta, data), which reads like a failure.
    handler = ocp.PyTreeCheckpointHandler()
    state_dir = epath.Path(path) / str(step) / "state"
    try:
        saved = handler.metadata(state_dir)
        problems = describe_mismatch(flat_shapes(getattr(saved, "tree", saved)["params"]),
                                     flat_shapes(abstract_params))
        if problems:
            raise CheckpointMismatch(
                f"checkpoint {path}/{step} does not fit the configured model:\n  " + "\n  ".join(problems[:20])
            )
        target = {"params": abstract_params}  # a partial restore of the state item: the params only
        restored = handler.restore(state_dir, args=ocp.args.PyTreeRestore(
            item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target), partial_restore=True,
        ))
    finally:
        handler.close()
    return restored["params"], step
