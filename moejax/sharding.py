"""Mesh from config, the logical-axis rules table, and sharding helpers.

Parameters carry logical axis names as ``nnx.Param(..., axes=(...))`` metadata; activations are
constrained with :func:`constrain`. :data:`RULES` is the one table that maps logical names to mesh
axes; change the parallelism strategy by editing it, not the model.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from moejax.config import MESH_AXES
from moejax.errors import ConfigError

# Logical axis name -> mesh axis (or tuple of mesh axes, or None for replicated).
RULES: dict[str, str | tuple[str, ...] | None] = {
    # activations
    "batch": ("data", "fsdp", "expert"),
    "seq": None,
    "act_embed": None,
    "act_heads": "tensor",
    "act_mlp": "tensor",
    # parameters
    "embed": "fsdp",
    "vocab": "tensor",
    "heads": "tensor",
    "kv_heads": "tensor",
    "head_dim": None,
    "mlp": "tensor",
    "experts": "expert",
    "expert_mlp": "tensor",
    "router_experts": None,
    "norm": None,
    "layers": None,  # the stacked-layers axis of scanned blocks (moejax.model.transformer)
    # L3 table rows (moejax.model.l3): split over the parameter-sharding axes, like fsdp weights;
    # each device gathers its tokens' rows from the shards by a masked local gather + all-reduce
    # (GSPMD), the table itself is never all-gathered. model.l3.budget must divide fsdp x expert.
    "l3_rows": ("fsdp", "expert"),
}


def make_mesh(shape: dict[str, int], devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A mesh with axes (data, fsdp, expert, tensor) of the given sizes over ``devices``."""
    devices = list(jax.devices() if devices is None else devices)
    sizes = tuple(shape[axis] for axis in MESH_AXES)
    if math.prod(sizes) != len(devices):
        raise ConfigError(f"mesh {shape} needs {math.prod(sizes)} devices, got {len(devices)}")
    device_grid = np.asarray(devices).reshape(sizes)
    return Mesh(device_grid, MESH_AXES)


def logical_to_spec(axes: Sequence[str | None]) -> P:
    """PartitionSpec for a tuple of logical axis names, through :data:`RULES`."""
    return P(*(None if name is None else RULES[name] for name in axes))


def constrain(x: jax.Array, axes: Sequence[str | None]) -> jax.Array:
    """Sharding constraint by logical names; a no-op when no mesh is set (e.g. eager tests)."""
    if jax.sharding.get_abstract_mesh().empty:
        return x
    return jax.lax.with_sharding_constraint(x, logical_to_spec(axes))


def param_specs(abstract_state: Any) -> Any:
    """PartitionSpec tree (pure-dict shaped) from the ``axes`` metadata of an nnx.State."""
    from flax import nnx

    def spec(variable: nnx.Variable) -> P:
        axes = variable.get_metadata().get("axes")
        return P() if axes is None else logical_to_spec(axes)

    specs = jax.tree.map(spec, abstract_state, is_leaf=lambda v: isinstance(v, nnx.Variable))
    return nnx.to_pure_dict(specs)


def check_divisible(shapes: Any, specs: Any, mesh: Mesh) -> None:
    """Every sharded dimension must divide evenly over its mesh axes; name the parameter if not."""
    flat_shapes = jax.tree_util.tree_flatten_with_path(shapes)[0]
    flat_specs = jax.tree.leaves(specs, is_leaf=lambda s: isinstance(s, P))
    for (path, leaf), spec in zip(flat_shapes, flat_specs):
        for dim, (size, axes) in enumerate(zip(leaf.shape, spec)):
            if axes is None:
                continue
            axes = (axes,) if isinstance(axes, str) else axes
            ways = math.prod(mesh.shape[a] for a in axes)
            if size % ways:
                name = jax.tree_util.keystr(path)
                raise ConfigError(
                    f"parameter {name} has dimension {dim} of size {size}, which cannot be split "
                    f"{ways} ways over mesh axes {axes}. Change the model size or the mesh "
                    f"(mesh.{' / mesh.'.join(axes)})."
                )


def named(mesh: Mesh, specs: Any) -> Any:
    """NamedSharding tree from a PartitionSpec tree."""
    return jax.tree.map(lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda s: isinstance(s, P))
