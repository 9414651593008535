"""Typed configs at the model boundary, and the field helper that declares them.

The ``ConfigDict`` of :mod:`moejax.config` is the command-line surface; the model receives frozen
dataclasses instead, converted once from it with ``from_config``: :class:`ModelConfig` (the
``model.*`` keys: the Transformer), holding :class:`MoEConfig` (``model.moe.*``: the MoE layer
and its router), which holds :class:`DispatchConfig` (the ``model.moe.*`` keys of the dispatch
backends, :func:`moejax.model.dispatch.dispatch`), and :class:`L3Config` (``model.l3.*``).

Each field is declared once, with :func:`hparam`: its type, its default, what it allows (a
:class:`Check`) and a one-line doc, with a comment above it where the knob needs more words.
:func:`moejax.config.default_config` builds its ``model`` group from these declarations
(:func:`defaults`), so each ``model.*`` key and its default are written here only. A dataclass checks its
fields when built, so a bad value is an error before anything is traced; the checks across keys
(``experts_per_token <= num_experts``, LLEP's needs) stay in :func:`moejax.config.check_values`,
whose messages name the key the user changed. :func:`declared_keys` lists every field under its
dotted config key: ``moejax.config`` generates from it the allowed choices (``CHOICES``) and the
``> 0`` / ``>= 0`` bounds of the ``model.*`` keys, so that schema lives here only.

Layering: this module imports nothing from moejax, like :mod:`moejax.errors`: ``moejax.config``
(which may import no package of moejax) builds its checks from these declarations, and the model
(and its balancing objectives, whose hyperparameters use the same :func:`hparam`) builds on them.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Iterator
from typing import Any, Callable, TypeVar


@dataclasses.dataclass(frozen=True)
class Check:
    """A predicate on a field's value and the words that say what it allows.

    ``choices``: the values a choice allows (:func:`one_of`); ``bound``: ``"positive"`` or
    ``"non_negative"`` for the bounds :mod:`moejax.config` checks by key (:func:`positive`,
    :func:`non_negative`), else ``""``.
    """

    ok: Callable[[Any], bool]
    allowed: str
    choices: tuple = ()
    bound: str = ""


def is_real(x: Any) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)


def is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def number(lo: float, hi: float = math.inf, *, lo_open: bool = True, hi_open: bool = False) -> Check:
    """A finite real in the interval from ``lo`` to ``hi`` (open or closed at each end)."""
    above = (lambda x: x > lo) if lo_open else (lambda x: x >= lo)
    below = (lambda x: x < hi) if hi_open or hi == math.inf else (lambda x: x <= hi)
    if hi == math.inf:
        allowed = f"a number {'>' if lo_open else '>='} {lo:g}"
    else:
        allowed = f"a number in {'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"
    return Check(lambda x: is_real(x) and above(x) and below(x), allowed)


def one_of(*choices: str) -> Check:
    return Check(lambda x: x in choices, " | ".join(repr(c) for c in choices), choices=choices)


def positive_int_or_none() -> Check:
    ok = lambda x: x is None or (is_int(x) and x > 0)
    return Check(ok, "a positive integer, or None")


def positive(kind: type = float) -> Check:
    """A finite number > 0 (``kind=float``, ints accepted) or an int >= 1 (``kind=int``)."""
    if kind is int:
        return Check(lambda x: is_int(x) and x >= 1, "an int >= 1", bound="positive")
    return Check(lambda x: is_real(x) and x > 0, "a finite number > 0", bound="positive")


def non_negative(kind: type = float) -> Check:
    """A finite number >= 0 (``kind=float``, ints accepted) or an int >= 0 (``kind=int``)."""
    if kind is int:
        return Check(lambda x: is_int(x) and x >= 0, "an int >= 0", bound="non_negative")
    return Check(lambda x: is_real(x) and x >= 0, "a finite number >= 0", bound="non_negative")


def flag() -> Check:
    return Check(lambda x: isinstance(x, bool), "True or False")


def integer() -> Check:
    return Check(is_int, "an int")


def text() -> Check:
    return Check(lambda x: isinstance(x, str), "a string")


def int_tuple() -> Check:
    return Check(lambda x: isinstance(x, tuple) and all(map(is_int, x)), "a tuple of ints")


def hparam(default: Any = dataclasses.MISSING, *, check: Check, doc: str, key: str = "") -> Any:
    """Declares a checked field; without ``default`` it is required. ``key``: its config key
    within the section, when it is not the field's name."""
    metadata = {"check": check, "doc": doc, **({"key": key} if key else {})}
    return dataclasses.field(default=default, metadata=metadata)


T = TypeVar("T", bound="TypedConfig")


