"""Hugging Face ``transformers`` checkpoints <-> moejax: configs, tensors, files and a CLI.

    python -m moejax.interop.hf import --hf-dir DIR --workdir OUT
    python -m moejax.interop.hf export --workdir DIR [--step N] [--arch NAME] [--dtype D] --hf-dir OUT

Supported ``model_type`` values: ``mixtral``, ``qwen2_moe``, ``qwen3_moe`` and ``dots1`` (the
DeepSeek-V3 MoE -- sigmoid scores, selection bias, group-limited top-k, scaled routed output,
shared experts, leading dense layers -- with standard grouped-query attention). Conversion is
exact or refused: every config value moejax cannot reproduce (a sliding window, RoPE scaling, an
o_proj bias, multi-head latent attention, ...) is an :class:`InteropError` that names the key.
Only numpy and safetensors are needed (no torch). Mapping table and limitations:
docs/hf_interop.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import types
from typing import Any, Callable, Mapping

import jax
import numpy as np
from absl import logging as absl_logging
from flax import nnx
from safetensors import SafetensorError
from safetensors.numpy import load_file, save_file

from moejax import code_version, paths, sharding
from moejax import config as config_lib
from moejax.config import ConfigDict, ConfigError
from moejax.log import add_verbosity_flags, setup_logging
from moejax.model.transformer import DTYPES, Transformer, is_moe_layer, layer_runs
from moejax.train.checkpoint import Checkpointer
from moejax.train.state import init_state, setup

SUPPORTED = ("mixtral", "qwen2_moe", "qwen3_moe", "dots1")
SINGLE_FILE, INDEX_FILE = "model.safetensors", "model.safetensors.index.json"
HF_CONFIG_COPY = "hf_config.json"  # the imported config.json, kept in the workdir for export


class InteropError(ValueError):
    """A checkpoint or config that cannot be converted exactly; the message says what and why."""


# ----------------------------------------------------------------------------------------------
# Configs
# ----------------------------------------------------------------------------------------------

# What transformers 5.24 assumes when a config.json omits a key (configuration_<model>.py).
# Sizes have no default here: a config.json without them is an error.
COMMON_DEFAULTS = {
    "hidden_act": "silu", "tie_word_embeddings": False, "head_dim": None, "num_key_value_heads": None,
    "rope_parameters": None, "rope_scaling": None, "layer_types": None, "initializer_range": 0.02,
}
DEFAULTS = {
    "mixtral": {"rope_theta": 1e6, "rms_norm_eps": 1e-5, "sliding_window": None},
    "qwen2_moe": {
        "rope_theta": 1e4, "rms_norm_eps": 1e-6, "qkv_bias": True, "norm_topk_prob": False,
        "decoder_sparse_step": 1, "mlp_only_layers": [], "use_sliding_window": False,
    },
    "qwen3_moe": {
        "rope_theta": 1e4, "rms_norm_eps": 1e-6, "attention_bias": False, "norm_topk_prob": False,
        "decoder_sparse_step": 1, "mlp_only_layers": [], "use_sliding_window": False,
    },
    "dots1": {
        "rope_theta": 1e4, "rms_norm_eps": 1e-6, "attention_bias": False, "norm_topk_prob": False,
        "n_group": 1, "topk_group": 1, "first_k_dense_replace": 0, "routed_scaling_factor": 1.0,
        "sliding_window": 4096, "max_window_layers": 62,
    },
}
# Keys that name the expert count (transformers' attribute_map aliases), and legacy keys that
# export replaces: all are dropped from an imported config.json before export writes its own.
STALE_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "rope_scaling", "torch_dtype")


def architecture(hf: Mapping[str, Any]) -> str:
    """The config's ``model_type`` if moejax supports it; a clear error otherwise (MLA included)."""
    model_type = hf.get("model_type")
    if "kv_lora_rank" in hf or "q_lora_rank" in hf or str(model_type).startswith("deepseek"):
        raise InteropError(
            f"model_type {model_type!r} uses multi-head latent attention (MLA: config keys "
            "kv_lora_rank/q_lora_rank), which moejax does not implement. Supported: "
            f"{', '.join(SUPPORTED)}; for the DeepSeek-V3 MoE with standard attention use 'dots1'."
        )
    if model_type not in SUPPORTED:
        raise InteropError(f"config.json has model_type {model_type!r}; supported: {', '.join(SUPPORTED)}.")
    return model_type


