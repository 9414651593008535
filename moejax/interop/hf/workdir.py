"""Workdirs: a Hugging Face checkpoint imported into a moejax workdir (a step-0 train state, its
config and an ``experiment.py`` to train from), and a workdir's checkpoint exported back."""

from __future__ import annotations

import json
import os

import jax
import numpy as np
import orbax.checkpoint as ocp

from moejax import checks, code_version, paths, sharding
from moejax import config as config_lib
from moejax import configs as builtin_configs
from moejax.config import ConfigDict
from moejax.interop.hf.configs import adapted_config, choose_architecture, hf_config_from_model, model_config_from_hf
from moejax.interop.hf import tokenizer_files
from moejax.interop.hf.errors import InteropError
from moejax.interop.hf.files import open_hf_dir, write_config
from moejax.interop.hf.safetensors_io import DEFAULT_MAX_SHARD_SIZE, Spec, parse_size, write_shards
from moejax.interop.hf.saved_params import SavedParams, write_params_checkpoint
from moejax.interop.hf.tensors import (
    abstract_params,
    exported_leaf,
    folded_config,
    hf_specs,
    hf_tensors,
    param_path,
    params_from_hf,
)
from moejax.model.transformer import DTYPES
from moejax.train.checkpoint import Checkpointer, CheckpointMismatch, describe_mismatch, flat_shapes
from moejax.train.state import init_state, setup

HF_CONFIG_COPY = "hf_config.json"  # the imported config.json, kept in the workdir for export
# Written last into an exported directory: the files the export wrote, so a later export --force
# replaces that directory only if nothing else was put there.
EXPORT_MARKER = "moejax_export.json"
EXPERIMENT_FILE = "experiment.py"
EXPERIMENT_DOC = """Config of the model imported into this workdir by `python -m moejax.interop.hf import`.

Continue training from the imported parameters (fresh optimizer, moejax data):
    ./launch.sh {workdir}/experiment.py --workdir runs/NAME"""


def one_device_run(cfg: ConfigDict):
    """Validated config on a one-device mesh: orbax reshards to any mesh when the state is read."""
    cfg = config_lib.from_dict(config_lib.to_dict(cfg))
    for axis in config_lib.MESH_AXES:
        cfg.mesh[axis] = 1
    checks.validate(cfg, 1, notes=False)
    return cfg, setup(cfg, sharding.make_mesh({a: 1 for a in config_lib.MESH_AXES}, jax.devices()[:1]))


def import_to_workdir(hf_dir: str, workdir: str, *, force: bool = False, with_optimizer: bool = False) -> ConfigDict:
    """Writes a moejax workdir (step-0 checkpoint, config.json, experiment.py) from an HF directory.

    The checkpoint holds the parameters only, each in the dtype of its tensors (bfloat16 stays
    bfloat16), read one tensor at a time: ``checkpoint.init_from=workdir`` (what ``experiment.py``
    sets), ``load_params``, evaluation and export read it; training starts a fresh optimizer.
    ``with_optimizer``: a whole train state instead (parameters cast to ``train.param_dtype``,
    fresh AdamW moments and balancing state), which a run in this workdir itself resumes.
    An existing non-empty ``workdir`` is refused unless ``force``; the workdir is written beside
    its final name and renamed into place when complete.
    """
    paths.check_new_output(workdir, "--workdir", force=force)
    hf, tensors = open_hf_dir(hf_dir)
    cfg = config_lib.default_config()
    cfg.model = model_config_from_hf(hf)
    tokenizer = tokenizer_files.source_tokenizer(hf_dir, cfg.model.vocab_size)
    cfg, run = one_device_run(cfg)  # config errors before any tensor is read
    params = params_from_hf(tensors, cfg.model, hf["model_type"])
    if with_optimizer:
        state = init_state(cfg, run)
        state["params"] = jax.device_put(
            jax.tree.map(lambda p, s: p.astype(s.dtype), params, run.abstract_state["params"]),
            run.state_shardings["params"],
        )
        del params
    meta = {
        "config": config_lib.to_dict(cfg), "code_version": code_version(), "hf_source": os.path.abspath(hf_dir),
        "tokenizer": tokenizer_files.tokenizer_id(tokenizer, hf_dir),  # only data prepared with it is accepted
    }
    with paths.replace_dir(workdir) as tmp:
        data = {"imported_from": os.path.abspath(hf_dir)}
        if with_optimizer:
            checkpointer = Checkpointer(os.path.join(tmp, "checkpoints"), max_to_keep=cfg.checkpoint.max_to_keep)
            checkpointer.save(0, state, data, meta)
            checkpointer.close()
        else:
            write_params_checkpoint(os.path.join(tmp, "checkpoints"), 0, params, data, meta)
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(meta["config"], f, indent=2)
        with open(os.path.join(tmp, HF_CONFIG_COPY), "w") as f:
            json.dump(hf, f, indent=2)
        with open(os.path.join(tmp, EXPERIMENT_FILE), "w") as f:
            f.write(builtin_configs.init_from_workdir_source(EXPERIMENT_DOC.format(workdir=workdir)))
        tokenizer_files.copy_tokenizer(hf_dir, tmp)
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
        meta = latest_meta(candidate) if candidate else {}
        tokenizer = str(meta.get("tokenizer", ""))
        if meta.get("hf_source") or tokenizer.startswith("huggingface:"):
            return meta.get("hf_source") or tokenizer.split(":", 1)[1]
    return None