def section(cls: type, *, doc: str, flat: bool = False) -> Any:
    """Declares a field holding the typed config ``cls`` of a config group: the field's name under
    this section (``model.moe``), or with ``flat`` this section's own keys (the dispatch keys live
    in ``model.moe``)."""
    return dataclasses.field(default_factory=cls, metadata={"section": cls, "flat": flat, "doc": doc})


@dataclasses.dataclass(frozen=True)
class TypedConfig:
    """Base class: checks every :func:`hparam` field when built (``ValueError`` naming the field),
    and converts from the config group of its section (:meth:`from_config`)."""

    def __post_init__(self) -> None:
        for field in checked_fields(type(self)):
            value = getattr(self, field.name)
            check: Check = field.metadata["check"]
            if not check.ok(value):
                allowed = f"one of {check.choices!r}" if check.choices else check.allowed
                raise ValueError(f"{field.name} must be {allowed}, got {value!r}")

    @classmethod
    def from_config(cls: type[T], group: Any) -> T:
        """The typed config of ``group``, the ``ConfigDict`` of this class's section (e.g.
        ``cfg.model`` for :class:`ModelConfig`); tuples stay tuples, lists become tuples."""
        values = {}
        for field in dataclasses.fields(cls):
            if "section" in field.metadata:
                sub = group if field.metadata["flat"] else group[field.name]
                values[field.name] = field.metadata["section"].from_config(sub)
            elif "check" in field.metadata:
                value = group[field.metadata.get("key", field.name)]
                values[field.name] = tuple(value) if isinstance(value, list) else value
        return cls(**values)


def checked_fields(cls: type) -> tuple[dataclasses.Field, ...]:
    """The fields of ``cls`` declared with :func:`hparam`."""
    return tuple(f for f in dataclasses.fields(cls) if "check" in f.metadata)


def defaults(cls: type[TypedConfig]) -> dict[str, Any]:
    """The config group of ``cls`` as a nested dict of config keys and their defaults, in
    declaration order (a flat section's keys in the group itself): what ``default_config`` holds."""
    out: dict[str, Any] = {}
    for field in dataclasses.fields(cls):
        if "section" in field.metadata:
            sub = defaults(field.metadata["section"])
            if field.metadata["flat"]:
                out.update(sub)
            else:
                out[field.name] = sub
        elif "check" in field.metadata:
            out[field.metadata.get("key", field.name)] = field.default
    return out


def declared_keys(cls: type[TypedConfig], prefix: str) -> Iterator[tuple[str, dataclasses.Field]]:
    """(dotted config key, field) for every :func:`hparam` field of ``cls`` and the sections it
    holds, in declaration order; ``prefix``: the section's key (``"model"``)."""
    for field in dataclasses.fields(cls):
        if "section" in field.metadata:
            sub = prefix if field.metadata["flat"] else f"{prefix}.{field.name}"
            yield from declared_keys(field.metadata["section"], sub)
        elif "check" in field.metadata:
            yield f"{prefix}.{field.metadata.get('key', field.name)}", field


# The dispatch backends, in the order their error messages list them (the command line lists the
# default first: see moejax.config).
BACKENDS = ("capacity", "dropless", "expert_parallel")
IMPLS = ("auto", "ragged", "tokamax", "tiled", "hybrid")  # grouped matmul implementations
COMMS = ("all_to_all", "all_gather")  # how tokens travel over the expert axis
BALANCES = ("drop", "llep")  # what happens to assignments past the expert-parallel buffers


