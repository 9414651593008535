"""Writing a pruned checkpoint: a new workdir whose MoE layers hold only the kept experts.

From the source checkpoint, per MoE layer, the kept experts' weights (``w_gate_edf``, ``w_up_edf``,
``w_down_efd``, possibly replaced by a method's refit) and the kept columns of the router
(``w_de``, and ``select_bias_e`` with ``router_bias``) are taken, in increasing original id; every
other parameter is copied unchanged. The balancing state's per-expert leaves ([MoE layers, E])
keep the same experts. The config says ``model.moe.num_experts = K`` when every layer keeps K, and
``model.moe.layer_experts`` (with ``num_experts`` the largest count) when the counts differ.

The workdir holds a whole train state at the source's step (the pruned parameters and balancing
state, the step counter, a fresh optimizer state), the source's data-iterator state, ``config.json``,
``experiment.py`` (to continue training from the pruned parameters with a fresh optimizer) and
``prune.json`` (what was pruned, how, and what it cost). So ``moejax.eval``, ``moejax.generate``,
training (resuming it, or a new run from ``experiment.py``) and the Hugging Face export read it
like any workdir (the export only when every layer keeps the same count: Hugging Face MoE configs
hold one).
"""

from __future__ import annotations

import json
import os
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp  # type: ignore[import-untyped]
from etils import epath  # type: ignore[import-untyped]

from moejax import checks, code_version, paths, sharding
from moejax import config as config_lib
from moejax import configs as builtin_configs
from moejax.config import ConfigDict
from moejax.errors import ConfigError
from moejax.eval.restore import Checkpoint, EvalRun, fill_defaults, read_meta
from moejax.model.transformer import is_moe_layer, layer_runs
from moejax.prune.calibration import EXPERT_WEIGHTS
from moejax.train.checkpoint import Checkpointer
from moejax.train.state import init_state, setup

EXPERIMENT_DOC = """Config of the pruned model in this workdir (written by `python -m moejax.prune`).

Continue training from the pruned parameters (fresh optimizer and data stream):
    python -m moejax.main --config {workdir}/experiment.py --workdir runs/NAME"""
RECORD_FILE = "prune.json"


def pruned_config(saved: dict[str, Any], counts: list[int]) -> ConfigDict:
    """The source's saved config with the pruned expert counts (uniform or per layer)."""
    cfg = config_lib.from_dict(fill_defaults(saved, config_lib.default_config().to_dict()))
    moe = cfg.model.moe
    moe.num_experts = max(counts)
    moe.layer_experts = () if len(set(counts)) == 1 else tuple(int(c) for c in counts)
    if moe.layer_experts and moe.backend == "expert_parallel":
        moe.backend = "dropless"  # expert parallelism needs one count in every layer
    return cfg


def _path(path) -> str:
    return "/".join(str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path)


def _flat(tree) -> dict[str, Any]:
    return {_path(p): leaf for p, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def per_layer(params: Any, model_cfg) -> tuple[list[dict[str, np.ndarray]], dict[str, np.ndarray]]:
    """Every decoder layer's parameters ({path within the block: array}) and the rest, as numpy."""
    flat = {k: np.asarray(jax.device_get(v)) for k, v in _flat(params).items()}
    layers: list[dict[str, np.ndarray]] = []
    for run, (_, count) in enumerate(layer_runs(model_cfg)):
        prefix = f"layers/{run}/"
        block = {k[len(prefix):]: v for k, v in flat.items() if k.startswith(prefix)}
        layers.extend({k: v[i] for k, v in block.items()} for i in range(count))
    rest = {k: v for k, v in flat.items() if not k.startswith("layers/")}
    return layers, rest


def prune_params(params: Any, model_cfg, new_cfg: ConfigDict, abstract: Any, keep: list[tuple[int, ...]],
                 replaced: list[dict[str, np.ndarray] | None]) -> Any:
    """The pruned parameter tree, shaped like ``abstract`` (the pruned model's)."""
    layers, rest = per_layer(params, model_cfg)
    moe_layer = 0
    for layer, block in enumerate(layers):
        if not is_moe_layer(model_cfg, layer):
            continue
        ids = np.asarray(keep[moe_layer], int)
        new_weights = replaced[moe_layer] or {}
        for key in list(block):
            # A parameter's path within the block, without the leaf's "value" entry (if any).
            name = key.removesuffix("/value").removesuffix("/.value")
            if name in {f"mlp/{w}" for w in EXPERT_WEIGHTS}:
                block[key] = np.asarray(new_weights.get(name.split("/")[-1], block[key]))[ids]
            elif name == "mlp/router/w_de":
                block[key] = block[key][:, ids]
            elif name == "mlp/router/select_bias_e":
                block[key] = block[key][ids]
        moe_layer += 1
    flat: dict[str, np.ndarray] = dict(rest)
    start = 0
    for run, (_, count) in enumerate(layer_runs(new_cfg.model)):
        for key in layers[start]:
            flat[f"layers/{run}/{key}"] = np.stack([layers[start + i][key] for i in range(count)])
        start += count
    wanted = _flat(abstract)
    missing = sorted(set(wanted) - set(flat))
    if missing:
        raise ConfigError(f"the pruned model has parameters the source lacks: {missing[:5]}")
    leaves = []
    for path, target in wanted.items():
        value = flat[path]
        if tuple(value.shape) != tuple(target.shape):
            raise ConfigError(f"pruned parameter {path} has shape {value.shape}, the pruned model wants {target.shape}")
        leaves.append(value.astype(target.dtype))
    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(abstract), leaves)