def _reader(hf: Mapping[str, Any], arch: str) -> Callable[..., Any]:
    """get(key, *aliases): the config value, else transformers' default, else an error naming it."""
    defaults = {**COMMON_DEFAULTS, **DEFAULTS[arch]}

    def get(key: str, *aliases: str) -> Any:
        for name in (key, *aliases):
            if name in hf:
                return hf[name]
        if key in defaults:
            return defaults[key]
        raise InteropError(f"config.json of this {arch} model has no {' / '.join((key, *aliases))!r}.")

    return get


def _unsupported(key: str, value: Any, supported: str) -> InteropError:
    return InteropError(f"config.json has {key}={value!r}; moejax supports only {supported}.")


def _rope_theta(get) -> float:
    """The RoPE base; only plain RoPE over the whole head (rope_type 'default') is exact."""
    params = get("rope_parameters") or {}
    if params and all(isinstance(v, dict) for v in params.values()):
        raise _unsupported("rope_parameters", params, "one RoPE setting for every layer")
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type != "default":
        raise _unsupported("rope_parameters.rope_type", rope_type, "'default' (no RoPE scaling)")
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise _unsupported("partial_rotary_factor", params["partial_rotary_factor"], "1.0 (RoPE on the whole head)")
    scaling = get("rope_scaling")
    if scaling and scaling.get("rope_type", scaling.get("type")) != "default":
        raise _unsupported("rope_scaling", scaling, "null (no RoPE scaling)")
    return float(params.get("rope_theta", get("rope_theta")))


def _check_full_attention(get, arch: str, num_layers: int) -> None:
    """moejax attention is full causal attention: any sliding-window layer is refused."""
    layer_types = get("layer_types")
    if layer_types is None and arch == "dots1" and get("sliding_window") is not None:
        layer_types = ["sliding_attention" if i >= get("max_window_layers") else "full_attention"
                       for i in range(num_layers)]
    sliding = [i for i, kind in enumerate(layer_types or []) if kind != "full_attention"]
    if sliding:
        raise _unsupported(f"layer_types[{sliding[0]}]", layer_types[sliding[0]], "'full_attention'")
    if arch == "mixtral" and get("sliding_window") is not None:
        raise _unsupported("sliding_window", get("sliding_window"), "null (full attention)")
    if arch.startswith("qwen") and get("use_sliding_window"):
        raise _unsupported("use_sliding_window", True, "false (full attention)")


def _reject_attention_bias(get) -> None:
    if get("attention_bias"):
        raise _unsupported("attention_bias", True, "false here: it also adds an o_proj bias, which moejax lacks")


def _mixtral_from_hf(get, m: ConfigDict) -> None:
    m.moe.num_experts = get("num_local_experts", "num_experts")
    m.moe.expert_dim = m.mlp_dim = get("intermediate_size")
    m.moe.num_shared_experts, m.moe.shared_expert_dim = 0, 0
    m.moe.renormalize = True


def _qwen_from_hf(get, m: ConfigDict) -> None:
    m.moe.num_experts = get("num_experts", "num_local_experts")
    m.moe.expert_dim, m.mlp_dim = get("moe_intermediate_size"), get("intermediate_size")
    m.moe.renormalize = bool(get("norm_topk_prob"))


