"""A trained run, opened for evaluation: its config, a mesh from the local devices, its checkpoints.

The config is the one the checkpoint was trained with (its ``meta`` item; ``WORKDIR/config.json``
for checkpoints written without one), with keys added since then filled from the defaults,
rematerialisation off (it only matters for gradients) and the ``expert_parallel`` backend
replaced by ``dropless``.
Only the parameters and the small balancing state are read, never the optimizer state:
evaluation needs a third of the memory of training.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any

import jax
import ml_collections
import orbax.checkpoint as ocp
from etils import epath

from moejax import config as config_lib
from moejax import sharding
from moejax.config import ConfigDict
from moejax.errors import ConfigError
from moejax.data.dataset import TokenDataset, open_dataset
from moejax.data.tokenizer import Tokenizer, check_tokenizer_matches
from moejax.train.checkpoint import CheckpointMismatch, describe_mismatch, flat_shapes
from moejax.train.state import Run, num_moe_layers, setup


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """One step's parameters and balancing state (objective -> leaves [L, E]; may be empty)."""

    step: int
    params: Any
    balance: dict[str, Any]


@dataclasses.dataclass(frozen=True, eq=False)
class EvalRun:
    """What stays the same across a run's checkpoints."""

    workdir: str
    cfg: ConfigDict
    run: Run  # graphdef, mesh, shardings, balancer
    dataset: TokenDataset
    tokenizer: Tokenizer
    steps: tuple[int, ...]

    @property
    def checkpoint_dir(self) -> str:
        return os.path.join(self.workdir, "checkpoints")

    @property
    def batch_shards(self) -> int:
        """Devices a batch is split over: batch sizes must be multiples of this."""
        return math.prod(self.run.mesh.shape[a] for a in ("data", "fsdp", "expert"))

    def load(self, step: int | None = None) -> Checkpoint:
        """The parameters and balancing state of ``step`` (default: the latest), in the mesh."""
        step = self.steps[-1] if step is None else step
        if step not in self.steps:
            raise ConfigError(f"{self.checkpoint_dir} has no checkpoint at step {step}; steps: {list(self.steps)}.")
        abstract = {"params": self.run.abstract_state["params"]}
        if self.run.abstract_state["balance"]:
            abstract["balance"] = self.run.abstract_state["balance"]
        restored = _restore_state_items(os.path.join(self.checkpoint_dir, str(step)), abstract)
        if "balance" in abstract and "balance" not in restored:  # a params-only checkpoint (an import)
            restored["balance"] = self.run.balancer.init_state(num_moe_layers(self.cfg.model))
        return Checkpoint(step, restored["params"], restored.get("balance", {}))


def open_run(workdir: str) -> EvalRun:
    """Reads the run's config and data description; builds the model on the local devices."""
    checkpoint_dir = os.path.join(workdir, "checkpoints")
    if not os.path.isdir(checkpoint_dir):
        raise ConfigError(f"{checkpoint_dir} does not exist: pass the --workdir of a training run.")
    steps = tuple(sorted(ocp.utils.checkpoint_steps(checkpoint_dir)))  # finished (committed) ones
    if not steps:
        raise ConfigError(f"{workdir} holds no checkpoint (looked in {checkpoint_dir}); train it first.")
    meta = read_meta(os.path.join(checkpoint_dir, str(steps[-1])))
    cfg = eval_config(meta.get("config") or read_config_json(workdir))
    dataset = open_dataset(cfg.data.path, cfg.data.cache_dir or None)
    if "tokenizer" in meta:
        check_tokenizer_matches(
            dataset.tokenizer.name, meta["tokenizer"], data_source=f"data.path={cfg.data.path!r}",
            checkpoint=f"{checkpoint_dir}/{steps[-1]}",
        )
    return EvalRun(os.path.abspath(workdir), cfg, _setup_on_local_devices(cfg), dataset, dataset.tokenizer, steps)


def eval_config(saved: dict[str, Any]) -> ConfigDict:
    """The saved config, with keys it predates filled from the defaults and remat off."""
    cfg = ml_collections.ConfigDict(fill_defaults(saved, config_lib.default_config().to_dict()))
    cfg.train.remat = "none"
    if cfg.model.moe.backend == "expert_parallel":
        # Same experts and routing without the per-device capacity drops, on any mesh and in cached
        # decoding (which runs outside a mesh).
        cfg.model.moe.backend = "dropless"
    return cfg


