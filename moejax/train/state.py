"""The train state as a pure pytree, initialised directly sharded.

The model is an NNX module; the state that flows through the jitted step is its parameters as a
pure dict (``nnx.to_pure_dict``), so optax, orbax and ``jax.jit`` see plain arrays. The graph
definition (``graphdef``) rebuilds the module inside the step with ``nnx.merge``.

State keys: ``params``; ``opt_state``; ``step``; ``balance``, the balancing objectives' state
(:mod:`moejax.model.balancing`: objective -> leaves float32 [L, E] over the L MoE layers, not
parameters, so no optimizer or weight decay touches them); ``routing_health``, the running
expert loads behind the global routing metrics (:mod:`moejax.train.metrics`). The last two are
small and replicated on every device; all of it is checkpointed.

The L3 row allocation (:class:`~moejax.model.l3.RowOffsets`) is loaded once by :func:`setup`,
held by the graph (not a parameter: no optimizer state, not in the checkpointed state) and
recorded by its sha256 and method in each checkpoint's metadata (:meth:`Run.l3_meta`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from moejax import sharding
from moejax.errors import ConfigError
from moejax.model.balancing import Balancer, balancer_from_config
from moejax.model.l3_allocation import RowOffsets, allocation_from_config
from moejax.model.transformer import Transformer, is_moe_layer
from moejax.schema import ModelConfig
from moejax.train.metrics import init_routing_health
from moejax.train.optim import decay_mask, make_optimizer

BATCH_KEYS = ("inputs", "targets", "segment_ids", "positions", "loss_mask")


def make_model(cfg, seed: int, l3_offsets: RowOffsets | None = None) -> Transformer:
    """The model of ``cfg`` with parameters seeded by ``seed`` and the L3 allocation ``l3_offsets``
    (:func:`setup` loads it once; None: the model loads the configured one, if it has L3 layers)."""
    t = cfg.train
    return Transformer(
        ModelConfig.from_config(cfg.model), rngs=nnx.Rngs(seed), compute_dtype=t.compute_dtype, param_dtype=t.param_dtype, remat=t.remat,
        scan_layers=t.scan_layers,
        l3_offsets=l3_offsets,
    )


@dataclasses.dataclass(frozen=True)
class Run:
    """Everything static about a run: model graph, optimizer, mesh and the shardings of the state."""

    graphdef: Any
    optimizer: optax.GradientTransformation
    schedule: optax.Schedule
    mesh: Mesh
    state_shardings: Any
    abstract_state: Any  # jax.ShapeDtypeStruct tree with shardings (restore target)
    balancer: Balancer  # the configured balancing objectives (static)
    num_moe_layers: int
    l3_offsets: RowOffsets | None = None  # the L3 row allocation the graph holds; None: no L3 layers

    def l3_meta(self) -> dict[str, str] | None:
        """The L3 allocation's identity for checkpoint metadata: {"sha256", "method"}, or None."""
        return None if self.l3_offsets is None else self.l3_offsets.meta()

    def batch_sharding(self, accum: bool) -> NamedSharding:
        """[A, B/A, ...] micro-batched training batches, or [B, ...] evaluation batches."""
        batch_axes = sharding.RULES["batch"]
        return NamedSharding(self.mesh, P(None, batch_axes) if accum else P(batch_axes))


def routing_state(cfg, balancer: Balancer) -> dict[str, Any]:
    """The initial ``balance`` and ``routing_health`` entries of the train state."""
    num_moe = num_moe_layers(cfg.model)
    return {
        "balance": balancer.init_state(num_moe) if num_moe else {},  # no empty arrays to save
        "routing_health": init_routing_health(num_moe, cfg.model.moe.num_experts),
    }


def num_moe_layers(model_cfg) -> int:
    return sum(is_moe_layer(model_cfg, layer) for layer in range(model_cfg.num_layers))


def setup(cfg, mesh: Mesh) -> Run:
    """Builds the abstract model and state, checks the shardings divide, and makes the optimizer."""
    l3_offsets = allocation_from_config(cfg.model) if cfg.model.l3.after_layers else None
    abstract_model = nnx.eval_shape(lambda: make_model(cfg, 0, l3_offsets))
    graphdef, abstract_params = nnx.split(abstract_model)
    param_specs = sharding.param_specs(abstract_params)
    param_shapes = nnx.to_pure_dict(abstract_params)
    sharding.check_divisible(param_shapes, param_specs, mesh)
    optimizer, schedule = make_optimizer(cfg.optim, cfg.train.steps, decay_mask(abstract_params))

    param_shardings = sharding.named(mesh, param_specs)
    replicated = NamedSharding(mesh, P())
    opt_shapes = jax.eval_shape(optimizer.init, param_shapes)
    opt_shardings = optax.tree_map_params(
        optimizer, lambda _, s: s, opt_shapes, param_shardings,
        transform_non_params=lambda _: replicated, is_leaf=lambda x: isinstance(x, NamedSharding),
    )
    balancer = balancer_from_config(cfg)
    routing_shapes = jax.eval_shape(lambda: routing_state(cfg, balancer))
    shardings = {
        "params": param_shardings, "opt_state": opt_shardings, "step": replicated,
        **jax.tree.map(lambda _: replicated, routing_shapes),
    }
    shapes = {
        "params": param_shapes, "opt_state": opt_shapes, "step": jax.ShapeDtypeStruct((), jnp.int32),
        **routing_shapes,
    }
    abstract_state = jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), shapes, shardings
    )
    return Run(
        graphdef, optimizer, schedule, mesh, shardings, abstract_state, balancer, num_moe_layers(cfg.model), l3_offsets
    )


