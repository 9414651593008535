"""A dense model (a moejax workdir or a Hugging Face directory) upcycled into a new moejax workdir.

The new workdir is an ordinary one: a whole train state at step 0 (the upcycled parameters, fresh
AdamW moments and balancing state), ``config.json``, ``experiment.py`` (train from it:
``./launch.sh OUT/experiment.py --workdir runs/NAME``), ``upcycle.json`` (what was done) and the
source's tokenizer files. Training in OUT itself resumes its step 0; evaluation, pruning and the
Hugging Face export (Mixtral, or Qwen2-MoE with ``--shared-expert``) read it like any workdir.
"""

from __future__ import annotations

import json
import os
from typing import Any

import jax
import numpy as np

from moejax import code_version, paths
from moejax import config as config_lib
from moejax import configs as builtin_configs
from moejax.config import ConfigDict
from moejax.errors import ConfigError
from moejax.eval.restore import fill_defaults, latest_meta
from moejax.interop.hf import tokenizer_files
from moejax.interop.hf.configs import model_config_from_hf
from moejax.interop.hf.files import open_hf_dir
from moejax.interop.hf.tensors import abstract_params, leaf_key, params_from_hf
from moejax.interop.hf.workdir import EXPERIMENT_FILE, one_device_run
from moejax.model.transformer import is_moe_layer, layer_runs
from moejax.train.checkpoint import Checkpointer, load_params
from moejax.train.state import init_state
from moejax.upcycle.experts import Plan, check_plan, function_preserving, upcycle_layer

RECORD_FILE = "upcycle.json"
EXPERIMENT_DOC = """Config of the MoE upcycled into this workdir by `moejax upcycle` (see upcycle.json).

Train from the upcycled parameters (fresh optimizer and data):
    ./launch.sh {workdir}/experiment.py --workdir runs/NAME"""


def _read_source(source: str) -> tuple[ConfigDict, dict, str, str | None]:
    """(config, parameters as numpy by leaf key, tokenizer id, directory holding tokenizer files)."""
    config_file = os.path.join(source, "config.json")
    if not os.path.isfile(config_file):
        raise ConfigError(f"--from {source} has no config.json; give a moejax workdir (config.json + checkpoints/) "
                          "or a Hugging Face directory (config.json + model.safetensors).")
    with open(config_file) as f:
        raw = json.load(f)
    if "model_type" in raw:  # a Hugging Face directory
        cfg = config_lib.default_config()
        cfg.model = model_config_from_hf(raw)
        _check_dense(cfg.model, source)
        hf, tensors = open_hf_dir(source)
        tokenizer = tokenizer_files.source_tokenizer(source, cfg.model.vocab_size)
        params = params_from_hf(tensors, cfg.model, hf["model_type"])
        flat = {leaf_key(k): np.asarray(v) for k, v in jax.tree_util.tree_flatten_with_path(params)[0]}
        return cfg, flat, tokenizer_files.tokenizer_id(tokenizer, source), source
    if not os.path.isdir(os.path.join(source, "checkpoints")):
        raise ConfigError(f"--from {source} has a config.json but no checkpoints/ (a moejax workdir) and no "
                          "model_type (a Hugging Face config.json); give a trained or imported workdir or an HF "
                          "directory.")
    cfg = config_lib.from_dict(fill_defaults(raw, config_lib.default_config().to_dict()))
    _check_dense(cfg.model, source)
    params, _ = load_params(source, abstract_params(cfg.model))
    flat = {leaf_key(k): np.asarray(v) for k, v in jax.tree_util.tree_flatten_with_path(params)[0]}
    meta = latest_meta(source)
    tokenizer_dir = next((os.path.join(d, tokenizer_files.TOKENIZER_DIR) for d in (source, cfg.checkpoint.init_from)
                          if d and os.path.isdir(os.path.join(d, tokenizer_files.TOKENIZER_DIR))), None)
    return cfg, flat, str(meta.get("tokenizer", "")), tokenizer_dir


def _check_dense(m: ConfigDict, source: str) -> None:
    moe = [layer for layer in range(m.num_layers) if is_moe_layer(m, layer)]
    if moe:
        raise ConfigError(f"--from {source} is already an MoE: layers {moe} of {m.num_layers} are MoE layers "
                          f"(model.first_k_dense={m.first_k_dense}, model.moe_every={m.moe_every}); upcycling "
                          "takes a dense model (every layer dense: model.first_k_dense = model.num_layers).")