def prune_balance(balance: dict, target: dict, keep: list[tuple[int, ...]], old_e: int, new_e: int) -> dict:
    """The balancing state's per-expert leaves [L, E] cut to the kept experts (padded with zeros
    to ``new_e`` in layers that keep fewer); other leaves unchanged."""
    if not balance:
        return target

    def cut(new, old):
        old = np.asarray(jax.device_get(old))
        if old.ndim == 2 and old.shape == (len(keep), old_e):
            out = np.zeros((len(keep), new_e), old.dtype)
            for layer, ids in enumerate(keep):
                out[layer, :len(ids)] = old[layer, np.asarray(ids, int)]
            return out
        return old.astype(new.dtype).reshape(new.shape)

    return jax.tree.map(cut, target, balance)


def write_pruned(
    erun: EvalRun, ckpt: Checkpoint, keep: list[tuple[int, ...]], out: str, *,
    replaced: list[dict[str, np.ndarray] | None] | None = None, record: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Writes the pruned workdir ``out`` (refused if it exists); returns its summary (parameter
    counts and bytes before and after, the counts per layer), also stored in ``prune.json``."""
    if os.path.lexists(out):
        raise ConfigError(f"--out {out} already exists; the pruned workdir is written to a new path. Choose "
                          "another --out, or remove it first.")
    step_dir = os.path.join(erun.checkpoint_dir, str(ckpt.step))
    meta = read_meta(step_dir)
    saved = meta.get("config") or config_lib.to_dict(erun.cfg)
    counts = [len(k) for k in keep]
    cfg = pruned_config(saved, counts)
    one = config_lib.from_dict(config_lib.to_dict(cfg))
    for axis in config_lib.MESH_AXES:
        one.mesh[axis] = 1
    checks.validate(one, 1, notes=False)
    run = setup(one, sharding.make_mesh({a: 1 for a in config_lib.MESH_AXES}, jax.devices()[:1]))
    state = init_state(one, run)
    replaced = replaced or [None] * len(keep)
    params = prune_params(ckpt.params, erun.cfg.model, cfg, run.abstract_state["params"], keep, replaced)
    state["params"] = jax.device_put(params, run.state_shardings["params"])
    # Resuming in the pruned workdir continues the source's step (and learning-rate schedule),
    # with fresh optimizer moments.
    state["step"] = jax.device_put(np.asarray(ckpt.step, np.int32), run.state_shardings["step"])
    if state["balance"]:
        balance = prune_balance(ckpt.balance, jax.device_get(state["balance"]), keep,
                                erun.cfg.model.moe.num_experts, cfg.model.moe.num_experts)
        state["balance"] = jax.device_put(balance, run.state_shardings["balance"])
    data_dir = epath.Path(step_dir) / "data"
    data = ocp.JsonCheckpointHandler().restore(data_dir, args=ocp.args.JsonRestore()) if data_dir.is_dir() else {}
    summary = summarize(ckpt.params, params, counts, erun.cfg.model.moe.num_experts)
    record = {**(record or {}), **summary, "source": erun.workdir, "step": ckpt.step,
              "keep": [list(map(int, k)) for k in keep]}
    new_meta = {**meta, "config": config_lib.to_dict(cfg), "code_version": code_version(), "pruned": {
        k: record[k] for k in ("source", "step", "method", "keep") if k in record}}
    os.makedirs(os.path.dirname(os.path.abspath(out)) or ".", exist_ok=True)
    with paths.replace_dir(out) as tmp:
        checkpointer = Checkpointer(os.path.join(tmp, "checkpoints"), max_to_keep=cfg.checkpoint.max_to_keep)
        checkpointer.save(ckpt.step, state, data or {}, new_meta)
        checkpointer.close()
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(new_meta["config"], f, indent=2)
        with open(os.path.join(tmp, "experiment.py"), "w") as f:
            f.write(builtin_configs.init_from_workdir_source(EXPERIMENT_DOC.format(workdir=out)))
        with open(os.path.join(tmp, RECORD_FILE), "w") as f:
            json.dump(record, f, indent=1)
    return record


def summarize(old_params: Any, new_params: Any, counts: list[int], old_e: int) -> dict[str, Any]:
    """Parameter counts and bytes (of the arrays themselves) before and after."""
    count = lambda tree: int(sum(np.size(x) for x in jax.tree.leaves(tree)))
    nbytes = lambda tree: int(sum(np.asarray(jax.device_get(x)).nbytes for x in jax.tree.leaves(tree)))
    return {
        "experts_per_layer": counts, "experts_before": old_e,
        "params_before": count(old_params), "params_after": count(new_params),
        "param_bytes_before": nbytes(old_params), "param_bytes_after": nbytes(new_params),
    }