@dataclasses.dataclass(frozen=True, kw_only=True)
class DispatchConfig(TypedConfig):
    """How routed tokens reach their experts (:func:`moejax.model.dispatch.dispatch`); ``model.moe.*``."""

    # dropless (sort + grouped matmul) | capacity (GShard) | expert_parallel (tokens travel to the
    # devices of their experts over mesh.expert; docs/expert_parallel.md)
    backend: str = hparam("dropless", check=one_of(*BACKENDS),
                          doc="dropless (sort + grouped matmul) | capacity (GShard) | expert_parallel")
    capacity_factor: float = hparam(1.25, check=positive(), doc="capacity: slots per expert = ceil(cf * T * k / E)")
    # Dropless matmul: auto (GPU/TPU: tokamax when installed and on one device, else ragged; CPU: hybrid, or tiled
    # under 256 rows per expert) | ragged (jax.lax.ragged_dot) | tokamax (tokamax.ragged_dot, Pallas
    # kernels; the kernels extra) | tiled | hybrid (each expert's first even-share rows in one
    # batched matmul, the rest tiled); moejax/model/grouped_matmul.py.
    impl: str = hparam("auto", check=one_of(*IMPLS), key="grouped_matmul",
                       doc="grouped matmul of dropless and expert_parallel: auto | ragged | tokamax | tiled | hybrid")
    tile_size: int = hparam(64, check=positive(int), doc="tiled grouped matmul (and hybrid's overflow): rows per tile")
    ep_comm: str = hparam("all_to_all", check=one_of(*COMMS), doc="expert_parallel: how tokens travel")
    # expert_parallel: slots each device keeps for each of the mesh.expert devices = ceil(factor x its
    # share under perfect balance); assignments past them are dropped (drop_rate); >= mesh.expert: none
    ep_capacity_factor: float = hparam(2.0, check=positive(),
                                       doc="expert_parallel: slots per device pair (llep: native rows), x balanced share")
    # expert_parallel: what happens to assignments past the buffers: drop (counted in drop_rate) |
    # llep (Least-Loaded EP: an overloaded device's excess assignments, and the weights of their
    # experts, go to the least-loaded devices; docs/expert_parallel.md). llep needs mesh.expert > 1;
    # its spilling exchange moves tokens in the all_gather form (ep_comm is the form of the standard
    # exchange it takes under ep_llep_threshold); ep_capacity_factor also sizes each device's native
    # spill-mode buffer, ceil(factor x q) rows with q = its tokens x experts_per_token.
    ep_balance: str = hparam("drop", check=one_of(*BALANCES),
                             doc="expert_parallel: drop the overflow, or llep (spill it to least-loaded devices)")
    # llep: S, the extra experts (spill slots) a device may host, each with its weights and
    # ceil(ep_spill_capacity_factor x q) token rows. Memory per device and MoE layer, static (in
    # elements, forward): buffer rows r = ceil(ep_capacity_factor x q) + S x ceil(spill factor x q)
    # times (2 d_model + 3 expert_dim); hosted weights (S + E / mesh.expert) x 3 x d_model x
    # expert_dim (the slots and the weight ring's travelling block); gathered tokens and partial
    # outputs 2 x mesh.expert x s x d_model (s local tokens). Nothing can be dropped, for any
    # routing, when S >= num_experts / mesh.expert + 1 / ep_spill_capacity_factor.
    ep_spill_slots: int = hparam(2, check=positive(int), doc="llep: extra experts a device may host")
    ep_spill_capacity_factor: float = hparam(1.0, check=positive(), doc="llep: each spill slot's rows, x q")
    # llep: a layer spills only when an expert group's imbalance, its largest device load over the
    # mean (loads as standard EP asks them), reaches this threshold, or when standard EP's buffers
    # would drop; otherwise it takes standard EP's exchange (no plan, no weight ring, no spill rows)
    # in the ep_comm form with this threshold as its capacity factor (per device pair
    # ceil(threshold x q / mesh.expert) slots: what a device can be asked for under the threshold).
    # The step's metrics count it (llep_engaged, per MoE layer). 1.3 is the value the LLEP authors'
    # reference code runs with (MOE_ADAPTIVE_LPT_ROUTING_RATIO); <= 1: always spill.
    ep_llep_threshold: float = hparam(1.3, check=positive(),
                                      doc="llep: spill when max device load >= this x mean load; <= 1: always")


@dataclasses.dataclass(frozen=True, kw_only=True)
class MoEConfig(TypedConfig):
    """The MoE layer: router, routed and shared experts, dispatch; ``model.moe.*`` (the balancing
    objectives are built from the ConfigDict by :mod:`moejax.model.balancing`)."""

    num_experts: int = hparam(8, check=positive(int), doc="routed experts")
    experts_per_token: int = hparam(2, check=positive(int), doc="top-k")
    expert_dim: int = hparam(256, check=positive(int), doc="hidden width of each routed expert")
    num_shared_experts: int = hparam(1, check=non_negative(int), doc="always-on experts, fused into one SwiGLU of "
                                                                     "their total width")
    shared_expert_dim: int = hparam(256, check=non_negative(int), doc="hidden width of each shared expert")
    shared_gate: bool = hparam(False, check=flag(), doc="scale the shared experts' output by sigmoid(x . w)")
    score_func: str = hparam("softmax", check=one_of("softmax", "sigmoid"), doc="router scores")
    renormalize: bool = hparam(True, check=flag(), doc="rescale the top-k weights to sum to 1")
    routed_scaling: float = hparam(1.0, check=positive(), doc="multiplies the routed experts' output (DeepSeek-V3: 2.5)")
    # A fixed per-expert bias added to the scores for top-k selection only, stored in the router
    # (float32 [E], no gradient, no decay): an imported DeepSeek-V3 e_score_correction_bias.
    router_bias: bool = hparam(False, check=flag(), doc="a fixed selection-only bias per expert, in the router")
    # group-limited routing (DeepSeek-V3 n_group): experts in this many equal groups; 1: off
    num_groups: int = hparam(1, check=positive(int), doc="group-limited routing: equal expert groups; 1: off")
    topk_groups: int = hparam(1, check=positive(int), doc="each token selects from its best topk_groups groups")
    # Routed experts of each MoE layer, in depth order, when they differ (a pruned checkpoint written
    # by `python -m moejax.prune --auto`; docs/pruning.md): each between experts_per_token and
    # num_experts, the largest equal to num_experts. (): num_experts in every MoE layer. Not with
    # group-limited routing or the expert_parallel backend.
    layer_experts: tuple = hparam((), check=int_tuple(),
                                  doc="routed experts of each MoE layer in depth order (pruned); (): num_experts in all")
    dispatch: DispatchConfig = section(DispatchConfig, flat=True, doc="the dispatch backend and its knobs")

    def experts_of(self, moe_layer: int) -> int:
        """Routed experts of the ``moe_layer``-th MoE layer (0-based, in depth order)."""
        return self.layer_experts[moe_layer] if self.layer_experts else self.num_experts

    @property
    def shared_dim(self) -> int:
        """The fused width of the shared experts (0: none)."""
        return self.num_shared_experts * self.shared_expert_dim