def _qwen2_moe_from_hf(get, m: ConfigDict) -> None:
    _qwen_from_hf(get, m)
    m.attn_bias = bool(get("qkv_bias"))
    m.moe.num_shared_experts, m.moe.shared_expert_dim = 1, get("shared_expert_intermediate_size")
    m.moe.shared_gate = True


def _qwen3_moe_from_hf(get, m: ConfigDict) -> None:
    _qwen_from_hf(get, m)
    _reject_attention_bias(get)
    m.qk_norm = True
    m.moe.num_shared_experts, m.moe.shared_expert_dim = 0, 0


def _dots1_from_hf(get, m: ConfigDict) -> None:
    _reject_attention_bias(get)
    m.qk_norm = True
    moe = m.moe
    moe.num_experts = get("n_routed_experts", "num_local_experts")
    moe.expert_dim, m.mlp_dim = get("moe_intermediate_size"), get("intermediate_size")
    moe.num_shared_experts, moe.shared_expert_dim = get("n_shared_experts"), moe.expert_dim
    moe.score_func, moe.router_bias = "sigmoid", True
    moe.num_groups, moe.topk_groups = get("n_group") or 1, get("topk_group") or 1
    moe.renormalize = bool(get("norm_topk_prob"))
    moe.routed_scaling = float(get("routed_scaling_factor"))


def _hf_moe_layers(get, arch: str, num_layers: int) -> list[bool]:
    """Which layers are MoE, by each architecture's own rule (modeling_<model>.py)."""
    if arch == "mixtral":
        return [True] * num_layers
    if arch == "dots1":
        return [layer >= get("first_k_dense_replace") for layer in range(num_layers)]
    step, dense = get("decoder_sparse_step"), set(get("mlp_only_layers") or [])
    return [layer not in dense and (layer + 1) % step == 0 for layer in range(num_layers)]


def _layer_pattern(moe_layers: list[bool]) -> tuple[int, int]:
    """(first_k_dense, moe_every) reproducing the HF layer pattern, or an error if none does."""
    n = len(moe_layers)
    for first_k_dense in range(n + 1):
        for moe_every in range(1, n + 1):
            probe = types.SimpleNamespace(first_k_dense=first_k_dense, moe_every=moe_every)
            if [is_moe_layer(probe, layer) for layer in range(n)] == moe_layers:
                return first_k_dense, moe_every
    pattern = "".join("M" if moe else "D" for moe in moe_layers)
    raise InteropError(
        f"the MoE/dense layer pattern {pattern} (decoder_sparse_step / mlp_only_layers / "
        "first_k_dense_replace) is not expressible in moejax, which has k dense layers first and "
        "then every n-th layer MoE (model.first_k_dense, model.moe_every)."
    )


FROM_HF = {
    "mixtral": _mixtral_from_hf, "qwen2_moe": _qwen2_moe_from_hf, "qwen3_moe": _qwen3_moe_from_hf,
    "dots1": _dots1_from_hf,
}


def model_config_from_hf(hf: Mapping[str, Any]) -> ConfigDict:
    """The moejax ``model`` config that computes what the HF config's model computes."""
    arch = architecture(hf)
    get = _reader(hf, arch)
    if get("hidden_act") != "silu":
        raise _unsupported("hidden_act", get("hidden_act"), "'silu' (SwiGLU)")
    m = config_lib.default_config().model
    m.vocab_size, m.d_model = get("vocab_size"), get("hidden_size")
    m.num_layers, m.num_heads = get("num_hidden_layers"), get("num_attention_heads")
    m.num_kv_heads = get("num_key_value_heads") or m.num_heads
    m.head_dim = get("head_dim") or m.d_model // m.num_heads
    m.rope_theta, m.norm_eps = _rope_theta(get), float(get("rms_norm_eps"))
    m.init_std, m.tie_embeddings = float(get("initializer_range")), bool(get("tie_word_embeddings"))
    m.moe.experts_per_token = get("num_experts_per_tok")
    _check_full_attention(get, arch, m.num_layers)
    FROM_HF[arch](get, m)
    m.first_k_dense, m.moe_every = _layer_pattern(_hf_moe_layers(get, arch, m.num_layers))
    return m


