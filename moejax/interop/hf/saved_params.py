"""Params-only moejax checkpoints: written from numpy parameters without copying them (an import),
and read one parameter at a time (an export: orbax partial restores into numpy, or a parameter
indexed part by part straight from its tensorstore array), so neither holds a whole train state:
no optimizer state is made or read, and every parameter keeps the dtype it was saved in.

The layout is the train checkpoint's (``checkpoints/<step>/{state,data,meta}``, see
``moejax.train.checkpoint``) with ``state`` = ``{"params": ...}``: ``load_params``
(``checkpoint.init_from``) and evaluation read it; resuming it is refused by name.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
import tensorstore as ts
from etils import epath

from moejax.interop.hf.errors import InteropError


def write_params_checkpoint(directory: str, step: int, params: Any, data: dict, meta: dict) -> None:
    """Saves ``{"params": params}`` (numpy arrays) with the data and meta items of a train checkpoint.

    orbax deep-copies numpy arrays before an asynchronous save by default, which would double the
    memory; these arrays are never modified, so they are written from where they are.
    """
    registry = ocp.type_handlers.create_type_handler_registry(
        (np.ndarray, ocp.type_handlers.NumpyHandler(deepcopy_host_arrays=False)),
        (jax.Array, ocp.type_handlers.ArrayHandler()),  # unused; without it orbax warns
    )
    handlers = {"state": ocp.PyTreeCheckpointHandler(type_handler_registry=registry, use_compression=False),
                "data": ocp.JsonCheckpointHandler(), "meta": ocp.JsonCheckpointHandler()}
    manager = ocp.CheckpointManager(os.path.abspath(directory), item_handlers=handlers,
                                    options=ocp.CheckpointManagerOptions(create=True))
    try:
        manager.save(step, args=ocp.args.Composite(
            state=ocp.args.PyTreeSave({"params": params}), data=ocp.args.JsonSave(data),
            meta=ocp.args.JsonSave(meta)), force=True)
        manager.wait_until_finished()
    finally:
        manager.close()


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
        self.use_zarr3 = bool(getattr(metadata, "use_zarr3", False))
        self.use_ocdbt = ocp.type_handlers.is_ocdbt_checkpoint(self.path)
        self.context = ocp.type_handlers.get_ts_context(use_ocdbt=self.use_ocdbt)  # shared OCDBT node cache
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

    def view(self, key: str) -> SavedArray:
        """One parameter to be read part by part (``view(key)[i, j]``), holding it once; see
        :class:`SavedArray`."""
        if key not in self.leaves:
            raise InteropError(f"checkpoint {os.path.dirname(self.path)} has no parameter {key}.")
        leaf = self.leaves[key][1]
        # The decoded chunks go to a cache of their own, larger than the parameter, so none is
        # evicted (and decoded again) while the parameter is read; it goes when the view does.
        context = ts.Context(ts.Context.Spec({"cache_pool": {"total_bytes_limit": 2 * self.nbytes(key) + 2**20}}),
                             parent=self.context)
        info = ocp.type_handlers.ParamInfo(name=leaf.name, parent_dir=epath.Path(leaf.directory),
                                           use_zarr3=self.use_zarr3, is_ocdbt_checkpoint=self.use_ocdbt,
                                           ts_context=context)
        spec = ocp.type_handlers.get_json_tspec_read(info, use_ocdbt=self.use_ocdbt)
        store = ts.open(ts.Spec(spec), open=True, read=True, context=context).result()
        if tuple(store.shape) != tuple(leaf.shape) or np.dtype(store.dtype.numpy_dtype) != self.dtype(key):
            raise InteropError(f"checkpoint {os.path.dirname(self.path)}: parameter {key} is stored as "
                               f"{store.dtype.name}{list(store.shape)}; its metadata says {self.dtype(key)}{list(leaf.shape)}.")
        return SavedArray(store)

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


class SavedArray:
    """One saved parameter, read by indexing (``array[i, j]``: a numpy array of that part).

    A whole read (:meth:`SavedParams.read`) holds the parameter twice at its peak: tensorstore's
    decoded chunk and the array it is copied into. Here each chunk is decoded once into a cache
    that lives as long as this object, and each index copies only its part out, so reading a
    stacked parameter one HF tensor at a time holds it once, plus one part.
    """

    def __init__(self, store: ts.TensorStore):
        self.store = store
        self.shape = tuple(store.shape)
        self.dtype = np.dtype(store.dtype.numpy_dtype)

    def __getitem__(self, index: Any) -> np.ndarray:
        return np.asarray(self.store[index].read().result())
