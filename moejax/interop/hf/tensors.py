"""Tensors: Hugging Face tensor names and layouts per architecture <-> the moejax parameter tree
(layers stacked per run, experts stacked on one axis), and the exact rewrites export needs."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterator, Mapping, Protocol

import jax
import numpy as np
from flax import nnx

from moejax.config import ConfigDict
from moejax.interop.hf.configs import adapted_config
from moejax.interop.hf.errors import InteropError
from moejax.model.transformer import Transformer, layer_runs
from moejax.schema import ModelConfig


@dataclasses.dataclass(frozen=True)
class Layout:
    """How one HF tensor (a torch Linear weight is [out, in]) becomes a moejax array, and back."""

    to_moejax: Callable[[np.ndarray, tuple[int, ...]], np.ndarray]
    to_hf: Callable[[np.ndarray], np.ndarray]


_reshape = lambda w, shape: w.reshape(shape)  # noqa: E731
_transpose = lambda w, shape: w.T.reshape(shape)  # noqa: E731
SAME = Layout(_reshape, lambda p: p)
VECTOR = Layout(_reshape, lambda p: p.reshape(-1))  # norm scales, biases: [n*h] <-> [n, h]
ROW = Layout(_reshape, lambda p: p.reshape(1, -1))  # a Linear(d, 1) weight [1, d] <-> [d]
LINEAR_IN = Layout(_transpose, lambda p: p.reshape(p.shape[0], -1).T)  # moejax [in, *out]
LINEAR_OUT = Layout(_transpose, lambda p: p.reshape(-1, p.shape[-1]).T)  # moejax [*in, out]

# Per-architecture tensor names: the MoE block's prefix, the experts' (gate, up, down) names and
# the shared experts' prefix (None: the architecture has none).
MOE_NAMES = {
    "mixtral": ("block_sparse_moe", ("w1", "w3", "w2"), None),
    "qwen2_moe": ("mlp", ("gate_proj", "up_proj", "down_proj"), "shared_expert"),
    "qwen3_moe": ("mlp", ("gate_proj", "up_proj", "down_proj"), None),
    "dots1": ("mlp", ("gate_proj", "up_proj", "down_proj"), "shared_experts"),
}
TOP_LEVEL = {
    ("embed_vd",): ("model.embed_tokens.weight", SAME),
    ("final_norm", "scale"): ("model.norm.weight", VECTOR),
    ("head_dv",): ("lm_head.weight", LINEAR_IN),
}
# HF tensors that carry nothing moejax needs: RoPE tables some old checkpoints saved.
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)

Names = str | list[str]  # one HF tensor, or one per expert (stacked on the moejax expert axis)


def _swiglu_names(path: tuple[str, ...], prefix: str) -> dict[tuple[str, ...], tuple[Names, Layout]]:
    return {
        (*path, "w_gate_df"): (f"{prefix}.gate_proj.weight", LINEAR_IN),
        (*path, "w_up_df"): (f"{prefix}.up_proj.weight", LINEAR_IN),
        (*path, "w_down_fd"): (f"{prefix}.down_proj.weight", LINEAR_OUT),
    }


def _block_names(arch: str, is_moe: bool, num_experts: int) -> dict[tuple[str, ...], tuple[Names, Layout]]:
    """moejax block parameter path -> (HF names relative to ``model.layers.<i>.``, layout)."""
    names = {
        ("attn_norm", "scale"): ("input_layernorm.weight", VECTOR),
        ("mlp_norm", "scale"): ("post_attention_layernorm.weight", VECTOR),
        ("attn", "w_q_dnh"): ("self_attn.q_proj.weight", LINEAR_IN),
        ("attn", "w_k_dkh"): ("self_attn.k_proj.weight", LINEAR_IN),
        ("attn", "w_v_dkh"): ("self_attn.v_proj.weight", LINEAR_IN),
        ("attn", "w_o_nhd"): ("self_attn.o_proj.weight", LINEAR_OUT),
        ("attn", "b_q_nh"): ("self_attn.q_proj.bias", VECTOR),
        ("attn", "b_k_kh"): ("self_attn.k_proj.bias", VECTOR),
        ("attn", "b_v_kh"): ("self_attn.v_proj.bias", VECTOR),
        ("attn", "q_norm", "scale"): ("self_attn.q_norm.weight", VECTOR),
        ("attn", "k_norm", "scale"): ("self_attn.k_norm.weight", VECTOR),
    }
    if not is_moe:
        return {**names, **_swiglu_names(("mlp",), "mlp")}
    moe, (gate, up, down), shared = MOE_NAMES[arch]
    experts = lambda name: [f"{moe}.experts.{j}.{name}.weight" for j in range(num_experts)]  # noqa: E731
    names.update({
        ("mlp", "router", "w_de"): (f"{moe}.gate.weight", LINEAR_IN),
        ("mlp", "router", "select_bias_e"): (f"{moe}.gate.e_score_correction_bias", VECTOR),
        ("mlp", "w_gate_edf"): (experts(gate), LINEAR_IN),
        ("mlp", "w_up_edf"): (experts(up), LINEAR_IN),
        ("mlp", "w_down_efd"): (experts(down), LINEAR_OUT),
        ("mlp", "w_shared_gate_d"): (f"{moe}.shared_expert_gate.weight", ROW),
    })
    if shared is not None:
        names.update(_swiglu_names(("mlp", "shared"), f"{moe}.{shared}"))
    return names


def _leaf_names(m: ConfigDict, arch: str) -> Callable[[tuple], tuple[list[str], Names, Layout]]:
    """path -> (one HF name prefix per stacked layer, or [""] at top level; names; layout)."""
    runs, first = layer_runs(m), 0
    starts = []
    for _, count in runs:
        starts.append(first)
        first += count

    def lookup(path: tuple) -> tuple[list[str], Names, Layout]:
        if path[0] != "layers":
            table, key, prefixes = TOP_LEVEL, path, [""]
        else:
            run = int(path[1])
            is_moe, count = runs[run]
            table, key = _block_names(arch, is_moe, m.moe.num_experts), tuple(path[2:])
            prefixes = [f"model.layers.{starts[run] + i}." for i in range(count)]
        if key not in table:
            raise InteropError(f"moejax parameter {'/'.join(map(str, path))} has no {arch} counterpart.")
        return (prefixes, *table[key])

    return lookup


def param_path(key_path) -> tuple:
    """A tree path as a tuple of its keys (dict keys, list indices)."""
    return tuple(getattr(k, "key", getattr(k, "idx", k)) for k in key_path)


def abstract_params(m: ConfigDict) -> dict:
    """The moejax parameter tree (shapes and dtypes only) of model config ``m``."""
    model = nnx.eval_shape(lambda: Transformer(ModelConfig.from_config(m), rngs=nnx.Rngs(0)))
    return nnx.to_pure_dict(nnx.state(model))


def _items(prefixes: list[str], names: Names) -> Iterator[tuple[tuple[int, ...], str]]:
    """(index into the moejax leaf, HF tensor name) for every HF tensor of one leaf."""
    layered = prefixes != [""]
    for i, prefix in enumerate(prefixes):
        base = (i,) if layered else ()
        if isinstance(names, list):
            for j, name in enumerate(names):
                yield (*base, j), prefix + name
        else:
            yield base, prefix + names


def _hf_shape(layout: Layout, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The HF shape of a moejax array of ``shape`` (computed on a zero-strided view: no memory)."""
    return tuple(layout.to_hf(np.broadcast_to(np.float32(0), shape)).shape)