# What each architecture fixes, as moejax model-config values (export refuses anything else).
REQUIRES = {
    "mixtral": {
        "qk_norm": False, "attn_bias": False, "moe.num_shared_experts": 0, "moe.score_func": "softmax",
        "moe.renormalize": True, "moe.routed_scaling": 1.0, "moe.router_bias": False, "moe.num_groups": 1,
        "first_k_dense": 0, "moe_every": 1,
    },
    "qwen2_moe": {
        "qk_norm": False, "moe.score_func": "softmax", "moe.routed_scaling": 1.0, "moe.router_bias": False,
        "moe.num_groups": 1, "moe.shared_gate": True,
    },
    "qwen3_moe": {
        "qk_norm": True, "attn_bias": False, "moe.num_shared_experts": 0, "moe.score_func": "softmax",
        "moe.routed_scaling": 1.0, "moe.router_bias": False, "moe.num_groups": 1,
    },
    "dots1": {
        "qk_norm": True, "attn_bias": False, "moe.score_func": "sigmoid", "moe.shared_gate": False,
        "moe.router_bias": True, "moe_every": 1,
    },
}


def _value(m: ConfigDict, key: str) -> Any:
    for part in key.split("."):
        m = m[part]
    return m


def _shared_width(m: ConfigDict) -> int:
    return m.moe.num_shared_experts * m.moe.shared_expert_dim


def _dense_layers(m: ConfigDict) -> list[int]:
    return [layer for layer in range(m.num_layers) if not is_moe_layer(m, layer)]


def adapted_config(m: ConfigDict, arch: str) -> ConfigDict:
    """``m`` with the exact rewrites :func:`adapt_params` applies for ``arch`` (see there)."""
    m = ConfigDict(m.to_dict())
    if arch == "qwen2_moe" and _shared_width(m):
        m.moe.shared_gate = True
    if arch == "dots1":
        m.moe.router_bias = True
    return m


def cannot_express(m: ConfigDict, arch: str) -> list[str]:
    """Why ``arch`` cannot compute what moejax model config ``m`` computes ([] if it can)."""
    m = adapted_config(m, arch)
    problems = [
        f"model.{key}={_value(m, key)!r} (needs {want!r})"
        for key, want in REQUIRES[arch].items() if _value(m, key) != want
    ]
    if "l3" in m and m.l3.after_layers:
        problems.append(f"model.l3.after_layers={tuple(m.l3.after_layers)!r} (Large Lookup Layers have no "
                        "Hugging Face counterpart)")
    if arch in ("qwen2_moe", "dots1") and not _shared_width(m):
        problems.append("no shared experts (the architecture always has them)")
    if arch == "dots1" and m.moe.num_shared_experts and _shared_width(m) % m.moe.expert_dim:
        problems.append(f"shared width {_shared_width(m)} is not a multiple of model.moe.expert_dim")
    return problems


def choose_architecture(m: ConfigDict, preferred: str | None = None) -> str:
    """``preferred`` if it fits, else the first of :data:`SUPPORTED` that expresses ``m`` exactly."""
    candidates = ([preferred] if preferred in SUPPORTED else []) + [a for a in SUPPORTED if a != preferred]
    reasons = {arch: cannot_express(m, arch) for arch in candidates}
    for arch in candidates:
        if not reasons[arch]:
            return arch
    detail = "; ".join(f"{arch}: {', '.join(why)}" for arch, why in reasons.items())
    raise InteropError(f"no supported Hugging Face architecture computes this moejax model exactly ({detail}).")


def _mixtral_to_hf(m: ConfigDict) -> dict[str, Any]:
    return {"num_local_experts": m.moe.num_experts, "intermediate_size": m.moe.expert_dim, "sliding_window": None}


