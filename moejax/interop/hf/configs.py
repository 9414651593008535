"""Configs: a Hugging Face ``config.json`` -> the moejax ``model`` config that computes the same
model, and back; per architecture, what transformers assumes for a missing key, what moejax
cannot reproduce (refused with the key named) and what each architecture fixes."""

from __future__ import annotations

import types
from typing import Any, Callable, Mapping

from moejax import config as config_lib
from moejax.config import ConfigDict
from moejax.interop.hf.errors import InteropError
from moejax.model.transformer import is_moe_layer

SUPPORTED = ("mixtral", "qwen2_moe", "qwen3_moe", "dots1")  # MoE: import and export
# Dense architectures: imported as a moejax model whose layers are all dense
# (model.first_k_dense = num_layers), e.g. to upcycle it (moejax.upcycle); not exported.
DENSE = ("llama", "qwen2", "qwen3")
IMPORTABLE = SUPPORTED + DENSE

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
    "llama": {"rope_theta": 1e4, "rms_norm_eps": 1e-6, "attention_bias": False, "mlp_bias": False},
    "qwen2": {"rope_theta": 1e4, "rms_norm_eps": 1e-6, "use_sliding_window": False},
    "qwen3": {"rope_theta": 1e4, "rms_norm_eps": 1e-6, "attention_bias": False, "use_sliding_window": False},
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
            f"{', '.join(IMPORTABLE)}; for the DeepSeek-V3 MoE with standard attention use 'dots1'."
        )
    if model_type not in IMPORTABLE:
        raise InteropError(f"config.json has model_type {model_type!r}; supported: {', '.join(IMPORTABLE)} "
                           f"(the dense {', '.join(DENSE)} are imported only).")
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


def _dense_from_hf(get, m: ConfigDict) -> None:
    """Llama, Qwen2, Qwen3: every layer a dense SwiGLU of width ``intermediate_size``."""
    m.mlp_dim = get("intermediate_size")
    m.moe.num_shared_experts = 0


def _llama_from_hf(get, m: ConfigDict) -> None:
    _dense_from_hf(get, m)
    _reject_attention_bias(get)
    if get("mlp_bias"):
        raise _unsupported("mlp_bias", True, "false (moejax's MLP has no biases)")


def _qwen2_from_hf(get, m: ConfigDict) -> None:
    _dense_from_hf(get, m)
    m.attn_bias = True  # Qwen2 always biases q, k and v (and never o)


def _qwen3_from_hf(get, m: ConfigDict) -> None:
    _dense_from_hf(get, m)
    _reject_attention_bias(get)
    m.qk_norm = True


def _hf_moe_layers(get, arch: str, num_layers: int) -> list[bool]:
    """Which layers are MoE, by each architecture's own rule (modeling_<model>.py)."""
    if arch in DENSE:
        return [False] * num_layers
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
    "dots1": _dots1_from_hf, "llama": _llama_from_hf, "qwen2": _qwen2_from_hf, "qwen3": _qwen3_from_hf,
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
    if arch not in DENSE:
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
    if not any(is_moe_layer(m, layer) for layer in range(m.num_layers)):
        return ["every layer is dense (dense models are imported, not exported; `moejax upcycle` makes an MoE "
                "of one)"]
    problems = [
        f"model.{key}={_value(m, key)!r} (needs {want!r})"
        for key, want in REQUIRES[arch].items() if _value(m, key) != want
    ]
    counts = tuple(m.moe.get("layer_experts", ()) or ())
    if counts and set(counts) != {m.moe.num_experts}:
        problems.append(f"model.moe.layer_experts={counts!r} (Hugging Face MoE configs hold one expert count for "
                        "all layers; a pruned workdir exports when every layer keeps the same number, e.g. "
                        "moejax.prune --keep K or --ratio R without --auto)")
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
