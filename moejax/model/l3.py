"""Large Lookup Layer (L3): each token attends, with its hidden state as the one query, over its own
rows of a large key/value table.

Token id t owns rows ``[b_t, b_{t+1})`` of a key table K [r, q] and a value table V [r, w] (tied:
V = K). ``b`` is the allocation ``offsets_v1`` [V + 1] (:mod:`moejax.model.l3_allocation`, where
everything about allocations lives): every token
owns at least one row and at most k (``model.l3.max_rows``), r (``model.l3.budget``) in all. With x
[d] the layer input at a position holding token t, and n_t = b_{t+1} - b_t its row count:

    h   = RMSNorm(x)                  the query (W_q h [q] when key_dim != d_model)
    s_j = K[b_t + j] . h / sqrt(q)     j < n_t: the token's rows only
    a   = softmax_j(s)                 over those n_t scores
    o   = W_up (sum_j a_j V[b_t + j])  [w] -> [u]
    y   = W_mix [RMSNorm(o) ; x]       output "concat", W_mix [u + d, d] = [W_out ; I + W_skip]
    y   = x + W_out RMSNorm(o)         output "residual"

The 1/sqrt(q) scale is the usual dot-product attention scale: with unit-normal table rows and an
RMS-normalised query, scores start with unit variance whatever the key width. The concat form is
stored as W_mix = [W_out ; I + W_skip] with W_skip zero-initialised: the same function family as a
plain W_mix, but at init it equals the residual form (the layer does not scramble the residual
stream of a deep model) and weight decay pulls W_mix towards the identity, not towards zero. The
residual form is the concat form without W_skip (d^2 fewer parameters and FLOPs per token).

Training never builds a [tokens, r] score matrix: each token gathers k row slots ``b_t + j``
(j < k), masks the slots j >= n_t (score -inf, so attention and gradient there are exactly 0;
masked slots read row b_t, never another token's rows) and attends over [B, T, k]. The gather's
transpose, a scatter-add into the table rows, carries the gradient (JAX derives it). Tables are
sharded by rows (logical axis ``l3_rows``, :mod:`moejax.sharding`); they are not weight-decayed
(rows of rare tokens get gradients rarely, decay would erase them in between).

Inference can keep the tables in host memory (:class:`HostTables`): the rows of the tokens in
flight are gathered on the host and only those [B, T, k, q|w] blocks travel to the device, where
:meth:`L3Layer.attend` runs the same math as training.

Dimension letters, in addition to :mod:`moejax.model`'s (b, t, d): r table rows (the budget v),
k row slots per token (max_rows), q key width, w value width, u up-projection width.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.experimental.compute_on import compute_on
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from moejax.errors import ConfigError, fail_config_key
from moejax.model.l3_allocation import RowOffsets, allocation_from_config
from moejax.model.layers import RMSNorm, param
from moejax.sharding import constrain


def check_config(model_cfg, mesh: dict[str, int]) -> None:
    """The L3 knobs against the model and the mesh (``mesh``: the resolved axis sizes): layer
    positions, table sizes against the vocabulary, rows against the mesh, and the allocation file.
    Raises ``ConfigError`` naming the key; part of :func:`moejax.checks.validate`."""
    m, l3 = model_cfg, model_cfg.l3
    positions = l3.after_layers
    if not isinstance(positions, (tuple, list)) or any(isinstance(p, bool) or not isinstance(p, int) for p in positions):
        fail_config_key("model.l3.after_layers", positions, "a tuple of decoder-layer indices, e.g. (1, 3)")
    bad = [p for p in positions if not 0 <= p < m.num_layers]
    if bad:
        fail_config_key("model.l3.after_layers", positions, f"layer indices in [0, {m.num_layers - 1}] "
                        f"(model.num_layers={m.num_layers}); {bad[0]} is not one")
    if len(set(positions)) != len(positions):
        fail_config_key("model.l3.after_layers", positions, "each layer index at most once")
    if l3.max_rows < 1:
        fail_config_key("model.l3.max_rows", l3.max_rows, "an integer >= 1 (the most rows one token owns)")
    for key in ("key_dim", "value_dim", "up_dim"):
        if l3[key] < 0:
            fail_config_key(f"model.l3.{key}", l3[key], "a width >= 0 (0: the default width)")
    if not positions:
        return
    if l3.budget < m.vocab_size:
        fail_config_key("model.l3.budget", l3.budget,
                        f"at least model.vocab_size={m.vocab_size} (every token owns a row)")
    if l3.budget > m.vocab_size * l3.max_rows:
        fail_config_key("model.l3.budget", l3.budget,
                        f"at most model.vocab_size x model.l3.max_rows = {m.vocab_size * l3.max_rows}",
                        f"Raise model.l3.max_rows to at least {math.ceil(l3.budget / m.vocab_size)} or lower the budget.")
    key_width = l3.key_dim or m.d_model
    if l3.tied and l3.value_dim not in (0, key_width):
        fail_config_key("model.l3.value_dim", l3.value_dim, f"0 or the key width {key_width} when model.l3.tied (V = K)")
    shards = mesh["fsdp"] * mesh["expert"]
    if l3.budget % shards:
        fail_config_key("model.l3.budget", l3.budget, f"a multiple of mesh.fsdp x mesh.expert = {shards}",
                        "The tables are split by rows over those axes.")
    try:
        allocation_from_config(m)
    except ConfigError as e:  # DataError from the allocation file or its sizes
        raise ConfigError(f"config key 'model.l3.allocation' has value {l3.allocation!r}: {e}") from None


class L3Rows(NamedTuple):
    """The table rows of the tokens in flight: what :meth:`L3Layer.attend` consumes."""

    keys_btkq: jax.Array
    values_btkw: jax.Array  # the keys themselves when the tables are tied
    mask_btk: jax.Array  # True on the slots j < n_t (the token's own rows)


def row_slots(offsets_v1, tokens_bt, max_rows: int):
    """(row index [B, T, k], mask [B, T, k]) of each token's k slots; numpy in, numpy out (host
    path) or jax in, jax out. Slots past a token's rows are masked and point at its first row."""
    xp = np if isinstance(tokens_bt, np.ndarray) else jnp
    offsets_v1 = xp.asarray(offsets_v1, dtype=xp.int32)
    start_bt = offsets_v1[tokens_bt]
    count_bt = offsets_v1[tokens_bt + 1] - start_bt
    slot_k = xp.arange(max_rows, dtype=xp.int32)
    mask_btk = slot_k < count_bt[..., None]
    return start_bt[..., None] + xp.where(mask_btk, slot_k, 0), mask_btk