def _qwen_to_hf(m: ConfigDict) -> dict[str, Any]:
    return {
        "num_experts": m.moe.num_experts, "moe_intermediate_size": m.moe.expert_dim,
        "intermediate_size": m.mlp_dim, "norm_topk_prob": m.moe.renormalize, "decoder_sparse_step": 1,
        "mlp_only_layers": _dense_layers(m), "use_sliding_window": False, "sliding_window": None,
        "layer_types": ["full_attention"] * m.num_layers,
    }


def _qwen2_moe_to_hf(m: ConfigDict) -> dict[str, Any]:
    return {**_qwen_to_hf(m), "qkv_bias": m.attn_bias, "shared_expert_intermediate_size": _shared_width(m)}


def _qwen3_moe_to_hf(m: ConfigDict) -> dict[str, Any]:
    return {**_qwen_to_hf(m), "attention_bias": False}


def _dots1_to_hf(m: ConfigDict) -> dict[str, Any]:
    moe = m.moe
    return {
        "n_routed_experts": moe.num_experts, "moe_intermediate_size": moe.expert_dim,
        "intermediate_size": m.mlp_dim, "n_shared_experts": _shared_width(m) // moe.expert_dim,
        "first_k_dense_replace": m.first_k_dense, "n_group": moe.num_groups, "topk_group": moe.topk_groups,
        "norm_topk_prob": moe.renormalize, "routed_scaling_factor": moe.routed_scaling,
        "attention_bias": False, "sliding_window": None, "layer_types": ["full_attention"] * m.num_layers,
    }


TO_HF = {"mixtral": _mixtral_to_hf, "qwen2_moe": _qwen2_moe_to_hf, "qwen3_moe": _qwen3_moe_to_hf, "dots1": _dots1_to_hf}
CLASS_NAMES = {
    "mixtral": "MixtralForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM",
    "dots1": "Dots1ForCausalLM",
}


