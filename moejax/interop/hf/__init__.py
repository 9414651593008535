"""Hugging Face ``transformers`` checkpoints <-> moejax: configs, tensors, files and a CLI.

    python -m moejax.interop.hf import --hf-dir DIR --workdir OUT
    python -m moejax.interop.hf export --workdir DIR [--step N] [--arch NAME] [--dtype D] --hf-dir OUT

Supported ``model_type`` values: ``mixtral``, ``qwen2_moe``, ``qwen3_moe`` and ``dots1`` (the
DeepSeek-V3 MoE -- sigmoid scores, selection bias, group-limited top-k, scaled routed output,
shared experts, leading dense layers -- with standard grouped-query attention); the dense
``llama``, ``qwen2`` and ``qwen3`` are imported (every layer dense) but not exported: upcycle
them into an MoE with ``moejax upcycle`` (:mod:`moejax.upcycle`). Conversion is
exact or refused: every config value moejax cannot reproduce (a sliding window, RoPE scaling, an
o_proj bias, multi-head latent attention, ...) is an :class:`InteropError` that names the key.
Only numpy and safetensors are needed (no torch). Mapping table and limitations:
docs/hf_interop.md.

Modules, in the order a conversion uses them (every public name is also importable from here):

==================  ===============================================================================
``errors``          :class:`InteropError`
``configs``         ``config.json`` <-> moejax model config per architecture (defaults, refusals, REQUIRES)
``tensors``         tensor names and layouts per architecture <-> the moejax parameter tree
``safetensors_io``  safetensors read one tensor at a time, written as a stream of shards
``files``           a checkpoint directory (config.json + safetensors) read and written
``saved_params``    a moejax checkpoint's parameters read one at a time (export)
``workdir``         import into a moejax workdir, export from one
``cli``             ``python -m moejax.interop.hf`` (``__main__``)
==================  ===============================================================================
"""

from moejax.interop.hf.cli import main
from moejax.interop.hf.configs import (
    CLASS_NAMES,
    COMMON_DEFAULTS,
    DEFAULTS,
    DENSE,
    FROM_HF,
    IMPORTABLE,
    REQUIRES,
    STALE_KEYS,
    SUPPORTED,
    TO_HF,
    adapted_config,
    architecture,
    cannot_express,
    choose_architecture,
    hf_config_from_model,
    model_config_from_hf,
)
from moejax.interop.hf.errors import InteropError
from moejax.interop.hf.files import INDEX_FILE, SINGLE_FILE, open_hf_dir, read_hf_dir, write_hf_dir
from moejax.interop.hf.safetensors_io import DEFAULT_MAX_SHARD_SIZE, HFTensors, parse_size
from moejax.interop.hf.saved_params import SavedParams, write_params_checkpoint
from moejax.interop.hf.tensors import (
    IGNORED_SUFFIXES,
    LINEAR_IN,
    LINEAR_OUT,
    MOE_NAMES,
    ROW,
    SAME,
    TOP_LEVEL,
    VECTOR,
    Layout,
    Names,
    abstract_params,
    adapt_params,
    exported_leaf,
    fold_selection_bias,
    params_from_hf,
    params_to_hf,
)
from moejax.interop.hf.workdir import (
    EXPERIMENT_FILE,
    EXPERIMENT_DOC,
    HF_CONFIG_COPY,
    check_export_target,
    export_from_workdir,
    import_source,
    import_to_workdir,
)

__all__ = [
    "CLASS_NAMES", "COMMON_DEFAULTS", "DEFAULTS", "DENSE", "IMPORTABLE", "DEFAULT_MAX_SHARD_SIZE", "HFTensors", "EXPERIMENT_DOC", "EXPERIMENT_FILE", "FROM_HF", "HF_CONFIG_COPY",
    "IGNORED_SUFFIXES", "INDEX_FILE", "LINEAR_IN", "LINEAR_OUT", "MOE_NAMES", "REQUIRES", "ROW", "SAME", "SINGLE_FILE",
    "STALE_KEYS", "SUPPORTED", "SavedParams", "TOP_LEVEL", "TO_HF", "VECTOR", "InteropError", "Layout", "Names", "abstract_params",
    "adapt_params", "adapted_config", "architecture", "cannot_express", "check_export_target", "choose_architecture",
    "export_from_workdir", "exported_leaf", "fold_selection_bias", "hf_config_from_model", "import_source", "import_to_workdir", "main",
    "model_config_from_hf", "open_hf_dir", "params_from_hf", "parse_size", "write_params_checkpoint", "params_to_hf", "read_hf_dir", "write_hf_dir",
]