def fill_defaults(saved: dict, defaults: dict, prefix: str = "") -> dict:
    """``saved`` plus the keys of ``defaults`` it lacks (user-keyed groups such as the mixture are
    taken as saved, never merged)."""
    out = dict(saved)
    for key, value in defaults.items():
        path = prefix + key
        if key not in out:
            out[key] = value
        elif isinstance(value, dict) and isinstance(out[key], dict) and path not in config_lib.FREE_KEYS:
            out[key] = fill_defaults(out[key], value, path + ".")
    return out


def _setup_on_local_devices(cfg: ConfigDict) -> Run:
    """The run's own mesh if the local devices can hold it, else data parallel over as many devices
    as divide the global batch (parameters replicated)."""
    n = jax.device_count()
    try:
        shape = config_lib.resolve_mesh_shape(cfg.mesh, n)
        shards = shape["data"] * shape["fsdp"] * shape["expert"]
        if cfg.train.global_batch_size % shards:
            raise ConfigError(f"batch {cfg.train.global_batch_size} does not split over {shards} devices")
        return setup(cfg, sharding.make_mesh(shape))
    except ConfigError:
        devices = math.gcd(n, cfg.train.global_batch_size)
        shape = {"data": devices, "fsdp": 1, "expert": 1, "tensor": 1}
        return setup(cfg, sharding.make_mesh(shape, jax.devices()[:devices]))


# Reading: each item of a step directory (``state``, ``meta``; see moejax.train.checkpoint) is read
# by its own handler, not through a CheckpointManager: a read-only manager logs warnings about its
# options, and a restore that names some items logs one per item it skips ("Item 'data' was found
# in the checkpoint, but could not be restored"), which read like failures. Only what evaluation
# needs is read: the parameters and the balancing state, never the optimizer state.


def latest_meta(workdir: str) -> dict[str, Any]:
    """The run metadata of a workdir's newest checkpoint; {} if it has none."""
    checkpoint_dir = os.path.join(workdir, "checkpoints")
    if not os.path.isdir(checkpoint_dir):
        return {}
    steps = sorted(ocp.utils.checkpoint_steps(checkpoint_dir))
    return read_meta(os.path.join(checkpoint_dir, str(steps[-1]))) if steps else {}


def read_meta(step_dir: str) -> dict[str, Any]:
    """The run metadata (config, tokenizer id, ...) of one checkpoint; {} if it has none."""
    path = epath.Path(step_dir) / "meta"
    if not path.is_dir():
        return {}
    return ocp.JsonCheckpointHandler().restore(path, args=ocp.args.JsonRestore()) or {}


def _restore_state_items(step_dir: str, abstract: dict[str, Any]) -> dict[str, Any]:
    """The top-level entries of the saved train state named in ``abstract`` (a partial restore),
    into their shardings; the parameters' shapes are checked first, naming every mismatch."""
    path = epath.Path(step_dir) / "state"
    handler = ocp.PyTreeCheckpointHandler()
    try:
        saved = handler.metadata(path)
        saved = getattr(saved, "tree", saved)
        abstract = {k: v for k, v in abstract.items() if k in saved}  # params-only: no balance
        problems = describe_mismatch(flat_shapes(saved["params"]), flat_shapes(abstract["params"]))
        if problems:
            raise CheckpointMismatch(f"checkpoint {step_dir} does not fit the configured model:\n  "
                                     + "\n  ".join(problems[:20]))
        return handler.restore(path, args=ocp.args.PyTreeRestore(
            item=abstract, restore_args=ocp.checkpoint_utils.construct_restore_args(abstract),
            partial_restore=True,
        ))
    finally:
        handler.close()


def read_config_json(workdir: str) -> dict[str, Any]:
    """A workdir's ``config.json`` (for checkpoints that carry no config); ``ConfigError`` if missing."""
    path = os.path.join(workdir, "config.json")
    if not os.path.isfile(path):
        raise ConfigError(f"the checkpoints in {workdir} carry no config and {path} is missing.")
    with open(path) as f:
        return json.load(f)
