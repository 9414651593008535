"""Tensors: Hugging Face tensor names and layouts per architecture <-> the moejax parameter tree
(layers stacked per run, experts stacked on one axis), and the exact rewrites export needs."""

from __future__ import annotations

import dataclasses
from typing import Callable, Mapping

import jax
import numpy as np
from flax import nnx

from moejax.config import ConfigDict
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


def _path(key_path) -> tuple:
    return tuple(getattr(k, "key", getattr(k, "idx", k)) for k in key_path)


def abstract_params(m: ConfigDict) -> dict:
    """The moejax parameter tree (shapes and dtypes only) of model config ``m``."""
    model = nnx.eval_shape(lambda: Transformer(ModelConfig.from_config(m), rngs=nnx.Rngs(0)))
    return nnx.to_pure_dict(nnx.state(model))


class _Tensors:
    """The HF state dict being consumed: every tensor must be used exactly once, or be ignorable."""

    def __init__(self, tensors: Mapping[str, np.ndarray], tied: bool):
        self.tensors, self.used = tensors, set()
        self.ignorable = {"lm_head.weight"} if tied else set()

    def take(self, name: str, layout: Layout, shape: tuple[int, ...], dtype) -> np.ndarray:
        if name not in self.tensors:
            raise InteropError(f"the checkpoint has no tensor {name!r}, which the config implies.")
        w = self.tensors[name]
        want = layout.to_hf(np.broadcast_to(np.float32(0), shape)).shape
        if tuple(w.shape) != want:
            raise InteropError(f"tensor {name!r} has shape {tuple(w.shape)}; the config implies {want}.")
        self.used.add(name)
        return layout.to_moejax(np.asarray(w), shape).astype(dtype)

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


def _gather(tensors: _Tensors, prefix: str, names: Names, layout: Layout, shape, dtype) -> np.ndarray:
    if isinstance(names, list):
        return np.stack([tensors.take(prefix + n, layout, shape[1:], dtype) for n in names])
    return tensors.take(prefix + names, layout, shape, dtype)


def params_from_hf(tensors: Mapping[str, np.ndarray], m: ConfigDict, arch: str) -> dict:
    """moejax parameters (pure dict of numpy arrays, layers stacked per run) from an HF state dict."""
    lookup, source = _leaf_names(m, arch), _Tensors(tensors, m.tie_embeddings)

    def leaf(key_path, spec):
        prefixes, names, layout = lookup(_path(key_path))
        if prefixes == [""]:
            return _gather(source, "", names, layout, spec.shape, spec.dtype)
        return np.stack([_gather(source, p, names, layout, spec.shape[1:], spec.dtype) for p in prefixes])

    params = jax.tree_util.tree_map_with_path(leaf, abstract_params(m))
    source.check_all_used()
    return params


def params_to_hf(params: Mapping, m: ConfigDict, arch: str) -> dict[str, np.ndarray]:
    """The HF state dict (per-expert tensors, as ``save_pretrained`` writes) of moejax parameters."""
    lookup, out = _leaf_names(m, arch), {}

    def emit(prefix: str, names: Names, layout: Layout, value: np.ndarray) -> None:
        if isinstance(names, list):
            for name, v in zip(names, value):
                emit(prefix, name, layout, v)
        else:
            out[prefix + names] = np.ascontiguousarray(layout.to_hf(value))

    def leaf(key_path, value):
        prefixes, names, layout = lookup(_path(key_path))
        value = np.asarray(value)
        for i, prefix in enumerate(prefixes):
            emit(prefix, names, layout, value if prefix == "" else value[i])

    jax.tree_util.tree_map_with_path(leaf, params)
    return out


def _moe_runs(params: dict, m: ConfigDict):
    """(run key, first MoE-layer index, layer count) for each stacked MoE run of ``params``."""
    moe_layer = 0
    for run, (is_moe, count) in enumerate(layer_runs(m)):
        if is_moe:
            yield run, moe_layer, count
            moe_layer += count


def adapt_params(params: dict, m: ConfigDict, arch: str) -> dict:
    """Exact rewrites that let ``arch`` hold what it lacks a switch for (``adapted_config``).

    qwen2_moe always gates its shared expert: a zero gate weight gives sigmoid(0) = 1/2, and the
    doubled down projection undoes it exactly (both are powers of two). dots1 always has a
    selection bias: zeros when moejax has none.
    """
    params = jax.tree.map(np.asarray, params)
    d, e = m.d_model, m.moe.num_experts
    for key, _, count in _moe_runs(params, m):
        mlp = params["layers"][key]["mlp"]
        if arch == "qwen2_moe" and "shared" in mlp and "w_shared_gate_d" not in mlp:
            mlp["w_shared_gate_d"] = np.zeros((count, d), mlp["shared"]["w_down_fd"].dtype)
            mlp["shared"]["w_down_fd"] = mlp["shared"]["w_down_fd"] * 2
        if arch == "dots1" and "select_bias_e" not in mlp["router"]:
            mlp["router"]["select_bias_e"] = np.zeros((count, e), np.float32)
    return params


def fold_selection_bias(params: dict, bias_le: np.ndarray, m: ConfigDict) -> tuple[dict, ConfigDict]:
    """Adds per-MoE-layer selection biases [L_moe, E] (e.g. loss-free balancing state) to the router.

    Routing with the folded router bias and no balancing bias is the same as before, so a model
    trained with loss-free balancing exports with its selection bias (as e_score_correction_bias).
    """
    params, m = jax.tree.map(np.asarray, params), ConfigDict(m.to_dict())
    m.moe.router_bias = True
    for key, first, count in _moe_runs(params, m):
        router = params["layers"][key]["mlp"]["router"]
        own = router.get("select_bias_e", np.zeros((count, m.moe.num_experts), np.float32))
        router["select_bias_e"] = own + bias_le[first:first + count].astype(np.float32)
    return params, m