class _Tensors:
    """The HF state dict being consumed (a dict, or tensors read lazily from files): every tensor
    must be used exactly once, or be ignorable."""

    def __init__(self, tensors: Mapping[str, np.ndarray], tied: bool):
        self.tensors, self.used = tensors, set()
        self.ignorable = {"lm_head.weight"} if tied else set()

    def dtype(self, name: str) -> np.dtype:
        self.check(name)
        dtype = getattr(self.tensors, "dtype", None)
        return dtype(name) if callable(dtype) else np.asarray(self.tensors[name]).dtype

    def check(self, name: str) -> None:
        if name not in self.tensors:
            raise InteropError(f"the checkpoint has no tensor {name!r}, which the config implies.")

    def take(self, name: str, layout: Layout, shape: tuple[int, ...]) -> np.ndarray:
        self.check(name)
        w = self.tensors[name]
        want = _hf_shape(layout, shape)
        if tuple(w.shape) != want:
            raise InteropError(f"tensor {name!r} has shape {tuple(w.shape)}; the config implies {want}.")
        self.used.add(name)
        return layout.to_moejax(np.asarray(w), shape)

    def check_all_used(self) -> None:
        left = sorted(
            n for n in self.tensors
            if n not in self.used and n not in self.ignorable and not n.endswith(IGNORED_SUFFIXES)
        )
        if left:
            raise InteropError(
                f"{len(left)} checkpoint tensor(s) have no moejax counterpart, e.g. {left[:4]}; "
                "importing would silently drop them (their config feature is not supported)."
            )