def check_export_target(workdir: str, cfg: ConfigDict, hf_dir: str, force: bool) -> None:
    """Refuses an export target that is, holds or lies inside the workdir, and any non-empty
    directory unless ``force``; with ``force``, any directory but a previous export's own."""
    check_apart(workdir, hf_dir)
    source = import_source(workdir, cfg)
    is_source = source is not None and os.path.realpath(source) == os.path.realpath(hf_dir)
    what = ("the Hugging Face checkpoint this run was imported from" if is_source
            else "a Hugging Face checkpoint" if os.path.isfile(os.path.join(hf_dir, "config.json"))
            else "files")
    paths.check_new_output(hf_dir, "--hf-dir", force=force, what=what)
    if force and paths.is_non_empty_dir(hf_dir):
        check_only_exported_files(hf_dir, what)


def check_apart(workdir: str, hf_dir: str) -> None:
    """The export target and the workdir must not overlap (real paths: links resolved), whatever
    ``--force`` says: replacing the target would delete the checkpoints being exported."""
    source, target = os.path.realpath(workdir), os.path.realpath(hf_dir)
    if source == target:
        how = "is the workdir itself"
    elif _inside(target, source):
        how = f"lies inside the workdir {workdir}"
    elif _inside(source, target):
        how = f"contains the workdir {workdir}"
    else:
        return
    raise InteropError(f"--hf-dir {hf_dir} {how}: an export replaces its target directory as a whole, which "
                       "would delete the checkpoints it reads (--force or not). Choose a directory outside "
                       f"the workdir, e.g. {os.path.join(os.path.dirname(source.rstrip('/')) or '.', os.path.basename(source.rstrip('/')) + '_hf')}.")


def _inside(path: str, directory: str) -> bool:
    return os.path.commonpath([path, directory]) == directory and path != directory


def check_only_exported_files(hf_dir: str, what: str) -> None:
    """``--force`` replaces a previous export only: a directory whose every file is listed in its
    ``EXPORT_MARKER``. Anything else (an imported checkpoint, the user's files) is refused."""
    marker = _read_json(os.path.join(hf_dir, EXPORT_MARKER)) if os.path.isfile(os.path.join(hf_dir, EXPORT_MARKER)) else None
    listed = set(marker.get("files", ())) | {EXPORT_MARKER} if isinstance(marker, dict) else set()
    foreign = sorted(name for name in os.listdir(hf_dir) if name not in listed)
    if not foreign:
        return
    shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
    why = (f"it is not a moejax export (it holds {what}: {shown})" if marker is None
           else f"it holds files that export did not write ({shown})")
    raise InteropError(f"--hf-dir {hf_dir}: --force replaces only a previous export (the files listed in its "
                       f"{EXPORT_MARKER}), never files it did not write, and {why}. Choose a new or empty "
                       "directory, or move those files away first.")