def check_l3_allocation_matches(run: Run, saved_meta: dict, checkpoint: str) -> None:
    """Refuses to resume ``checkpoint`` (metadata ``saved_meta``) under another L3 allocation: the
    same parameter shapes with other rows per token would silently give rows to other tokens."""
    saved, current = saved_meta.get("l3_allocation"), run.l3_meta()
    if saved == current:
        return
    describe = lambda meta: "none" if meta is None else f"{meta['method']}, sha256 {meta['sha256']}"
    raise ConfigError(
        f"checkpoint {checkpoint} was trained with the L3 allocation ({describe(saved)}), but this run "
        f"configures ({describe(current)}). Set model.l3.allocation (and budget, max_rows) to the "
        "allocation the checkpoint was trained with, or train in a new workdir."
    )


def make_init(cfg, run: Run):
    """The jitted ``init(seed)`` (seed static) of the whole train state, directly into its
    shardings (no host copy). One jitted function per run, so a compile ahead of the call
    (:mod:`moejax.train.precompile`) is the one the call finds."""

    def init(seed):
        params = nnx.to_pure_dict(nnx.state(make_model(cfg, seed, run.l3_offsets)))
        return {
            "params": params, "opt_state": run.optimizer.init(params), "step": jnp.zeros((), jnp.int32),
            **routing_state(cfg, run.balancer),
        }

    return jax.jit(init, static_argnums=0, out_shardings=run.state_shardings)


def init_state(cfg, run: Run, init=None) -> dict[str, Any]:
    """Initialises the whole train state directly into its shardings, with ``init`` (from
    :func:`make_init`; a new one if None)."""
    with jax.set_mesh(run.mesh):
        return (init or make_init(cfg, run))(cfg.train.seed)


def abstract_batch(target: NamedSharding, global_batch_size: int, micro_batches: int | None, seq_len: int):
    """The shapes, dtypes and sharding of the global batches :func:`to_global` builds (the fields
    of :mod:`moejax.data.packing`): what a train or eval step is compiled for ahead of its data."""
    shape = (*batch_shape(global_batch_size, micro_batches), seq_len)
    return {
        key: jax.ShapeDtypeStruct(shape, jnp.float32 if key == "loss_mask" else jnp.int32, sharding=target)
        for key in BATCH_KEYS
    }


def batch_shape(global_batch_size: int, micro_batches: int | None) -> tuple[int, ...]:
    """Leading dims of a global batch: [B], or [A, B/A] micro-batches for gradient accumulation."""
    if micro_batches is None:
        return (global_batch_size,)
    return (micro_batches, global_batch_size // micro_batches)


def process_rows(target: NamedSharding, global_batch_size: int, micro_batches: int | None) -> np.ndarray:
    """The global batch rows (increasing) that this process's devices hold: the rows it loads.

    Read from the sharding, not assumed from the process index, so any device order or mesh
    works: a process whose devices hold one block of the batch loads that block; processes that
    replicate the batch (e.g. a ``tensor`` axis across hosts) load the same rows. With micro-batches
    (global rows ``[a * B/A, (a + 1) * B/A)`` form micro-batch ``a``, whatever the process count)
    a process holds the same columns of every micro-batch, so its rows are a strided set.
    """
    shape = batch_shape(global_batch_size, micro_batches)
    batch_dim = len(shape) - 1
    held = np.zeros(shape[batch_dim], bool)
    for index in target.addressable_devices_indices_map(shape).values():
        held[index[batch_dim]] = True
    columns = np.flatnonzero(held)
    if micro_batches is None:
        return columns
    return (np.arange(micro_batches)[:, None] * shape[1] + columns[None, :]).reshape(-1)


def to_global(
    batch: dict[str, np.ndarray], target: NamedSharding, micro_batches: int | None,
    global_batch_size: int | None = None,
) -> dict[str, jax.Array]:
    """This process's rows of a batch -> global arrays; each process places only its own shards.

    ``batch`` holds the rows ``process_rows(target, global_batch_size, micro_batches)`` names, in
    that order; on one process (``global_batch_size`` None) it is the whole batch. With
    ``micro_batches`` the batch dim becomes [A, B/A] for gradient accumulation.
    """
    out = {}
    for key in BATCH_KEYS:
        local = batch[key]
        shape = batch_shape(global_batch_size or local.shape[0], micro_batches)
        if micro_batches is not None:
            local = local.reshape(micro_batches, -1, *local.shape[1:])
        out[key] = jax.make_array_from_process_local_data(target, local, (*shape, *local.shape[len(shape):]))
    return out