def l3_dims(model_cfg) -> tuple[int, int, int]:
    """(key width q, value width w, up width u) with the config's 0 defaults resolved."""
    l3, d = model_cfg.l3, model_cfg.d_model
    key = l3.key_dim or d
    value = key if l3.tied else (l3.value_dim or key)
    return key, value, l3.up_dim or d


def l3_param_counts(model_cfg) -> dict[str, int]:
    """One L3 layer's parameters: ``total``, and ``active`` per token (projections, norms and the
    k rows of keys and values a token reads: k * q tied, k * (q + w) untied)."""
    d, l3 = model_cfg.d_model, model_cfg.l3
    q, w, u = l3_dims(model_cfg)
    dense = (d * q if q != d else 0) + w * u + u * d + (d * d if l3.output == "concat" else 0) + d + u
    tables = q if l3.tied else q + w
    return {"total": dense + l3.budget * tables, "active": dense + l3.max_rows * tables}


def l3_forward_flops(model_cfg) -> float:
    """Forward FLOPs per token of one L3 layer: 2 k (q + w) for scores and the weighted value sum
    (all k slots are computed, masked or not) plus 2 x each projection's parameters."""
    d, l3 = model_cfg.d_model, model_cfg.l3
    q, w, u = l3_dims(model_cfg)
    projections = (d * q if q != d else 0) + w * u + u * d + (d * d if l3.output == "concat" else 0)
    return 2.0 * l3.max_rows * (q + w) + 2.0 * projections