def params_from_hf(tensors: Mapping[str, np.ndarray], m: ConfigDict, arch: str) -> dict:
    """moejax parameters (pure dict of numpy arrays, layers stacked per run) from an HF state dict.

    Each parameter keeps its tensors' dtype (bfloat16 stays bfloat16) and is filled one HF tensor
    at a time, so with a lazily read ``tensors`` (``open_hf_dir``) the memory in flight is the
    parameters built so far plus one tensor.
    """
    lookup, source = _leaf_names(m, arch), _Tensors(tensors, m.tie_embeddings)

    def leaf(key_path, spec):
        prefixes, names, layout = lookup(param_path(key_path))
        items = list(_items(prefixes, names))
        out = np.empty(spec.shape, np.result_type(*{source.dtype(name) for _, name in items}))
        for index, name in items:
            out[index] = source.take(name, layout, out.shape[len(index):])
        return out

    params = jax.tree_util.tree_map_with_path(leaf, abstract_params(m))
    source.check_all_used()
    return params


def leaf_key(key_path) -> str:
    """'layers/1/mlp/w_gate_edf': a parameter's path, as checkpoint metadata names it."""
    return "/".join(str(k) for k in param_path(key_path))


def hf_specs(path: tuple, shape: tuple[int, ...], m: ConfigDict, arch: str) -> list[tuple[str, tuple[int, ...]]]:
    """(HF name, HF shape) of each tensor one moejax parameter of ``shape`` becomes."""
    prefixes, names, layout = _leaf_names(m, arch)(path)
    return [(name, _hf_shape(layout, tuple(shape[len(index):]))) for index, name in _items(prefixes, names)]


class Parts(Protocol):
    """A parameter to be indexed: a numpy array, or a saved one read part by part on indexing
    (``SavedArray``)."""

    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def dtype(self) -> np.dtype: ...
    def __getitem__(self, index: Any) -> np.ndarray: ...


def hf_tensors(path: tuple, value: Parts, m: ConfigDict, arch: str) -> Iterator[tuple[str, np.ndarray]]:
    """(HF name, tensor) of each tensor one moejax parameter becomes (per layer, per expert),
    each indexed out of ``value`` when it is yielded."""
    prefixes, names, layout = _leaf_names(m, arch)(path)
    for index, name in _items(prefixes, names):
        yield name, layout.to_hf(value[index])


def params_to_hf(params: Mapping, m: ConfigDict, arch: str) -> dict[str, np.ndarray]:
    """The HF state dict (per-expert tensors, as ``save_pretrained`` writes) of moejax parameters."""
    out = {}
    for key_path, value in jax.tree_util.tree_flatten_with_path(params)[0]:
        for name, tensor in hf_tensors(param_path(key_path), np.asarray(value), m, arch):
            out[name] = np.ascontiguousarray(tensor)
    return out


class LeafSource(Protocol):
    """Saved parameters by key (``leaf_key``): an in-memory tree, or a checkpoint read leaf by leaf."""

    def has(self, key: str) -> bool: ...
    def read(self, key: str) -> np.ndarray: ...
    def view(self, key: str) -> Parts: ...  # the parameter as indexed parts (e.g. read on indexing)
    def dtype(self, key: str) -> np.dtype: ...


