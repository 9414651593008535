"""Workdirs: a Hugging Face checkpoint imported into a moejax workdir (a step-0 train state, its
config and an ``experiment.py`` to train from), and a workdir's checkpoint exported back."""

from __future__ import annotations

import json
import os

import jax
import numpy as np

from moejax import checks, code_version, paths, sharding
from moejax import config as config_lib
from moejax.config import ConfigDict
from moejax.interop.hf.configs import adapted_config, choose_architecture, hf_config_from_model, model_config_from_hf
from moejax.interop.hf import tokenizer_files
from moejax.interop.hf.errors import InteropError
from moejax.interop.hf.files import read_hf_dir, write_hf_dir
from moejax.interop.hf.tensors import adapt_params, fold_selection_bias, params_from_hf, params_to_hf
from moejax.model.transformer import DTYPES
from moejax.train.checkpoint import Checkpointer
from moejax.train.state import init_state, setup

HF_CONFIG_COPY = "hf_config.json"  # the imported config.json, kept in the workdir for export
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
    checks.validate(cfg, 1, notes=False)
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
    tokenizer = tokenizer_files.source_tokenizer(hf_dir, cfg.model.vocab_size)
    params = params_from_hf(tensors, cfg.model, hf["model_type"])
    cfg, run = _one_device_run(cfg)
    state = init_state(cfg, run)
    state["params"] = jax.device_put(params, run.state_shardings["params"])
    meta = {
        "config": config_lib.to_dict(cfg), "code_version": code_version(), "hf_source": os.path.abspath(hf_dir),
        "tokenizer": tokenizer_files.tokenizer_id(tokenizer, hf_dir),  # only data prepared with it is accepted
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
        tokenizer_files.export_tokenizer(workdir, cfg, _checkpoint_tokenizer(workdir, step), tmp)
    return arch


def _checkpoint_tokenizer(workdir: str, step: int) -> str | None:
    from moejax.eval.restore import read_meta

    return read_meta(os.path.join(workdir, "checkpoints", str(step))).get("tokenizer")


def _cast(name: str, value: np.ndarray, dtype: str) -> np.ndarray:
    """The export dtype, except the selection bias: float32, as DeepSeek-V3 keeps it."""
    return value if name.endswith("e_score_correction_bias") else value.astype(DTYPES[dtype])