@dataclasses.dataclass(frozen=True, kw_only=True)
class L3Config(TypedConfig):
    """Large Lookup Layers, ``model.l3.*``; their sizes are checked by :func:`moejax.model.l3.check_config`.

    Token id t owns rows [b_t, b_{t+1}) of a key and a value table; the normed hidden state
    attends over them, and the up-projected, normed result is mixed back into the residual stream
    (docs/l3.md). No auxiliary loss. The size checks apply once after_layers is set.
    """

    after_layers: tuple = hparam((), check=int_tuple(),
                                 doc="an L3 layer after each of these decoder layers (0-based), e.g. (1, 3); (): none")
    budget: int = hparam(2176, check=integer(),
                         doc="v: table rows over all tokens; vocab_size <= v <= vocab_size * max_rows")
    max_rows: int = hparam(16, check=integer(),
                           doc="k: the most rows one token owns (each owns >= 1); every token gathers k slots")
    key_dim: int = hparam(0, check=integer(),
                          doc="key width; 0: d_model, the normed hidden state is the query (else a projection)")
    value_dim: int = hparam(0, check=integer(),
                            doc="value width; 0: the key width (tied tables always use the key width)")
    up_dim: int = hparam(0, check=integer(), doc="width u of W_up's output o (mixed back as RMSNorm(o)); 0: d_model")
    tied: bool = hparam(False, check=flag(),
                        doc="one table serves as keys and values (V = K): half the table parameters")
    output: str = hparam("concat", check=one_of("concat", "residual"),
                         doc="concat: W_mix [RMSNorm(o); x] | residual: x + W_out RMSNorm(o)")
    # "": uniform rows per token from budget and max_rows; else an allocation JSON written by
    # `python -m moejax.data.l3_alloc` (LZW rows per token) for this vocabulary, budget and max_rows.
    allocation: str = hparam("", check=text(), doc="'' (uniform rows) or an allocation JSON")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig(TypedConfig):
    """The Transformer (:class:`moejax.model.transformer.Transformer`); ``model.*``."""

    vocab_size: int = hparam(272, check=positive(int),
                             doc="embedding rows; at least the tokenizer's vocabulary (byte: 259)")
    d_model: int = hparam(128, check=positive(int), doc="model width")
    num_layers: int = hparam(4, check=positive(int), doc="decoder layers")
    num_heads: int = hparam(4, check=positive(int), doc="query heads")
    num_kv_heads: int = hparam(2, check=positive(int), doc="key/value heads (grouped-query attention); divides num_heads")
    head_dim: int = hparam(32, check=positive(int), doc="width of each attention head")
    mlp_dim: int = hparam(512, check=positive(int), doc="hidden width of dense SwiGLU layers")
    rope_theta: float = hparam(10_000.0, check=positive(), doc="RoPE base")
    attn_bias: bool = hparam(False, check=flag(), doc="learned biases on the q/k/v projections (Qwen2-MoE)")
    qk_norm: bool = hparam(False, check=flag(),
                           doc="RMSNorm of each query and key head over head_dim, before RoPE (Qwen3-MoE)")
    norm_eps: float = hparam(1e-6, check=positive(), doc="RMSNorm epsilon")
    init_std: float = hparam(0.02, check=positive(),
                             doc="std of the normal init of all matrices (output projections scaled by depth)")
    tie_embeddings: bool = hparam(True, check=flag(), doc="share the input embedding with the output head")
    logits_z_loss: float = hparam(0.0, check=non_negative(), doc="weight of mean(logsumexp(logits)^2) (the loss)")
    first_k_dense: int = hparam(0, check=non_negative(int), doc="the first k layers use a dense MLP")
    moe_every: int = hparam(1, check=positive(int), doc="after those, every n-th layer is MoE (1: all of them)")
    moe: MoEConfig = section(MoEConfig, doc="the MoE layers")
    l3: L3Config = section(L3Config, doc="the Large Lookup Layers")