class TreeSource:
    """A :class:`LeafSource` over a parameter tree in memory."""

    def __init__(self, params: Mapping):
        self.flat = {leaf_key(k): v for k, v in jax.tree_util.tree_flatten_with_path(params)[0]}

    def has(self, key: str) -> bool:
        return key in self.flat

    def read(self, key: str) -> np.ndarray:
        if key not in self.flat:
            raise InteropError(f"the parameters have no {key}, which the model config implies.")
        return np.asarray(self.flat[key])

    def view(self, key: str) -> np.ndarray:
        return self.read(key)

    def dtype(self, key: str) -> np.dtype:
        return np.asarray(self.flat[key]).dtype


def _moe_runs(m: ConfigDict) -> Iterator[tuple[int, int, int]]:
    """(run index, first MoE-layer index, layer count) for each stacked MoE run of model ``m``."""
    moe_layer = 0
    for run, (is_moe, count) in enumerate(layer_runs(m)):
        if is_moe:
            yield run, moe_layer, count
            moe_layer += count


def exported_leaf(
    path: tuple, source: LeafSource, m: ConfigDict, arch: str | None, bias_le: np.ndarray | None,
) -> Parts:
    """One parameter of the exported model, computed from the saved parameter(s) it comes from:
    a rewritten one as a numpy array, an unchanged one as ``source.view`` gives it.

    ``path`` is a parameter of the exported model's config (``adapted_config`` of ``m`` for
    ``arch``, with ``router_bias`` when ``bias_le`` is folded); ``m`` is the saved model's config.
    The rewrites (the only ones; everything else is the saved parameter unchanged):

    - a router's selection bias gets ``bias_le`` [L_moe, E] (e.g. the loss-free balancing state)
      added for its layers; a model without one starts from zeros (dots1 always has one). Routing
      with the folded bias and no balancing bias is the same as before.
    - qwen2_moe always gates its shared expert: a zero gate weight gives sigmoid(0) = 1/2, and the
      doubled down projection undoes it exactly (both are powers of two).
    """
    def key(*parts) -> str:
        return "/".join(map(str, parts))

    runs = {run: (first, count) for run, first, count in _moe_runs(m)}
    run = int(path[1]) if path[0] == "layers" else None
    tail = tuple(path[2:])
    if run in runs:
        first, count = runs[run]
        if tail == ("mlp", "router", "select_bias_e"):
            own = key(*path)
            value = source.read(own) if source.has(own) else np.zeros((count, m.moe.num_experts), np.float32)
            return value if bias_le is None else value + bias_le[first:first + count].astype(np.float32)
        if arch == "qwen2_moe" and not source.has(key(*path[:2], "mlp", "w_shared_gate_d")):
            if tail == ("mlp", "w_shared_gate_d"):
                return np.zeros((count, m.d_model), source.dtype(key(*path[:2], "mlp", "shared", "w_down_fd")))
            if tail == ("mlp", "shared", "w_down_fd"):
                return source.read(key(*path)) * 2
    return source.view(key(*path))


def _rewritten(params: Mapping, m: ConfigDict, target: ConfigDict, arch: str | None, bias_le) -> dict:
    source = TreeSource(params)
    return jax.tree_util.tree_map_with_path(
        lambda key_path, _: exported_leaf(param_path(key_path), source, m, arch, bias_le), abstract_params(target)
    )


def adapt_params(params: dict, m: ConfigDict, arch: str) -> dict:
    """Exact rewrites that let ``arch`` hold what it lacks a switch for (``adapted_config``;
    the rewrites: :func:`exported_leaf`)."""
    return _rewritten(params, m, adapted_config(m, arch), arch, None)


def folded_config(m: ConfigDict) -> ConfigDict:
    """``m`` with a router selection bias (what :func:`fold_selection_bias` gives)."""
    m = ConfigDict(m.to_dict())
    m.moe.router_bias = True
    return m


def fold_selection_bias(params: dict, bias_le: np.ndarray, m: ConfigDict) -> tuple[dict, ConfigDict]:
    """Adds per-MoE-layer selection biases [L_moe, E] (e.g. loss-free balancing state) to the router.

    Routing with the folded router bias and no balancing bias is the same as before, so a model
    trained with loss-free balancing exports with its selection bias (as e_score_correction_bias).
    """
    folded = folded_config(m)
    return _rewritten(params, m, folded, None, bias_le), folded