def upcycled_config(cfg: ConfigDict, plan: Plan) -> ConfigDict:
    """The source's config with every layer an MoE as the plan says (softmax router, top-k
    renormalised, no selection bias, no groups; training settings kept)."""
    cfg = config_lib.from_dict(config_lib.to_dict(cfg))
    m = cfg.model
    width = check_plan(plan, m.mlp_dim)
    m.first_k_dense, m.moe_every = 0, 1
    moe = m.moe
    moe.num_experts, moe.experts_per_token, moe.expert_dim, moe.layer_experts = plan.experts, plan.top_k, width, ()
    moe.num_shared_experts = 1 if plan.shared_expert else 0
    moe.shared_expert_dim = m.mlp_dim if plan.shared_expert else 0
    moe.shared_gate, moe.score_func, moe.renormalize, moe.routed_scaling = False, "softmax", True, 1.0
    moe.router_bias, moe.num_groups, moe.topk_groups = False, 1, 1
    cfg.checkpoint.init_from = ""
    return cfg


def upcycled_params(flat: dict[str, np.ndarray], dense: ConfigDict, moe: ConfigDict, plan: Plan) -> dict:
    """The MoE's parameter tree: the dense model's, every MLP replaced by :func:`upcycle_layer`'s
    experts (router and drop draws from ``plan.seed``, layer by layer in depth order)."""
    rng = np.random.default_rng(plan.seed)
    out = dict(flat)
    for run, (_, count) in enumerate(layer_runs(dense)):  # every layer changes kind: the same runs
        prefix = f"layers/{run}/mlp/"
        dense_mlp = {name: out.pop(prefix + name) for name in ("w_gate_df", "w_up_df", "w_down_fd")}
        layers = [upcycle_layer(dense_mlp["w_gate_df"][i], dense_mlp["w_up_df"][i], dense_mlp["w_down_fd"][i],
                                plan, rng, router_std=dense.init_std) for i in range(count)]
        out.update({prefix + name: np.stack([layer[name] for layer in layers]) for name in layers[0]})
    target = abstract_params(moe)
    leaves = []
    for key_path, spec in jax.tree_util.tree_flatten_with_path(target)[0]:
        key = leaf_key(key_path)
        if key not in out or tuple(out[key].shape) != tuple(spec.shape):
            raise ConfigError(f"upcycled parameter {key} is {getattr(out.get(key), 'shape', 'missing')}; the MoE "
                              f"config wants {tuple(spec.shape)}.")
        leaves.append(out.pop(key))
    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(target), leaves)


def upcycle(source: str, workdir: str, plan: Plan) -> dict[str, Any]:
    """Writes ``workdir`` (refused if it exists and is not empty), the MoE upcycled from the dense
    model in ``source`` (a moejax workdir's latest checkpoint, or a Hugging Face directory of a
    dense Llama/Qwen2/Qwen3); returns the record also written to ``upcycle.json``."""
    paths.check_new_output(workdir, "--workdir", force=False)
    if os.path.realpath(source) == os.path.realpath(workdir):
        raise ConfigError(f"--workdir {workdir} is the --from directory; write the MoE to a new directory.")
    cfg, flat, tokenizer, tokenizer_dir = _read_source(source)
    dense = cfg.model
    out_cfg = upcycled_config(cfg, plan)  # the source's mesh and training settings
    moe_cfg, run = one_device_run(out_cfg)  # every config error before anything is written
    params = upcycled_params(flat, dense, moe_cfg.model, plan)
    state = init_state(moe_cfg, run)
    state["params"] = jax.device_put(
        jax.tree.map(lambda p, s: np.asarray(p).astype(s.dtype), params, run.abstract_state["params"]),
        run.state_shardings["params"],
    )
    width = moe_cfg.model.moe.expert_dim
    record = {
        "source": os.path.abspath(source), "method": plan.method, "experts": plan.experts, "top_k": plan.top_k,
        "expert_width": width, "dense_width": dense.mlp_dim, "slices": dense.mlp_dim // width,
        "shared_expert": plan.shared_expert, "drop_ratio": plan.drop_ratio if plan.method == "drop" else None,
        "seed": plan.seed, "function_preserving": function_preserving(plan, dense.mlp_dim),
    }
    meta = {"config": config_lib.to_dict(out_cfg), "code_version": code_version(), "tokenizer": tokenizer,
            "upcycled": record}
    with paths.replace_dir(workdir) as tmp:
        checkpointer = Checkpointer(os.path.join(tmp, "checkpoints"), max_to_keep=moe_cfg.checkpoint.max_to_keep)
        checkpointer.save(0, state, {"upcycled_from": os.path.abspath(source)}, meta)
        checkpointer.close()
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(meta["config"], f, indent=2)
        with open(os.path.join(tmp, EXPERIMENT_FILE), "w") as f:
            f.write(builtin_configs.init_from_workdir_source(EXPERIMENT_DOC.format(workdir=workdir)))
        with open(os.path.join(tmp, RECORD_FILE), "w") as f:
            json.dump(record, f, indent=1)
        if tokenizer_dir:
            tokenizer_files.copy_tokenizer(tokenizer_dir, tmp)
    return record