def export_from_workdir(
    workdir: str, hf_dir: str, *, step: int | None = None, arch: str | None = None, dtype: str | None = None,
    force: bool = False, max_shard_size: str | int = DEFAULT_MAX_SHARD_SIZE,
) -> str:
    """Writes config.json + safetensors of a workdir's checkpoint; returns the architecture.

    Reads the parameters (and the small balancing state) only, one parameter at a time, and
    streams the HF tensors into shards of at most ``max_shard_size`` (one ``model.safetensors``
    when all fit, else ``model-0000i-of-0000n.safetensors`` + ``model.safetensors.index.json``).
    ``dtype``: cast every tensor to it (except ``e_score_correction_bias``, float32); None keeps
    each parameter's saved dtype. The balancing objectives' selection bias (loss-free) is folded
    into the router bias. Without ``arch``: the architecture the workdir was imported from, else
    the first that fits exactly. A ``hf_dir`` that is, holds or lies inside ``workdir`` is always
    refused, and an existing non-empty one unless ``force``; with ``force`` only a previous export
    (every file listed in its ``EXPORT_MARKER``) is replaced, as a whole (written beside it and
    renamed into place), so no file of the old checkpoint stays beside the new one.
    """
    max_bytes = parse_size(max_shard_size)
    raw = _read_json(os.path.join(workdir, "config.json"))
    if raw is None:
        raise InteropError(f"--workdir {workdir} has no config.json; is it a moejax workdir?")
    check_export_target(workdir, config_lib.from_dict(raw), hf_dir, force)
    cfg, run = one_device_run(config_lib.from_dict(raw))
    checkpoint_dir = os.path.join(workdir, "checkpoints")
    steps = sorted(ocp.utils.checkpoint_steps(checkpoint_dir)) if os.path.isdir(checkpoint_dir) else []
    step = steps[-1] if step is None and steps else step
    if step not in steps:
        raise InteropError(f"--workdir {workdir} has no checkpoint at step {step} (steps: {steps}).")
    saved = SavedParams(os.path.join(checkpoint_dir, str(step)))
    try:
        problems = describe_mismatch(saved.shapes(), flat_shapes(run.abstract_state["params"]))
        if problems:
            raise CheckpointMismatch(f"checkpoint {checkpoint_dir}/{step} does not fit the configured model:\n  "
                                     + "\n  ".join(problems[:20]))
        m, bias_le = cfg.model, None
        if "balance" in saved.items() and run.abstract_state["balance"]:
            bias_le = jax.vmap(run.balancer.selection_bias)(saved.read_item("balance"))
            bias_le = np.asarray(bias_le) if bias_le is not None and np.any(bias_le) else None
        m_out = folded_config(m) if bias_le is not None else m
        base = _read_json(os.path.join(workdir, HF_CONFIG_COPY))
        arch = arch or choose_architecture(m_out, preferred=(base or {}).get("model_type"))
        target = adapted_config(m_out, arch)
        leaves = [(param_path(k), spec.shape) for k, spec in jax.tree_util.tree_flatten_with_path(abstract_params(target))[0]]
        probe = _DtypeProbe(saved)
        leaf_dtypes = [exported_leaf(path, probe, m, arch, bias_le).dtype for path, _ in leaves]
        specs = [
            Spec(name, shape, _out_dtype(name, leaf_dtype, dtype))
            for (path, leaf_shape), leaf_dtype in zip(leaves, leaf_dtypes)
            for name, shape in hf_specs(path, leaf_shape, target, arch)
        ]
        hf = hf_config_from_model(
            m_out, arch, dtype=dtype or np.dtype(saved.dtype("embed_vd")).name, max_positions=cfg.train.seq_len,
            base=base if (base or {}).get("model_type") == arch else None,
        )

        def tensors():
            for path, _ in leaves:
                value = exported_leaf(path, saved, m, arch, bias_le)
                for name, tensor in hf_tensors(path, value, target, arch):
                    yield name, tensor.astype(_out_dtype(name, tensor.dtype, dtype), copy=False)
                # a tensor may be a view of the parameter, and a SavedArray holds the parameter's decoded
                # chunks: either would keep the parameter alive during the next read
                del value, tensor

        with paths.replace_dir(hf_dir) as tmp:
            if tokenizer_files.export_tokenizer(workdir, cfg, _checkpoint_tokenizer(workdir, step), tmp):
                hf = {**tokenizer_files.special_token_ids(tmp), **hf}  # the checkpoint's own config wins
            write_config(tmp, hf)
            write_shards(tmp, specs, tensors(), max_bytes)
            with open(os.path.join(tmp, EXPORT_MARKER), "w") as f:
                json.dump({"workdir": os.path.abspath(workdir), "step": step, "architecture": arch,
                           "files": sorted(os.listdir(tmp))}, f, indent=2)
    finally:
        saved.close()
    return arch


def _checkpoint_tokenizer(workdir: str, step: int) -> str | None:
    from moejax.eval.restore import read_meta

    return read_meta(os.path.join(workdir, "checkpoints", str(step))).get("tokenizer")


class _DtypeProbe:
    """A leaf source of one-element arrays of the saved dtypes: what ``exported_leaf`` returns for it
    has the exported dtype, computed without reading the checkpoint."""

    def __init__(self, saved: SavedParams):
        self.saved = saved

    def has(self, key: str) -> bool:
        return self.saved.has(key)

    def dtype(self, key: str) -> np.dtype:
        return self.saved.dtype(key)

    def read(self, key: str) -> np.ndarray:
        return np.zeros(1, self.saved.dtype(key))

    def view(self, key: str) -> np.ndarray:
        return self.read(key)


def _out_dtype(name: str, dtype: np.dtype, cast: str | None) -> np.dtype:
    """The export dtype, except the selection bias: float32, as DeepSeek-V3 keeps it."""
    if cast is None or name.endswith("e_score_correction_bias"):
        return np.dtype(dtype)
    return np.dtype(DTYPES[cast])
