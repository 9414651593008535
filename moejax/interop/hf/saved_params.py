"""A moejax checkpoint step's parameters read one at a time (orbax partial restores into numpy),
so an export never holds the whole train state: the optimizer state is never read, and a
parameter is read in the dtype it was saved in."""

from __future__ import annotations

import os
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from moejax.interop.hf.errors import InteropError


def _key(key_path) -> str:
    return "/".join(str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in key_path)


def _nest(keys: tuple, leaf: Any) -> Any:
    for k in reversed(keys):
        leaf = {k: leaf}
    return leaf


class SavedParams:
    """The ``state`` item of ``<workdir>/checkpoints/<step>``: its parameters by key
    (``layers/1/mlp/w_gate_edf``, a :class:`~moejax.interop.hf.tensors.LeafSource`) and its other
    top-level entries (``balance``, ``opt_state``, ...) by name."""

    def __init__(self, step_dir: str):
        self.path = epath.Path(step_dir) / "state"
        if not self.path.is_dir():
            raise InteropError(f"{step_dir} has no state item; is it a moejax checkpoint step?")
        self.handler = ocp.PyTreeCheckpointHandler()
        metadata = self.handler.metadata(self.path)
        self.tree = getattr(metadata, "tree", metadata)
        if "params" not in self.tree:
            raise InteropError(f"{step_dir} holds no parameters (entries: {sorted(self.tree)}).")
        self.leaves = {
            _key(key_path): (tuple(getattr(k, "key", k) for k in key_path), leaf)
            for key_path, leaf in jax.tree_util.tree_flatten_with_path(self.tree["params"])[0]
        }

    def items(self) -> list[str]:
        """The top-level entries of the saved state (``params``, and ``opt_state`` unless params-only)."""
        return sorted(self.tree)

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {key: tuple(leaf.shape) for key, (_, leaf) in self.leaves.items()}

    def has(self, key: str) -> bool:
        return key in self.leaves

    def dtype(self, key: str) -> np.dtype:
        return np.dtype(self.leaves[key][1].dtype)

    def nbytes(self, key: str) -> int:
        return int(np.prod(self.leaves[key][1].shape, dtype=np.int64)) * self.dtype(key).itemsize

    def read(self, key: str) -> np.ndarray:
        """One parameter, as saved (shape and dtype)."""
        if key not in self.leaves:
            raise InteropError(f"checkpoint {os.path.dirname(self.path)} has no parameter {key}.")
        keys = ("params", *self.leaves[key][0])
        restored = self._restore(_nest(keys, 0), _nest(keys, ocp.RestoreArgs(restore_type=np.ndarray)))
        for k in keys:
            restored = restored[k]
        return np.asarray(restored)

    def read_item(self, name: str) -> Any:
        """A small top-level entry (e.g. the balancing state) as numpy arrays."""
        item = jax.tree.map(lambda _: 0, self.tree[name])
        return self._restore({name: item}, {name: jax.tree.map(
            lambda _: ocp.RestoreArgs(restore_type=np.ndarray), self.tree[name])})[name]

    def _restore(self, item: Any, restore_args: Any) -> Any:
        return self.handler.restore(self.path, args=ocp.args.PyTreeRestore(
            item=item, restore_args=restore_args, partial_restore=True))

    def close(self) -> None:
        self.handler.close()
