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

from moejax import config as config_lib
from moejax import sharding
from moejax.config import ConfigError, ConfigDict
from moejax.data.dataset import TokenDataset, open_dataset
from moejax.data.tokenizer import Tokenizer, check_tokenizer_matches
from moejax.train.checkpoint import load_params
from moejax.train.state import Run, setup


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
        params, _ = load_params(self.checkpoint_dir, self.run.abstract_state["params"], step)
        balance = {}
        if self.run.abstract_state["balance"]:
            balance = _restore_subtree(self.checkpoint_dir, step, "balance", self.run.abstract_state["balance"])
        return Checkpoint(step, params, balance)


def open_run(workdir: str) -> EvalRun:
    """Reads the run's config and data description; builds the model on the local devices."""
    checkpoint_dir = os.path.join(workdir, "checkpoints")
    manager = _manager(checkpoint_dir)
    steps = tuple(sorted(manager.all_steps()))
    if not steps:
        raise ConfigError(f"{workdir} holds no checkpoint (looked in {checkpoint_dir}); train it first.")
    meta = manager.restore(steps[-1], args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta or {}
    manager.close()
    cfg = eval_config(meta.get("config") or _read_config_json(workdir))
    dataset = open_dataset(cfg.data.path, cfg.data.cache_dir or None)
    if "tokenizer" in meta:
        check_tokenizer_matches(
            dataset.tokenizer.name, meta["tokenizer"], data_source=f"data.path={cfg.data.path!r}",
            checkpoint=f"{checkpoint_dir}/{steps[-1]}",
        )
    return EvalRun(os.path.abspath(workdir), cfg, _setup_on_local_devices(cfg), dataset, dataset.tokenizer, steps)


def eval_config(saved: dict[str, Any]) -> ConfigDict:
    """The saved config, with keys it predates filled from the defaults and remat off."""
    cfg = ml_collections.ConfigDict(_fill_defaults(saved, config_lib.default_config().to_dict()))
    cfg.train.remat = "none"
    if cfg.model.moe.backend == "expert_parallel":
        # Same experts and routing without the per-device capacity drops, on any mesh and in cached
        # decoding (which runs outside a mesh).
        cfg.model.moe.backend = "dropless"
    return cfg


def _fill_defaults(saved: dict, defaults: dict, prefix: str = "") -> dict:
    """``saved`` plus the keys of ``defaults`` it lacks (user-keyed groups such as the mixture are
    taken as saved, never merged)."""
    out = dict(saved)
    for key, value in defaults.items():
        path = prefix + key
        if key not in out:
            out[key] = value
        elif isinstance(value, dict) and isinstance(out[key], dict) and path not in config_lib.FREE_KEYS:
            out[key] = _fill_defaults(out[key], value, path + ".")
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


def _manager(checkpoint_dir: str) -> ocp.CheckpointManager:
    if not os.path.isdir(checkpoint_dir):
        raise ConfigError(f"{checkpoint_dir} does not exist: pass the --workdir of a training run.")
    return ocp.CheckpointManager(
        checkpoint_dir, options=ocp.CheckpointManagerOptions(read_only=True),
        item_handlers={"meta": ocp.JsonCheckpointHandler(), "state": ocp.PyTreeCheckpointHandler()},
    )


def _restore_subtree(checkpoint_dir: str, step: int, key: str, abstract: Any) -> Any:
    """One top-level entry of the saved train state (a partial restore), into its shardings."""
    manager = _manager(checkpoint_dir)
    target = {key: abstract}
    restored = manager.restore(step, args=ocp.args.Composite(state=ocp.args.PyTreeRestore(
        item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target), partial_restore=True,
    )))
    manager.close()
    return restored.state[key]


def _read_config_json(workdir: str) -> dict[str, Any]:
    path = os.path.join(workdir, "config.json")
    if not os.path.isfile(path):
        raise ConfigError(f"the checkpoints in {workdir} carry no config and {path} is missing.")
    with open(path) as f:
        return json.load(f)