class L3Layer(nnx.Module):
    """``y = W_mix [RMSNorm(o) ; x]`` (or ``x + W_out RMSNorm(o)``) with ``o`` the up-projected
    attention of the token's hidden state over its own table rows; see the module docstring."""

    def __init__(self, cfg, offsets: RowOffsets, *, rngs: nnx.Rngs, dtype, param_dtype):
        l3, d = cfg.l3, cfg.d_model
        q, w, u = l3_dims(cfg)
        out_std = cfg.init_std / math.sqrt(2 * cfg.num_layers)
        self.offsets = offsets
        self.max_rows = l3.max_rows
        self.norm = RMSNorm(d, cfg.norm_eps, param_dtype)
        # A projection only when the key width differs from d; std 1/sqrt(d) keeps the query's RMS at 1.
        self.w_query_dq = param(rngs, (d, q), ("embed", None), 1 / math.sqrt(d), param_dtype) if q != d else None
        self.keys_rq = self._table(rngs, offsets.budget, q, param_dtype)
        self.values_rw = None if l3.tied else self._table(rngs, offsets.budget, w, param_dtype)
        self.w_up_wu = param(rngs, (w, u), (None, "mlp"), cfg.init_std, param_dtype)
        self.out_norm = RMSNorm(u, cfg.norm_eps, param_dtype)
        self.w_out_ud = param(rngs, (u, d), ("mlp", "embed"), out_std, param_dtype)
        self.w_skip_dd = (
            nnx.Param(jnp.zeros((d, d), param_dtype), axes=("embed", None)) if l3.output == "concat" else None
        )
        self.dtype = dtype

    @staticmethod
    def _table(rngs: nnx.Rngs, rows: int, width: int, param_dtype) -> nnx.Param:
        """A unit-normal table [rows, width], sharded by rows, never weight-decayed."""
        value = jax.random.normal(rngs.params(), (rows, width), jnp.float32).astype(param_dtype)
        return nnx.Param(value, axes=("l3_rows", None), decay=False)

    def __call__(self, x_btd: jax.Array, tokens_bt: jax.Array) -> jax.Array:
        return self.attend(x_btd, self.gather(tokens_bt))

    def gather(self, tokens_bt: jax.Array) -> L3Rows:
        """The k row slots of every token from the device tables: [B, T, k, q|w], never [B*T, r]."""
        index_btk, mask_btk = row_slots(self.offsets.offsets_v1, tokens_bt, self.max_rows)
        rows = lambda table: constrain(table[...][index_btk], ("batch", "seq", None, None))
        keys_btkq = rows(self.keys_rq)
        return L3Rows(keys_btkq, keys_btkq if self.values_rw is None else rows(self.values_rw), mask_btk)

    def lookup_from_host(self, x_btd: jax.Array, tokens_bt, host: HostTables) -> jax.Array:
        """The layer with its tables in host memory: fetches the rows of ``tokens_bt`` only
        (eager: the token ids must be concrete), then the same math as :meth:`__call__`."""
        return self.attend(x_btd, host.fetch(tokens_bt))

    def attention(self, x_btd: jax.Array, keys_btkq: jax.Array, mask_btk: jax.Array) -> jax.Array:
        """float32 attention weights [B, T, k] of each token over its row slots (0 where masked)."""
        dt = self.dtype
        h_btd = self.norm(x_btd)
        q_btq = h_btd if self.w_query_dq is None else jnp.einsum("btd,dq->btq", h_btd, self.w_query_dq[...].astype(dt))
        scores_btk = jnp.einsum("btq,btkq->btk", q_btq, keys_btkq.astype(dt)).astype(jnp.float32)
        scores_btk = scores_btk / math.sqrt(keys_btkq.shape[-1])
        return jax.nn.softmax(jnp.where(mask_btk, scores_btk, -jnp.inf), axis=-1)

    def attend(self, x_btd: jax.Array, rows: L3Rows) -> jax.Array:
        """The layer output from the gathered rows (the math shared by training and host lookup)."""
        dt = self.dtype
        probs_btk = self.attention(x_btd, rows.keys_btkq, rows.mask_btk)
        read_btw = jnp.einsum("btk,btkw->btw", probs_btk.astype(dt), rows.values_btkw.astype(dt))
        o_btu = jnp.einsum("btw,wu->btu", read_btw, self.w_up_wu[...].astype(dt))
        y_btd = x_btd + jnp.einsum("btu,ud->btd", self.out_norm(o_btu), self.w_out_ud[...].astype(dt))
        if self.w_skip_dd is not None:
            y_btd = y_btd + x_btd @ self.w_skip_dd[...].astype(dt)
        return constrain(y_btd, ("batch", "seq", "act_embed"))


def host_memory_kind(device: jax.Device) -> str | None:
    """"pinned_host" when ``device`` can address pinned host memory (GPU, TPU, recent CPU
    backends), else None (the tables then stay in plain numpy arrays)."""
    kinds = {memory.kind for memory in device.addressable_memories()}
    return "pinned_host" if "pinned_host" in kinds else None


class HostTables:
    """An L3 layer's tables kept in host memory; :meth:`fetch` moves only the rows of the tokens in
    flight to the device.

    Where the platform has a ``pinned_host`` memory kind, the tables are jax arrays there and the
    row gather runs on the host (``compute_on("device_host")``); otherwise they are numpy arrays
    and numpy gathers. Either way one [B, T, k, q] (and [B, T, k, w]) block is transferred per call.
    """

    def __init__(self, layer: L3Layer, mesh: Mesh):
        self.offsets_v1, self.max_rows = layer.offsets.offsets_v1, layer.max_rows
        self.memory_kind = host_memory_kind(mesh.devices.flat[0])
        self.device = NamedSharding(mesh, P())
        tables = [layer.keys_rq[...]] + ([] if layer.values_rw is None else [layer.values_rw[...]])
        if self.memory_kind is None:
            self.tables = [np.asarray(jax.device_get(table)) for table in tables]
        else:
            self.host = NamedSharding(mesh, P(), memory_kind=self.memory_kind)
            self.tables = [jax.device_put(table, self.host) for table in tables]
            self._gather_on_host = jax.jit(compute_on("device_host")(jax.jit(lambda t, i: t[i])), out_shardings=self.host)

    def fetch(self, tokens_bt) -> L3Rows:
        index_btk, mask_btk = row_slots(self.offsets_v1, np.asarray(tokens_bt), self.max_rows)
        rows = [self._gather(table, index_btk) for table in self.tables]
        return L3Rows(rows[0], rows[-1], jax.device_put(mask_btk, self.device))

    def _gather(self, table, index_btk: np.ndarray) -> jax.Array:
        if self.memory_kind is None:
            return jax.device_put(table[index_btk], self.device)
        rows_host = self._gather_on_host(table, jax.device_put(index_btk, self.host))
        return jax.device_put(rows_host, self.device)
