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
import logging
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
from moejax.eval.forward import Scorer
from moejax.eval.generator import Generator
from moejax.model.balancing import Balancer
from moejax.train.checkpoint import CheckpointMismatch, describe_mismatch, flat_shapes
from moejax.train.checkpoint_damage import quiet_closed_loop_callbacks, unreadable_reason
from moejax.train.state import Run, num_moe_layers, setup

log = logging.getLogger(__name__)


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

    # The one place a restored run's jitted functions are built (the evaluation, ``moejax.load``,
    # ``python -m moejax.generate`` and lm-eval all take them from here). ``balancer`` replaces the
    # run's balancing objectives (e.g. with an expert mask); the checkpoint's ``balance`` must then
    # hold its state.

    def scorer(self, balancer: Balancer | None = None) -> Scorer:
        """The jitted scoring forward: per-row summed log-probabilities and routing statistics."""
        return Scorer(self.run, self.run.balancer if balancer is None else balancer, self.cfg.model.moe.num_experts)

    def generator(self, max_len: int, balancer: Balancer | None = None) -> Generator:
        """The KV-cache generator over ``max_len`` positions, never picking an id past the tokenizer."""
        return Generator(self.run, self.cfg, max_len=max_len, num_tokens=self.tokenizer.vocab_size,
                         balancer=self.run.balancer if balancer is None else balancer)

    def load(self, step: int | None = None) -> Checkpoint:
        """The parameters and balancing state of ``step``, in the mesh. Default: the newest
        checkpoint that reads (a damaged newer one is reported in one notice and skipped, as
        training's resume does); a damaged ``step`` asked for by number is a ``ConfigError``."""
        quiet_closed_loop_callbacks()  # a failed read's late reports would bury the notice
        if step is None:
            return self._load_newest_readable()
        if step not in self.steps:
            raise ConfigError(f"{self.checkpoint_dir} has no checkpoint at step {step}; steps: {list(self.steps)}.")
        try:
            return self._load(step)
        except CheckpointMismatch:
            raise
        except Exception as e:  # noqa: BLE001 - any read failure means a damaged checkpoint
            others = [s for s in self.steps if s != step]
            raise ConfigError(
                f"checkpoint {self.checkpoint_dir}/{step} is damaged: {unreadable_reason(self._step_dir(step), e)}. "
                + (f"Choose another --step (steps: {others})." if others else "It is the only checkpoint; train again.")
            ) from None

    def _load_newest_readable(self) -> Checkpoint:
        damaged: list[tuple[int, str]] = []
        for step in reversed(self.steps):
            try:
                ckpt = self._load(step)
            except CheckpointMismatch:
                raise
            except Exception as e:  # noqa: BLE001 - any read failure means a damaged checkpoint
                damaged.append((step, unreadable_reason(self._step_dir(step), e)))
                continue
            if damaged:
                log.warning(damaged_notice(self.checkpoint_dir, damaged, used=step))
            return ckpt
        raise ConfigError(f"no checkpoint in {self.checkpoint_dir} can be read: "
                          + "; ".join(f"step {s}: {why}" for s, why in damaged) + ". Train the run again.")

    def _step_dir(self, step: int) -> str:
        return os.path.join(self.checkpoint_dir, str(step))

    def _load(self, step: int) -> Checkpoint:
        abstract = {"params": self.run.abstract_state["params"]}
        if self.run.abstract_state["balance"]:
            abstract["balance"] = self.run.abstract_state["balance"]
        restored = _restore_state_items(os.path.join(self.checkpoint_dir, str(step)), abstract)
        if "balance" in abstract and "balance" not in restored:  # a params-only checkpoint (an import)
            restored["balance"] = self.run.balancer.init_state(num_moe_layers(self.cfg.model))
        return Checkpoint(step, restored["params"], restored.get("balance", {}))


def damaged_notice(checkpoint_dir: str, damaged: list[tuple[int, str]], *, used: int) -> str:
    """The one notice a reader gives for the damaged newest checkpoints it skipped."""
    lines = [f"moejax: the latest checkpoint{'s' if len(damaged) > 1 else ''} of {checkpoint_dir} "
             f"{'are' if len(damaged) > 1 else 'is'} damaged; using step {used}, the newest that reads "
             "(pass --step N to choose another):"]
    lines += [f"  step {step}: {why}" for step, why in damaged]
    return "\n".join(lines)


def open_run(workdir: str) -> EvalRun:
    """Reads the run's config and data description; builds the model on the local devices."""
    checkpoint_dir = os.path.join(workdir, "checkpoints")
    if not os.path.isdir(checkpoint_dir):
        raise ConfigError(f"{checkpoint_dir} does not exist: pass the --workdir of a training run.")
    steps = tuple(sorted(ocp.utils.checkpoint_steps(checkpoint_dir)))  # finished (committed) ones
    if not steps:
        raise ConfigError(f"{workdir} holds no checkpoint (looked in {checkpoint_dir}); train it first.")
    meta_step, meta = newest_meta(checkpoint_dir, steps)
    cfg = eval_config(meta.get("config") or read_config_json(workdir))
    dataset = open_dataset(cfg.data.path, cfg.data.cache_dir or None)
    if "tokenizer" in meta:
        check_tokenizer_matches(
            dataset.tokenizer.name, meta["tokenizer"], data_source=f"data.path={cfg.data.path!r}",
            checkpoint=f"{checkpoint_dir}/{meta_step}",
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


def newest_meta(checkpoint_dir: str, steps: tuple[int, ...]) -> tuple[int, dict[str, Any]]:
    """(step, metadata) of the newest checkpoint whose metadata reads ({} where none has any); a
    damaged one is passed over here and reported when its parameters are read."""
    for step in reversed(steps):
        try:
            return step, read_meta(os.path.join(checkpoint_dir, str(step)))
        except Exception:  # noqa: BLE001 - damaged: an older checkpoint says the same
            continue
    return steps[-1], {}


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
