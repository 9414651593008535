"""MergeMix's merge arithmetic, shared by :mod:`.merge` and :mod:`.batched` (both import it; it
imports neither).

``theta(alpha) = theta_base + sum_k alpha_k (theta_k - theta_base)`` per parameter leaf, with
``theta_k`` stacked on a leading K axis (unsharded; each slice sharded like the base's parameter),
accumulated in float32 (or wider) in the order k = 0..K-1 and cast back to the parameter dtype.
Exact at the vertices: alpha equal to the unit vector e_k returns ``theta_k`` itself and the zero
vector ``theta_base`` (selects on the traced alpha, so one compile serves every alpha; why this
matters: :mod:`.merge`'s docstring). Non-float leaves are the base's.

Router treatments (:data:`ROUTERS`): ``"linear"`` merges every parameter, router included;
``"base"`` keeps the base's router leaves (:func:`is_router_path`) and merges the rest.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

ROUTERS = ("linear", "base")


def is_router_path(path: Sequence[Any]) -> bool:
    """Whether a params-tree path (``jax.tree_util`` keys) lies under a ``router`` key."""
    return any(getattr(k, "key", None) == "router" for k in path)


def stacked_sharding(s: NamedSharding) -> NamedSharding:
    """The sharding of K stacked copies of a parameter sharded like ``s``: leading axis unsharded."""
    return NamedSharding(s.mesh, P(None, *s.spec))


def merge_params(base, stacked_k, alpha_k, *, router: str):
    """The merged parameters ``base + sum_k alpha_k (stacked_k[k] - base)`` (module docstring: the
    exact vertex selects, the router treatments)."""
    num = alpha_k.shape[0]
    is_zero = jnp.all(alpha_k == 0)
    unit = jnp.eye(num, dtype=alpha_k.dtype)
    is_vertex_k = jnp.all(alpha_k[None, :] == unit, axis=1)

    def leaf(path, base_x, stacked_kx):
        if (router == "base" and is_router_path(path)) or not jnp.issubdtype(base_x.dtype, jnp.floating):
            return base_x
        dtype = jnp.promote_types(base_x.dtype, jnp.float32)
        b = base_x.astype(dtype)
        acc = b
        for k in range(num):
            acc = acc + alpha_k[k].astype(dtype) * (stacked_kx[k].astype(dtype) - b)
        out = jnp.where(is_zero, base_x, acc.astype(base_x.dtype))
        for k in range(num):
            out = jnp.where(is_vertex_k[k], stacked_kx[k], out)
        return out

    return jax.tree_util.tree_map_with_path(leaf, base, stacked_k)


def set_slot(stacked_k, params, k):
    """``stacked_k`` with slot ``k`` replaced by ``params`` (cast to the stack's dtypes)."""
    return jax.tree.map(lambda s, x: jax.lax.dynamic_update_index_in_dim(s, x.astype(s.dtype), k, 0), stacked_k, params)
