"""Decoder-only MoE transformer: embeddings, pre-norm blocks (attention + MLP or MoE), optional
Large Lookup Layers between blocks (``model.l3.after_layers``), output head."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from flax import nnx

from moejax.model.decode import KVCache
from moejax.model.l3 import L3Layer, L3Rows, l3_forward_flops, l3_param_counts
from moejax.model.l3_allocation import RowOffsets, allocation_from_config
from moejax.model.layers import MLP, Attention, RMSNorm, linear, param
from moejax.model.moe import MoE
from moejax.schema import ModelConfig
from moejax.sharding import constrain

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
# What an MoE layer returns per token (MoE.__call__): kept only when the Transformer is called
# with_routing, so training never holds it.
PER_TOKEN_AUX = ("routing", "router_input")


def is_moe_layer(cfg, layer: int) -> bool:
    """First ``first_k_dense`` layers are dense; after them every ``moe_every``-th layer is MoE."""
    return layer >= cfg.first_k_dense and (layer - cfg.first_k_dense) % cfg.moe_every == 0


# Rematerialisation (activation checkpointing) per block: which intermediates the backward pass
# keeps instead of recomputing. "none" keeps everything (fastest, most memory); "full" keeps only
# each block's input and recomputes the block (least memory, about one extra forward);
# "save_dots" keeps the outputs of the weight matmuls without batch dimensions (projections,
# dense MLP) and recomputes the elementwise work, attention and expert dispatch in between.
REMAT_POLICIES = {
    "none": None,
    "full": jax.checkpoint_policies.nothing_saveable,
    "save_dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


def layer_runs(cfg) -> list[tuple[bool, int]]:
    """The layers as runs of one kind, in depth order: [(is_moe, number of layers), ...].

    A run never crosses an L3 position: a run ends at every layer that an L3 layer follows. With
    per-layer expert counts (``model.moe.layer_experts``, a pruned model) a run also ends where
    the count changes, so each run stacks experts of one shape (:func:`run_experts`).
    """
    runs: list[list] = []
    counts = layer_expert_counts(cfg)
    for layer in range(cfg.num_layers):
        moe = is_moe_layer(cfg, layer)
        if (runs and runs[-1][0] == moe and layer - 1 not in cfg.l3.after_layers
                and counts[layer] == counts[layer - 1]):
            runs[-1][1] += 1
        else:
            runs.append([moe, 1])
    return [(moe, count) for moe, count in runs]


def layer_expert_counts(cfg) -> list[int]:
    """Routed experts of every decoder layer, in depth order (0 for a dense layer)."""
    counts, moe_layer = [], 0
    per_layer = tuple(cfg.moe.get("layer_experts", ()) if hasattr(cfg.moe, "get") else cfg.moe.layer_experts)
    for layer in range(cfg.num_layers):
        if is_moe_layer(cfg, layer):
            counts.append(per_layer[moe_layer] if per_layer else cfg.moe.num_experts)
            moe_layer += 1
        else:
            counts.append(0)
    return counts


def run_experts(cfg) -> list[int]:
    """Routed experts of each run of :func:`layer_runs` (0 for a dense run)."""
    counts, out, layer = layer_expert_counts(cfg), [], 0
    for _, count in layer_runs(cfg):
        out.append(counts[layer])
        layer += count
    return out


class Block(nnx.Module):
    """Pre-norm attention, then a dense MLP or an MoE, each added to the residual stream."""

    def __init__(self, cfg: ModelConfig, is_moe: bool, *, rngs: nnx.Rngs, dtype, param_dtype):
        out_std = cfg.init_std / math.sqrt(2 * cfg.num_layers)
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps, param_dtype)
        self.attn = Attention(cfg, out_std=out_std, **kw)
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps, param_dtype)
        self.is_moe = is_moe
        if self.is_moe:
            self.mlp = MoE(cfg.d_model, cfg.moe, std=cfg.init_std, out_std=out_std, **kw)
        else:
            self.mlp = MLP(cfg.d_model, cfg.mlp_dim, std=cfg.init_std, out_std=out_std, **kw)

    def __call__(self, x_btd, positions_bt, segment_ids_bt, balancer=None, balance_state=None):
        x_btd = x_btd + self.attn(self.attn_norm(x_btd), positions_bt, segment_ids_bt)
        h_btd = self.mlp_norm(x_btd)
        if self.is_moe:
            y_btd, aux = self.mlp(h_btd, balancer, balance_state)
        else:
            y_btd, aux = self.mlp(h_btd), None
        x_btd = constrain(x_btd + y_btd, ("batch", "seq", "act_embed"))
        return x_btd, aux

    def decode(self, x_btd, k_bskh, v_bskh, index_b, balancer=None, balance_state=None):
        """``__call__`` over a key/value cache (see ``Attention.decode``); returns x and the cache."""
        attn_btd, k_bskh, v_bskh = self.attn.decode(self.attn_norm(x_btd), k_bskh, v_bskh, index_b)
        x_btd = x_btd + attn_btd
        h_btd = self.mlp_norm(x_btd)
        y_btd = self.mlp(h_btd, balancer, balance_state)[0] if self.is_moe else self.mlp(h_btd)
        return x_btd + y_btd, k_bskh, v_bskh


def stacked_blocks(cfg: ModelConfig, is_moe: bool, count: int, *, rngs: nnx.Rngs, dtype, param_dtype) -> Block:
    """``count`` blocks of one kind as one Block whose parameters have a leading "layers" axis."""

    @nnx.split_rngs(splits=count)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def make(rngs):
        return Block(cfg, is_moe, rngs=rngs, dtype=dtype, param_dtype=param_dtype)

    blocks = make(rngs)
    for _, variable in nnx.iter_graph(blocks):
        if isinstance(variable, nnx.Param):
            variable.set_metadata(axes=("layers", *variable.get_metadata()["axes"]))
    return blocks


class Transformer(nnx.Module):
    """Returns float32 logits [B, T, V] and auxiliary outputs stacked over the L MoE layers.

    Consecutive layers of one kind (dense or MoE, see :func:`layer_runs`) are stored stacked
    (parameters [n_layers, ...] under ``layers/<run>/``) and applied with ``nnx.scan``: the step
    compiles one body per run whatever the depth, and rematerialisation (``remat``, see
    :data:`REMAT_POLICIES`) bounds the activations kept for the backward pass to the scan carry.

    ``balancer`` (static) and ``balance_state`` (its state, leaves [L, E]) apply the balancing
    objectives: MoE layer l gets ``balance_state`` sliced at l. Without them, no objective applies.
    Auxiliary outputs (float32): ``load_le`` (assignment fractions), ``pbar_le`` (mean routing
    probabilities), ``drop_rate_l``, ``llep_engaged_l`` (with ``ep_balance="llep"`` only),
    ``entropy_l`` (mean per-token routing entropy),
    ``balance_losses`` (objective -> loss summed over layers) and their sum ``balance_loss``.

    L3 layers (:class:`~moejax.model.l3.L3Layer`, parameters under ``l3/<i>/``) follow the
    decoder layers listed in ``cfg.l3.after_layers`` (sorted); they read the token ids. Their
    row allocation ``l3_offsets`` is static (part of the graph, not a parameter); without it the
    configured one is loaded (:func:`~moejax.model.l3_allocation.allocation_from_config`).

    ``cfg`` is the typed :class:`~moejax.schema.ModelConfig` (``ModelConfig.from_config(cfg.model)``);
    :func:`param_counts`, :func:`flops_per_token` and :func:`layer_runs` read either it or the
    ``model`` group of the ConfigDict.
    """

    def __init__(
        self, cfg: ModelConfig, *, rngs: nnx.Rngs, compute_dtype: str = "float32", param_dtype: str = "float32",
        remat: str = "none", scan_layers: bool = True, l3_offsets: RowOffsets | None = None,
    ):
        if not isinstance(cfg, ModelConfig):
            raise TypeError(f"Transformer takes a ModelConfig, got {type(cfg).__name__}; convert the config's "
                            "model group once: Transformer(ModelConfig.from_config(cfg.model), ...)")
        dtype, pdtype = DTYPES[compute_dtype], DTYPES[param_dtype]
        self.embed_vd = param(rngs, (cfg.vocab_size, cfg.d_model), ("vocab", "embed"), cfg.init_std, pdtype)
        self.runs = tuple(layer_runs(cfg))
        self.run_experts = tuple(run_experts(cfg))
        self.layers = nnx.List([
            stacked_blocks(_with_experts(cfg, e), is_moe, count, rngs=rngs, dtype=dtype, param_dtype=pdtype)
            for (is_moe, count), e in zip(self.runs, self.run_experts)
        ])
        self.l3_after = tuple(sorted(cfg.l3.after_layers))
        if self.l3_after and l3_offsets is None:
            l3_offsets = allocation_from_config(cfg)
        self.l3 = nnx.List([
            L3Layer(cfg, l3_offsets, rngs=rngs, dtype=dtype, param_dtype=pdtype) for _ in self.l3_after
        ])
        self.final_norm = RMSNorm(cfg.d_model, cfg.norm_eps, pdtype)
        self.head_dv = (
            None if cfg.tie_embeddings
            else param(rngs, (cfg.d_model, cfg.vocab_size), ("embed", "vocab"), cfg.init_std, pdtype)
        )
        self.num_experts = cfg.moe.num_experts
        self.dtype = dtype
        self.remat = remat
        self.unroll = not scan_layers  # unroll each run of layers instead of scanning it

    def __call__(
        self, tokens_bt, positions_bt, segment_ids_bt, *, balancer=None, balance_state=None, with_routing=False
    ):
        """Logits and auxiliary outputs; ``with_routing`` (static) adds, stacked over the MoE
        layers in depth order, ``routing`` (every MoE layer's :class:`~moejax.model.router.Routing`,
        leaves [L, B, T, ...]) and ``router_input_lbtd`` (float32 [L, B, T, d]: what each router
        multiplies, its block's normed hidden state; the router's logits are ``router_input_lbtd[l]
        @ w_de``), for evaluation and routing analysis; training leaves it off so the per-token
        routing is not kept."""

        def layer(block, x_btd, inputs):
            x_btd, aux = block(x_btd, positions_bt, segment_ids_bt, balancer, inputs["balance"])
            if aux is not None and not with_routing:
                aux = {key: value for key, value in aux.items() if key not in PER_TOKEN_AUX}
            return x_btd, aux

        def lookup(l3_layer, x_btd):
            return l3_layer(x_btd, tokens_bt)

        if self.remat != "none":
            layer = nnx.remat(layer, policy=REMAT_POLICIES[self.remat])
            lookup = nnx.remat(lookup, policy=REMAT_POLICIES[self.remat])
        x_btd, outs = self.scan_layers(
            layer, self.embed(tokens_bt), lambda i, x_btd: lookup(self.l3[i], x_btd), balance_state=balance_state
        )
        logits_btv = constrain(self.logits(x_btd), ("batch", "seq", "vocab"))
        return logits_btv, self._stack([aux for aux in outs if aux is not None])

    def decode(
        self, tokens_bt, cache: KVCache, index_b, *, balancer=None, balance_state=None,
        l3_rows: tuple[L3Rows, ...] | None = None,
    ):
        """Logits [B, T, V] of T new tokens per row, row b's at positions ``index_b[b] + [0, T)``,
        attending to the cache, and the cache with their keys and values written in.

        One document per row (no segment ids). Prefill is a call at ``index_b = 0`` with the
        prompts; each decode step a call with T = 1. Gives the logits of ``__call__`` on the whole
        sequence (dropless dispatch; the capacity backend may drop other tokens in a full pass).
        ``l3_rows`` (one per L3 layer, e.g. ``HostTables.fetch(tokens_bt)`` of host-resident
        tables) replaces the L3 layers' reads of their device tables, which then go unread.
        """

        def lookup(i, x_btd):
            l3_layer = self.l3[i]
            return l3_layer(x_btd, tokens_bt) if l3_rows is None else l3_layer.attend(x_btd, l3_rows[i])

        def layer(block, x_btd, inputs):
            k_bskh, v_bskh = inputs["layer"]
            x_btd, k_bskh, v_bskh = block.decode(x_btd, k_bskh, v_bskh, index_b, balancer, inputs["balance"])
            return x_btd, (k_bskh, v_bskh)

        x_btd = self.embed_vd[...].astype(self.dtype)[tokens_bt]  # no batch constraint: B may be 1
        x_btd, outs = self.scan_layers(
            layer, x_btd, lookup, balance_state=balance_state, per_layer=(cache.k_lbskh, cache.v_lbskh)
        )
        k_lbskh, v_lbskh = (jnp.concatenate(parts) for parts in zip(*outs))
        return self.logits(x_btd), KVCache(k_lbskh, v_lbskh)

    def embed(self, tokens_bt) -> jax.Array:
        embed_vd = self.embed_vd[...].astype(self.dtype)
        return constrain(embed_vd[tokens_bt], ("batch", "seq", "act_embed"))

    def logits(self, x_btd) -> jax.Array:
        """Final norm and output head; float32 logits [B, T, V]."""
        x_btd = self.final_norm(x_btd)
        head_dv = self.embed_vd[...].T if self.head_dv is None else self.head_dv[...]
        return linear(x_btd, head_dv.astype(self.dtype)).astype(jnp.float32)

    def scan_layers(self, body, x_btd, lookup, *, balance_state=None, per_layer=None):
        """Applies ``body(block, x, inputs) -> (x, out)`` to every layer in depth order, and
        ``lookup(i, x) -> x`` (the i-th L3 layer) after each layer in ``l3_after``.

        ``inputs`` holds this layer's slices: ``"balance"`` of ``balance_state`` (leaves [L_moe,
        ...], MoE layers only, else None) and ``"layer"`` of ``per_layer`` (leaves [L, ...], e.g.
        a key/value cache). Returns x and one output per run, stacked over the run's layers.
        Runs end at L3 positions (:func:`layer_runs`), so each lookup comes between two scans.
        """
        outs, layer, moe_layer = [], 0, 0
        for (is_moe, count), e, blocks in zip(self.runs, self.run_experts, self.layers):
            take = lambda tree, start: jax.tree.map(lambda leaf: leaf[start:start + count], tree)
            inputs = {
                "balance": _fewer_experts(take(balance_state, moe_layer), self.num_experts, e)
                if is_moe and balance_state else None,
                "layer": None if per_layer is None else take(per_layer, layer),
            }
            # scan_layers=False unrolls the loop: same parameters and numbers, faster on CPU for a
            # few layers, but compile time grows with depth and remat saves no memory on XLA:CPU.
            scan = nnx.scan(
                body, in_axes=(0, nnx.Carry, 0), out_axes=(nnx.Carry, 0), unroll=self.unroll
            )
            x_btd, out = scan(blocks, x_btd, inputs)
            outs.append(out)
            layer += count
            moe_layer += count if is_moe else 0
            if layer - 1 in self.l3_after:
                x_btd = lookup(self.l3_after.index(layer - 1), x_btd)
        return x_btd, outs

    def _stack(self, auxes: list[dict]) -> dict:
        e = self.num_experts
        # Runs with fewer experts (per-layer counts) are padded to num_experts: no load, no probability.
        auxes = [_pad_experts(a, e) for a in auxes]
        concat = lambda key, shape: (
            jnp.concatenate([a[key] for a in auxes]) if auxes else jnp.zeros((0, *shape), jnp.float32)
        )
        balance_losses = {
            name: sum(jnp.sum(a["losses"][name]) for a in auxes)
            for name in (auxes[0]["losses"] if auxes else {})
        }
        out = {
            "load_le": concat("load_e", (e,)),
            "pbar_le": concat("pbar_e", (e,)),
            "drop_rate_l": concat("drop_rate", ()),
            "entropy_l": concat("entropy", ()),
            "balance_losses": balance_losses,
            "balance_loss": sum(balance_losses.values(), jnp.zeros((), jnp.float32)),
        }
        if auxes and "llep_engaged" in auxes[0]:  # ep_balance="llep": 1.0 where the layer spilled
            out["llep_engaged_l"] = concat("llep_engaged", ())
        if auxes and "routing" in auxes[0]:
            out["routing"] = jax.tree.map(lambda *leaves: jnp.concatenate(leaves), *[a["routing"] for a in auxes])
            out["router_input_lbtd"] = jnp.concatenate([a["router_input"] for a in auxes])
        return out


def _with_experts(cfg: ModelConfig, num_experts: int) -> ModelConfig:
    """``cfg`` with ``num_experts`` routed experts in every MoE layer (the config of one run)."""
    if not cfg.moe.layer_experts or num_experts == 0:
        return cfg
    return dataclasses.replace(cfg, moe=dataclasses.replace(cfg.moe, num_experts=num_experts, layer_experts=()))


def _fewer_experts(state, num_experts: int, e: int):
    """A run's balancing state with its leaves' expert axis ([..., num_experts]) cut to its ``e``."""
    if e == num_experts:
        return state
    return jax.tree.map(lambda leaf: leaf[..., :e] if leaf.shape[-1] == num_experts else leaf, state)


def _pad_experts(aux: dict, num_experts: int) -> dict:
    """A run's auxiliary outputs padded along the expert axis to ``num_experts`` (zero load and
    probability, -inf logits for the experts the run lacks)."""
    e = aux["load_e"].shape[-1]
    if e == num_experts:
        return aux
    pad = lambda x, value=0.0: jnp.pad(
        x, [(0, 0)] * (x.ndim - 1) + [(0, num_experts - e)], constant_values=value
    )
    out = {**aux, "load_e": pad(aux["load_e"]), "pbar_e": pad(aux["pbar_e"])}
    if "routing" in aux:
        routing = aux["routing"]
        out["routing"] = routing._replace(probs_bte=pad(routing.probs_bte), logits_bte=pad(routing.logits_bte, -jnp.inf))
    return out


def param_counts(cfg) -> dict[str, int]:
    """Total and active (per token) parameter counts, from the config alone (L3 layers: see
    :func:`~moejax.model.l3.l3_param_counts`)."""
    d, v, moe = cfg.d_model, cfg.vocab_size, cfg.moe
    attn = d * cfg.head_dim * (2 * cfg.num_heads + 2 * cfg.num_kv_heads) + 2 * d
    attn += cfg.head_dim * (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.attn_bias + 2 * cfg.head_dim * cfg.qk_norm
    dense_mlp = 3 * d * cfg.mlp_dim
    shared = 3 * d * moe.num_shared_experts * moe.shared_expert_dim + d * moe.shared_gate
    routed_one = 3 * d * moe.expert_dim
    total = active = v * d * (1 if cfg.tie_embeddings else 2) + d
    for layer, experts in enumerate(layer_expert_counts(cfg)):
        if is_moe_layer(cfg, layer):
            router = d * experts + experts * moe.router_bias
            total += attn + router + shared + experts * routed_one
            active += attn + router + shared + moe.experts_per_token * routed_one
        else:
            total += attn + dense_mlp
            active += attn + dense_mlp
    l3 = l3_param_counts(cfg)
    total += len(cfg.l3.after_layers) * l3["total"]
    active += len(cfg.l3.after_layers) * l3["active"]
    return {"total": total, "active": active}


def flops_per_token(cfg, seq_len: int) -> float:
    """Training FLOPs per token: 6 x (active matmul params, incl. the output head) + attention.

    Attention scores and values cost 2 * 2 * T * n * h per token per layer forward, halved for the
    causal mask; x3 for forward + backward. Embedding lookups are free; norms are ignored. L3
    layers count 3 x :func:`~moejax.model.l3.l3_forward_flops` (their table rows are read, not
    multiplied as weights: a tied table serves as keys and values, two products per row).
    """
    counts = param_counts(cfg)
    d, v = cfg.d_model, cfg.vocab_size
    matmul_params = counts["active"] - v * d * (1 if cfg.tie_embeddings else 2) + v * d
    attention = cfg.num_layers * 2 * seq_len * cfg.num_heads * cfg.head_dim  # causal: half of 4*T*n*h
    num_l3 = len(cfg.l3.after_layers)
    matmul_params -= num_l3 * l3_param_counts(cfg)["active"]  # L3 layers: counted by their FLOPs
    return 6.0 * matmul_params + 3.0 * attention + 3.0 * num_l3 * l3_forward_flops(cfg)