def hf_config_from_model(
    m: ConfigDict, arch: str, *, dtype: str = "float32", max_positions: int = 4096,
    base: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The config.json of ``arch`` for moejax model config ``m``.

    ``base`` (the config.json a workdir was imported from) supplies what moejax does not model
    (token ids, max_position_embeddings, ...); every value moejax determines is overwritten, and
    alias keys are dropped so they cannot contradict the written ones.
    """
    problems = cannot_express(m, arch)
    if problems:
        raise InteropError(f"{arch} cannot express this moejax model: {', '.join(problems)}.")
    m = adapted_config(m, arch)
    out = {k: v for k, v in (base or {}).items() if k not in STALE_KEYS}
    out.setdefault("max_position_embeddings", max_positions)
    out.update({
        "architectures": [CLASS_NAMES[arch]], "model_type": arch, "vocab_size": m.vocab_size,
        "hidden_size": m.d_model, "num_hidden_layers": m.num_layers, "num_attention_heads": m.num_heads,
        "num_key_value_heads": m.num_kv_heads, "head_dim": m.head_dim, "hidden_act": "silu",
        "rms_norm_eps": m.norm_eps, "rope_theta": m.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": m.rope_theta},
        "tie_word_embeddings": m.tie_embeddings, "initializer_range": m.init_std,
        "num_experts_per_tok": m.moe.experts_per_token, "dtype": dtype,
    })
    out.update(TO_HF[arch](m))
    return out


# ----------------------------------------------------------------------------------------------
# Tensors
# ----------------------------------------------------------------------------------------------


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
    model = nnx.eval_shape(lambda: Transformer(m, rngs=nnx.Rngs(0)))
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


# ----------------------------------------------------------------------------------------------
# Files
# ----------------------------------------------------------------------------------------------


def read_hf_dir(path: str) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """config.json and every tensor of model.safetensors (or the shards its index lists)."""
    config_path = os.path.join(path, "config.json")
    if not os.path.isfile(config_path):
        raise InteropError(f"{path} has no config.json; expected a directory written by save_pretrained.")
    hf = _read_hf_json(config_path)
    index = os.path.join(path, INDEX_FILE)
    if os.path.isfile(index):
        files = sorted(set(_read_hf_json(index).get("weight_map", {}).values()))
    elif os.path.isfile(os.path.join(path, SINGLE_FILE)):
        files = [SINGLE_FILE]
    else:
        raise InteropError(
            f"{path} has neither {SINGLE_FILE} nor {INDEX_FILE}; only safetensors checkpoints are read "
            "(re-save a .bin checkpoint with save_pretrained(..., safe_serialization=True))."
        )
    tensors: dict[str, np.ndarray] = {}
    for name in files:
        try:
            tensors.update(load_file(os.path.join(path, name)))
        except (OSError, SafetensorError) as e:
            raise InteropError(f"{os.path.join(path, name)} cannot be read as safetensors ({e}); re-save the "
                               "checkpoint with save_pretrained(..., safe_serialization=True).") from None
    return hf, tensors


def _read_hf_json(path: str) -> dict[str, Any]:
    """A JSON object file of an HF directory; an ``InteropError`` naming it if it is not one."""
    try:
        with open(path) as f:
            value = json.load(f)
    except (OSError, ValueError) as e:
        raise InteropError(f"{path} is not readable JSON ({e}); is the checkpoint complete?") from None
    if not isinstance(value, dict):
        raise InteropError(f"{path} holds {type(value).__name__}, not a JSON object; is it a save_pretrained file?")
    return value


def write_hf_dir(path: str, hf: Mapping[str, Any], tensors: Mapping[str, np.ndarray]) -> None:
    """config.json and one model.safetensors (with the metadata transformers checks for)."""
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(hf, f, indent=2, sort_keys=True)
    save_file(dict(tensors), os.path.join(path, SINGLE_FILE), metadata={"format": "pt"})


# ----------------------------------------------------------------------------------------------
# Workdirs
# ----------------------------------------------------------------------------------------------

EXPERIMENT_FILE = "experiment.py"
EXPERIMENT_SOURCE = '''"""Config of the model imported into this workdir by `python -m moejax.interop.hf import`.

Continue training from the imported parameters (fresh optimizer, moejax data):
    ./launch.sh {workdir}/experiment.py --workdir runs/NAME
"""

import json
import os

from moejax.config import from_dict

HERE = os.path.dirname(os.path.abspath(__file__))


def get_config():
    with open(os.path.join(HERE, "config.json")) as f:
        cfg = from_dict(json.load(f))
    cfg.checkpoint.init_from = HERE
    return cfg
'''


def _one_device_run(cfg: ConfigDict):
    """Validated config on a one-device mesh: orbax reshards to any mesh when the state is read."""
    cfg = config_lib.from_dict(config_lib.to_dict(cfg))
    for axis in config_lib.MESH_AXES:
        cfg.mesh[axis] = 1
    config_lib.validate(cfg, 1, notes=False)
    return cfg, setup(cfg, sharding.make_mesh({a: 1 for a in config_lib.MESH_AXES}, jax.devices()[:1]))


def import_to_workdir(hf_dir: str, workdir: str, *, force: bool = False) -> ConfigDict:
    """Writes a moejax workdir (step-0 checkpoint, config.json, experiment.py) from an HF directory.

    The checkpoint is a whole train state (fresh optimizer and balancing state) holding the
    imported parameters, so ``checkpoint.init_from=workdir``, evaluation and resuming all read it.
    An existing non-empty ``workdir`` is refused unless ``force``; the workdir is written beside
    its final name and renamed into place when complete.
    """
    paths.check_new_output(workdir, "--workdir", force=force)
    hf, tensors = read_hf_dir(hf_dir)
    cfg = config_lib.default_config()
    cfg.model = model_config_from_hf(hf)
    params = params_from_hf(tensors, cfg.model, hf["model_type"])
    cfg, run = _one_device_run(cfg)
    state = init_state(cfg, run)
    state["params"] = jax.device_put(params, run.state_shardings["params"])
    meta = {
        "config": config_lib.to_dict(cfg), "code_version": code_version(),
        # The HF tokenizer is not converted: this id matches no moejax tokenizer, so resuming
        # this workdir on moejax data stops with a tokenizer-mismatch error instead of training.
        "tokenizer": f"huggingface:{os.path.abspath(hf_dir)}",
    }
    with paths.replace_dir(workdir) as tmp:
        checkpointer = Checkpointer(os.path.join(tmp, "checkpoints"), max_to_keep=cfg.checkpoint.max_to_keep)
        checkpointer.save(0, state, {"imported_from": os.path.abspath(hf_dir)}, meta)
        checkpointer.close()
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(meta["config"], f, indent=2)
        with open(os.path.join(tmp, HF_CONFIG_COPY), "w") as f:
            json.dump(hf, f, indent=2)
        with open(os.path.join(tmp, EXPERIMENT_FILE), "w") as f:
            f.write(EXPERIMENT_SOURCE.format(workdir=workdir))
    return cfg


def _read_json(path: str) -> dict | None:
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f)


def import_source(workdir: str, cfg: ConfigDict) -> str | None:
    """The Hugging Face directory a workdir's parameters were imported from, if any: its own
    import, or that of the workdir it started from (``checkpoint.init_from``)."""
    from moejax.eval.restore import latest_meta

    for candidate in (workdir, cfg.checkpoint.init_from):
        tokenizer = str((latest_meta(candidate) if candidate else {}).get("tokenizer", ""))
        if tokenizer.startswith("huggingface:"):
            return tokenizer.split(":", 1)[1]
    return None


def check_export_target(workdir: str, cfg: ConfigDict, hf_dir: str, force: bool) -> None:
    """Refuses to write into the checkpoint the run was imported from, or over any non-empty
    directory, unless ``force``."""
    source = import_source(workdir, cfg)
    is_source = source is not None and os.path.realpath(source) == os.path.realpath(hf_dir)
    what = ("the Hugging Face checkpoint this run was imported from" if is_source
            else "a Hugging Face checkpoint" if os.path.isfile(os.path.join(hf_dir, "config.json"))
            else "files")
    paths.check_new_output(hf_dir, "--hf-dir", force=force, what=what)


def export_from_workdir(
    workdir: str, hf_dir: str, *, step: int | None = None, arch: str | None = None, dtype: str = "float32",
    force: bool = False,
) -> str:
    """Writes config.json + model.safetensors of a workdir's checkpoint; returns the architecture.

    The balancing objectives' selection bias (loss-free) is folded into the router bias. Without
    ``arch``: the architecture the workdir was imported from, else the first that fits exactly.
    An existing non-empty ``hf_dir`` is refused unless ``force``; then it is replaced as a whole
    (written beside it and renamed into place), so no file of the old checkpoint stays beside
    the new one.
    """
    raw = _read_json(os.path.join(workdir, "config.json"))
    if raw is None:
        raise InteropError(f"--workdir {workdir} has no config.json; is it a moejax workdir?")
    check_export_target(workdir, config_lib.from_dict(raw), hf_dir, force)
    cfg, run = _one_device_run(config_lib.from_dict(raw))
    checkpointer = Checkpointer(os.path.join(workdir, "checkpoints"), max_to_keep=cfg.checkpoint.max_to_keep)
    steps = checkpointer.steps()
    step = steps[-1] if step is None and steps else step
    if step not in steps:
        checkpointer.close()
        raise InteropError(f"--workdir {workdir} has no checkpoint at step {step} (steps: {steps}).")
    checkpointer.check_compatible(step, run.abstract_state)
    state = jax.device_get(checkpointer.restore(step, run.abstract_state).state)
    checkpointer.close()
    params, m = state["params"], cfg.model
    bias_le = jax.vmap(run.balancer.selection_bias)(state["balance"]) if state["balance"] else None
    if bias_le is not None and np.any(bias_le):
        params, m = fold_selection_bias(params, np.asarray(bias_le), m)
    base = _read_json(os.path.join(workdir, HF_CONFIG_COPY))
    arch = arch or choose_architecture(m, preferred=(base or {}).get("model_type"))
    hf = hf_config_from_model(
        m, arch, dtype=dtype, max_positions=cfg.train.seq_len,
        base=base if (base or {}).get("model_type") == arch else None,
    )
    tensors = params_to_hf(adapt_params(params, m, arch), adapted_config(m, arch), arch)
    with paths.replace_dir(hf_dir) as tmp:
        write_hf_dir(tmp, hf, {k: _cast(k, v, dtype) for k, v in tensors.items()})
    return arch


def _cast(name: str, value: np.ndarray, dtype: str) -> np.ndarray:
    """The export dtype, except the selection bias: float32, as DeepSeek-V3 keeps it."""
    return value if name.endswith("e_score_correction_bias") else value.astype(DTYPES[dtype])


# ----------------------------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m moejax.interop.hf",
        description="Import Hugging Face MoE checkpoints into moejax workdirs, or export them back.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    imp = sub.add_parser("import", help="HF directory (config.json + safetensors) -> moejax workdir")
    imp.add_argument("--hf-dir", required=True, help="directory written by save_pretrained")
    imp.add_argument("--workdir", required=True, help="new moejax workdir to write")
    imp.add_argument("--force", action="store_true", help="replace an existing non-empty --workdir (as a whole)")
    exp = sub.add_parser("export", help="moejax workdir checkpoint -> HF directory")
    exp.add_argument("--workdir", required=True, help="moejax workdir with checkpoints/")
    exp.add_argument("--step", type=int, default=None, help="checkpoint step (default: the latest)")
    exp.add_argument("--hf-dir", required=True, help="output directory (config.json, model.safetensors)")
    exp.add_argument("--arch", choices=SUPPORTED, default=None, help="target model_type (default: chosen)")
    exp.add_argument("--dtype", choices=tuple(DTYPES), default="float32", help="tensor dtype written")
    exp.add_argument("--force", action="store_true",
                     help="replace an existing non-empty --hf-dir (as a whole), even the run's import source")
    for command in (imp, exp):
        add_verbosity_flags(command)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    args.hf_dir, args.workdir = paths.user_path(args.hf_dir), paths.user_path(args.workdir)
    setup_logging(args.verbosity)
    absl_logging.set_verbosity(absl_logging.ERROR)  # orbax's notes on items a restore skips
    try:
        if args.command == "import":
            cfg = import_to_workdir(args.hf_dir, args.workdir, force=args.force)
            print(f"imported {args.hf_dir} into {args.workdir} (step 0); train from it with: "
                  f"./launch.sh {os.path.join(args.workdir, EXPERIMENT_FILE)} --workdir runs/NAME"
                  f" ({cfg.model.num_layers} layers, {cfg.model.moe.num_experts} experts)")
        else:
            arch = export_from_workdir(args.workdir, args.hf_dir, step=args.step, arch=args.arch, dtype=args.dtype,
                                       force=args.force)
            print(f"exported {args.workdir} as {arch} to {args.hf_dir}")
    except (InteropError, ConfigError) as e:
        sys.stderr.write(f"moejax: error: {e}\n")
        sys.exit(2)
    except KeyboardInterrupt:
        target = args.workdir if args.command == "import" else args.hf_dir
        sys.stderr.write(f"moejax: interrupted; nothing was written to {target} (it is renamed into place "
                         "only when complete). Rerun the command.\n")
        sys.exit(130)


if __name__ == "__main__":
    main()
