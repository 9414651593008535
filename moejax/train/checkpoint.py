"""Orbax checkpoints of the train state, the data-iterator state and run metadata."""

from __future__ import annotations

import os
from typing import Any

import orbax.checkpoint as ocp


class Checkpointer:
    """Saves ``{state, data, meta}`` under ``directory/<step>``; restores the latest onto shardings.

    ``state`` is the sharded train-state pytree (restored into the shardings of the abstract target,
    so a checkpoint can be loaded onto another mesh); ``data`` is the grain iterator state and
    ``meta`` the resolved config and tokenizer id, both JSON.
    """

    def __init__(self, directory: str, *, max_to_keep: int):
        options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True)
        self.manager = ocp.CheckpointManager(os.path.abspath(directory), options=options)

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, step: int, state: Any, data_state: dict, meta: dict) -> None:
        args = ocp.args.Composite(
            state=ocp.args.StandardSave(state),
            data=ocp.args.JsonSave(data_state),
            meta=ocp.args.JsonSave(meta),
        )
        self.manager.save(step, args=args, force=True)

    def restore(self, step: int, abstract_state: Any) -> tuple[Any, dict, dict]:
        args = ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state),
            data=ocp.args.JsonRestore(),
            meta=ocp.args.JsonRestore(),
        )
        restored = self.manager.restore(step, args=args)
        return restored.state, restored.data, restored.meta

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()
