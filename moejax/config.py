"""Default configuration and its generic validation.

Every experiment file in ``experiments/`` defines ``get_config()``, which starts from
:func:`default_config` and overrides what it needs. Every knob is documented here, where it is
defined. :func:`check_values` checks the schema and the knobs one by one (and the relations this
module can judge alone): it rejects unknown keys (with a did-you-mean), wrong types and
incompatible values, and its errors name the key, the value, what is allowed and how to fix it.

The ``model.*`` keys are declared once each, as the fields of the typed configs the model
receives (:mod:`moejax.schema`: ``ModelConfig``, ``MoEConfig``, ``DispatchConfig``, ``L3Config``,
converted once from this ConfigDict with ``from_config``), where each is documented: the ``model``
group of :func:`default_config` is generated from them (``schema.defaults``), and so are their
allowed choices (:data:`CHOICES`) and ``> 0`` / ``>= 0`` bounds (:data:`POSITIVE`,
:data:`NON_NEGATIVE`); the other groups' keys are defined and documented here, their checks
listed by hand.

This module imports no package of moejax, only the two leaf modules :mod:`moejax.errors` and
:mod:`moejax.schema` (which import nothing from moejax), so every package may import it. Why the
declarations live in a leaf rather than in ``moejax.model``: this module generates its checks from
them when imported, and importing the model package would pull in JAX and Flax and invert the
layering; a registration hook filled by ``moejax.checks`` would make ``CHOICES`` depend on what
was imported first. The checks that need a package (the balancing objectives, the L3 sizes and
allocation file, the dataset) belong to that package and are composed, with :func:`check_values`,
in :mod:`moejax.checks`: call :func:`moejax.checks.validate` (or ``check_config``) before
compiling, not :func:`check_values` alone.
"""

from __future__ import annotations

import difflib
import importlib.machinery
import importlib.util
import itertools
import json
import logging
import math
import os
import re
import sys
import traceback
from collections.abc import Mapping, Sequence
from typing import Any

from ml_collections import ConfigDict

from moejax import schema
from moejax.errors import ConfigError, fail_config_key as _fail


log = logging.getLogger(__name__)


def default_config() -> ConfigDict:
    """The full set of knobs with defaults sized for the tiny CPU run."""
    c = ConfigDict()

    c.train = ConfigDict()
    c.train.steps = 400  # optimizer steps to run in total (a resumed run continues to this)
    c.train.seed = 0  # seeds parameter init and data order
    c.train.global_batch_size = 16  # sequences per optimizer step, over all devices and micro-batches
    c.train.seq_len = 256  # tokens per sequence
    c.train.grad_accum_steps = 1  # micro-batches per step (the global batch is split into these)
    c.train.log_every = 10  # steps between metric lines (stdout, metrics.jsonl, TensorBoard)
    c.train.eval_every = 100  # steps between held-out evaluations (also at step 0 and at the end)
    c.train.eval_batches = 2  # held-out batches per domain at each evaluation
    # Which held-out windows an evaluation reads (docs/data.md, "The pipeline"): sampled (windows
    # drawn across each domain's whole held-out split, the same for every run and seed) | first (its
    # first consecutive windows: the behaviour before this key; a config.json without it means first).
    c.train.eval_windows = "sampled"
    c.train.compute_dtype = "float32"  # activations/matmuls: float32 | bfloat16 (router stays float32)
    c.train.param_dtype = "float32"  # stored parameters and optimizer moments: float32 | bfloat16
    # Activation rematerialisation per transformer block: none | full (recompute each block in the
    # backward pass; least memory) | save_dots (keep weight-matmul outputs, recompute the rest).
    # Same numbers either way; trades step time for activation memory (see experiments/tools/compile_check.py).
    c.train.remat = "none"
    # Apply each run of stacked layers with a scan: compile time independent of depth, and needed
    # for remat to save memory. False unrolls it: same numbers, faster steps on CPU for shallow models
    # (measured in docs/memory.md).
    c.train.scan_layers = False
    c.train.peak_flops_per_device = 0.0  # FLOP/s peak for MFU; 0 means unknown (MFU reported n/a)
    c.train.max_bad_steps = 10  # stop after this many consecutive non-finite steps (each is skipped)
    # Where the logged metrics go, comma-separated (docs/tracking.md): jsonl (WORKDIR/metrics.jsonl;
    # always on: resuming, the run's summary and data_mixture read it) | tensorboard (event files in
    # WORKDIR) | wandb | mlflow. Each gets the same scalars; tensorboard and wandb also get the expert
    # loads as histograms. wandb and mlflow are opt-in: pip install "moejax[track]".
    c.train.loggers = "jsonl,tensorboard"
    c.train.project = "moejax"  # wandb: the project; mlflow: the experiment
    c.train.run_name = ""  # wandb/mlflow run name; "": the workdir's name
    c.train.tags = ""  # wandb/mlflow tags, comma-separated, e.g. "baseline,phi"
    # The wandb/mlflow run to log to (letters, digits, '_', '-'): created if new, continued if it
    # exists. "": an id made on the first start, kept in WORKDIR/tracker_run.json and reused on
    # resume, so a resumed run continues the same run.
    c.train.run_id = ""
    # mlflow: the tracking URI (a server, sqlite:///..., or a file store); "": $MLFLOW_TRACKING_URI,
    # else a file store in WORKDIR/mlruns.
    c.train.mlflow_uri = ""

    c.optim = ConfigDict()
    c.optim.lr = 3e-3  # peak learning rate
    # cosine | wsd (warmup-stable-decay) | constant (warmup, then lr to the end, no decay: for runs
    # whose intermediate checkpoints are all used, e.g. MergeMix's domain experts)
    c.optim.schedule = "cosine"
    # Linear warmup from 0 to lr over this many steps. It follows the run's length: a warmup longer
    # than half of train.steps (e.g. --config.train.steps=20 with the default 40) is shortened to
    # train.steps // 2, with a one-line note, so that a shortened run still decays; a warmup that
    # fits is used as given (see effective_warmup_steps).
    c.optim.warmup_steps = 40
    c.optim.min_lr_ratio = 0.1  # final lr as a fraction of lr
    c.optim.decay_fraction = 0.2  # wsd only: fraction of steps spent in the final linear decay
    c.optim.b1 = 0.9
    c.optim.b2 = 0.95
    c.optim.eps = 1e-8
    c.optim.weight_decay = 0.1  # AdamW decay; never applied to norms, biases or router biases
    c.optim.clip_norm = 1.0  # global-norm gradient clipping; 0 disables

    c.checkpoint = ConfigDict()
    c.checkpoint.every_steps = 200  # save interval (a final checkpoint is always written)
    c.checkpoint.max_to_keep = 3  # most recent checkpoints kept
    c.checkpoint.keep_period = 0  # also keep every checkpoint whose step is a multiple of this; 0: off
    c.checkpoint.grace_seconds = 60.0  # on SIGTERM/SIGINT: save, but exit anyway after this long
    # Start from these parameters (a workdir, its checkpoints/ dir, or one step's dir) with a fresh
    # optimizer and data stream; ignored when the workdir has its own checkpoint to resume from.
    c.checkpoint.init_from = ""
    c.checkpoint.init_step = -1  # which step of init_from; -1: its latest

    c.data = ConfigDict()
    # "" trains on the built-in corpus (domains code, prose, math, knowledge); otherwise a dataset
    # directory written by `python -m moejax.data.prepare` (its domains are its --source names).
    c.data.path = ""
    # Sampling weight per domain; weights that do not sum to 1 are normalised (with a warning),
    # a weight of 0 leaves the domain out of training (it is still evaluated).
    c.data.mixture = ConfigDict({"code": 0.25, "prose": 0.25, "math": 0.25, "knowledge": 0.25})
    # A mixture JSON file {"weights": {domain: weight}, ...} (what data_mixture writes); when set
    # it replaces data.mixture.
    c.data.mixture_file = ""
    # A prepared dataset's mixture when neither the experiment nor the command line chooses one
    # (moejax/derive.py): "tokens", its domains in proportion to their training tokens, or "uniform".
    c.data.default_mixture = "tokens"
    # Weights by training stage, replacing data.mixture and data.mixture_file: JSON text or the
    # path of a JSON file, [[start_step, {domain: weight}], ...], first stage at step 0.
    c.data.schedule = ""
    c.data.cache_dir = ""  # where the built-in corpus is cached; "" means $MOEJAX_CACHE or ~/.cache/moejax
    # Data-constrained domains: a fixed pool of unique training tokens per domain, "DOMAIN=N,..."
    # (e.g. "code=2000000"); upweighting such a domain repeats its pool, and metrics.jsonl logs
    # epochs/<domain>. Overrides a prepared dataset's pools (prepare --unique-tokens). "": none.
    c.data.unique_tokens = ""
    # The built-in benchmarks `python -m moejax.eval` scores by default on runs of the built-in
    # corpus (docs/eval.md): "benchmarks-v2", graded tasks that carry signal for sweep-sized models
    # (code_chars, ..., know_type, math_copy), or "benchmarks-v1", one task per domain (code,
    # prose, math, knowledge). Only evaluation reads it; a saved config without it gets this default.
    c.data.benchmarks = "benchmarks-v2"

    # The model (every model.* key, its default and what it means) is declared once, as the fields
    # of the typed configs the model receives: moejax/schema.py (ModelConfig, MoEConfig,
    # DispatchConfig, L3Config; model.moe.grouped_matmul is DispatchConfig.impl). Large Lookup
    # Layers (model.l3.*): docs/l3.md.
    c.model = ConfigDict(schema.defaults(schema.ModelConfig))
    # Load-balancing objectives, composed (losses and selection biases add up): a tuple of
    # (name, {hyperparameter: value}) pairs. Names: none | switch | global_batch | seq_aux | z_loss
    # | loss_free | phi | dpsl; formulas, hyperparameters and how to choose: docs/balancing.md.
    # Command line: --config.model.moe.balancing="(('phi', {'alpha': 0.01}), ('z_loss', {'weight': 0.001}))"
    c.model.moe.balancing = (("switch", {"weight": 1e-2}), ("z_loss", {"weight": 1e-3}))

    # Device mesh: a size per axis, -1 fills the rest (at most one -1). The batch is split over
    # data x fsdp x expert; parameters over fsdp (model dim), expert (experts) and tensor (heads/ffn).
    c.mesh = ConfigDict()
    c.mesh.data = -1
    c.mesh.fsdp = 1
    c.mesh.expert = 1
    c.mesh.tensor = 1
    return c


# The model.* keys are declared once, as the fields of the typed configs the model receives
# (moejax/schema.py): their choices and bounds below are generated from those declarations.
_MODEL_KEYS = dict(schema.declared_keys(schema.ModelConfig, "model"))


def _choices_default_first(field: Any) -> tuple[str, ...]:
    """A choice field's values as the command line lists them: the default first."""
    choices = field.metadata["check"].choices
    return (field.default, *(c for c in choices if c != field.default))


# Values a string knob may take.
CHOICES = {
    "train.compute_dtype": ("float32", "bfloat16"),
    "train.param_dtype": ("float32", "bfloat16"),
    "train.remat": ("none", "full", "save_dots"),
    "train.eval_windows": ("sampled", "first"),
    "optim.schedule": ("cosine", "wsd", "constant"),
    "data.default_mixture": ("tokens", "uniform"),
    **{key: _choices_default_first(field) for key, field in _MODEL_KEYS.items() if field.metadata["check"].choices},
}
# Number knobs that must be > 0, or >= 0: the hand-kept ones, then the model's, generated.
POSITIVE = (
    "train.steps", "train.global_batch_size", "train.seq_len", "train.grad_accum_steps", "train.log_every",
    "train.eval_every", "train.eval_batches", "checkpoint.every_steps", "checkpoint.max_to_keep",
    "checkpoint.grace_seconds", "train.max_bad_steps", "optim.lr",
    *(key for key, field in _MODEL_KEYS.items() if field.metadata["check"].bound == "positive"),
)
NON_NEGATIVE = (
    "train.seed", "train.peak_flops_per_device", "checkpoint.keep_period", "optim.warmup_steps",
    "optim.weight_decay", "optim.clip_norm", "optim.eps",
    *(key for key, field in _MODEL_KEYS.items() if field.metadata["check"].bound == "non_negative"),
)

# Dict-valued knobs whose keys are the user's to choose (checked against the data instead).
FREE_KEYS = ("data.mixture",)
# Knobs that hold a path: the command line expands '~' in them and resolves the ones it sets against
# the directory the user ran it from (moejax/paths.py). data.schedule holds a path unless it is JSON text.
PATH_KEYS = ("data.path", "data.mixture_file", "data.schedule", "data.cache_dir", "checkpoint.init_from",
             "model.l3.allocation")
BENCHMARK_VERSIONS = ("benchmarks-v1", "benchmarks-v2")  # values of data.benchmarks (moejax/eval/benchmarks/)
# Names train.loggers may list (the writers: moejax/train/trackers/); jsonl must be one of them.
LOGGERS = ("jsonl", "tensorboard", "wandb", "mlflow")
RUN_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")

MESH_AXES = ("data", "fsdp", "expert", "tensor")


def _check_tree(cfg: ConfigDict, ref: ConfigDict, prefix: str = "") -> None:
    """Unknown keys and wrong types, against the defaults."""
    for key in cfg.keys():
        path = prefix + key
        if key not in ref:
            near = difflib.get_close_matches(key, list(ref.keys()), n=1)
            hint = f" Did you mean '{prefix + near[0]}'?" if near else ""
            raise ConfigError(
                f"unknown config key '{path}'.{hint} Known keys under "
                f"'{prefix.rstrip('.') or '<top>'}': {', '.join(sorted(ref.keys()))}."
            )
        value, default = cfg[key], ref[key]
        if path in FREE_KEYS:
            continue
        if isinstance(default, ConfigDict):
            if not isinstance(value, ConfigDict):
                _fail(path, value, "a group of keys", f"Set its members, e.g. --config.{path}.<key>=...")
            _check_tree(value, default, path + ".")
        elif isinstance(default, bool):
            if not isinstance(value, bool):
                _fail(path, value, "True or False")
        elif isinstance(default, int):
            if isinstance(value, bool) or not isinstance(value, int):
                _fail(path, value, "an integer")
        elif isinstance(default, float):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                _fail(path, value, "a finite number")
        elif isinstance(default, str):
            if not isinstance(value, str):
                _fail(path, value, "a string")
            if path in CHOICES and value not in CHOICES[path]:
                _fail(path, value, " | ".join(CHOICES[path]))


def _positive(cfg: ConfigDict, *paths: str) -> None:
    for path in paths:
        value = _get(cfg, path)
        if value <= 0:
            _fail(path, value, "a positive value")


def _non_negative(cfg: ConfigDict, *paths: str) -> None:
    for path in paths:
        value = _get(cfg, path)
        if value < 0:
            _fail(path, value, "a value >= 0")


def _get(cfg: ConfigDict, path: str) -> Any:
    for part in path.split("."):
        cfg = cfg[part]
    return cfg


def get_path(cfg: ConfigDict, path: str) -> Any:
    """The value at a dotted ``path``; ``KeyError`` if there is none."""
    try:
        return _get(cfg, path)
    except (KeyError, AttributeError, TypeError):
        raise KeyError(path) from None


def describe_unknown_key(reference: ConfigDict, path: str) -> str:
    """'' if ``path`` names a key of ``reference`` (the defaults), else what is wrong and the fix.

    Checked at every depth, so a typo in a leaf (``train.step``) is named as precisely as one at
    the top (``modle.num_layers``), with the corrected override. The user-keyed groups
    (:data:`FREE_KEYS`) accept any key below them.
    """
    parts = path.split(".")
    node: Any = reference
    for depth, part in enumerate(parts):
        prefix = ".".join(parts[:depth])
        if prefix in FREE_KEYS:
            return ""
        if not isinstance(node, ConfigDict):
            return (f"config key '{prefix}' is a single value ({_type_phrase(node)}), not a group: "
                    f"there is no '{path}'. Set it directly, e.g. --config.{prefix}={_example(node)} (its default)")
        if part not in node:
            where = f"under '{prefix}'" if prefix else "at the top level"
            near = difflib.get_close_matches(part, list(node.keys()), n=1)
            fix = ""
            if near:
                fixed = ".".join(parts[:depth] + [near[0]] + parts[depth + 1:])
                fix = f" Did you mean \"{near[0]}\" (--config.{fixed})?"
            return (f"unknown config key '{path}': there is no '{part}' {where}.{fix} Keys {where}: "
                    f"{', '.join(sorted(node.keys()))}")
        node = node[part]
    return ""


def _type_phrase(default: Any) -> str:
    if isinstance(default, ConfigDict):
        return "a group of keys: " + ", ".join(sorted(default.keys()))
    if isinstance(default, bool):
        return "True or False"
    if isinstance(default, int):
        return "an integer"
    if isinstance(default, float):
        return "a number"
    if isinstance(default, tuple):
        return "a tuple, quoted for the shell"
    return "a string"


def _example(default: Any) -> str:
    if isinstance(default, tuple):
        return f"\"{default!r}\""
    if isinstance(default, str):
        return repr(default) if default else "''"
    return repr(default)


def describe_expected(path: str, default: Any) -> str:
    """What a command-line value for ``path`` must look like, with an example (its default)."""
    if path in FREE_KEYS:
        return (f"config key '{path}' takes JSON text of an object domain -> weight, e.g. "
                f"--config.{path}='{{\"code\": 0.5, \"math\": 0.5}}', or one --config.{path}.DOMAIN=WEIGHT "
                "per domain.")
    if isinstance(default, ConfigDict):
        first = sorted(default.keys())[0]
        return (f"config key '{path}' is a group of keys ({', '.join(sorted(default.keys()))}); set its "
                f"members one by one, e.g. --config.{path}.{first}={_example(default[first])}")
    return (f"config key '{path}' takes {_type_phrase(default)}; e.g. --config.{path}={_example(default)} "
            "(its default).")


def apply_mixture_overrides(cfg: ConfigDict, overrides: list[tuple[str | None, str]]) -> ConfigDict:
    """``cfg`` with the command line's ``data.mixture`` overrides applied, in order; ``ConfigError``.

    An override is ``(None, json_text)`` (``--config.data.mixture='{"a": 1}'``: the whole mixture)
    or ``(domain, number_text)`` (``--config.data.mixture.a=0.5``: one weight). Per-domain weights
    change the config's mixture, except that naming a domain the config's mixture lacks starts a
    new mixture of exactly the domains named on the command line: the config's domains belong to
    another dataset (typically the built-in default with a prepared ``data.path``), and mixing the
    two sets could never be right. Domains are checked against the dataset at training start.
    """
    if not overrides:
        return cfg
    mixture = dict(cfg.data.mixture.items()) if hasattr(cfg.data.mixture, "items") else {}
    named: dict[str, float] = {}
    for domain, text in overrides:
        if domain is None:
            mixture, named = _mixture_from_text(text), {}
            continue
        if "." in domain or not domain:
            raise ConfigError(f"config key 'data.mixture.{domain}': a domain name has no dots; give one "
                              "weight per domain, e.g. --config.data.mixture.code=0.5.")
        named[domain] = _weight_from_text(domain, text)
    if named:
        mixture = {**mixture, **named} if set(named) <= set(mixture) else named
    with cfg.unlocked():
        cfg.data.mixture = ConfigDict(mixture)
    return cfg


def _mixture_from_text(text: str) -> dict[str, float]:
    import ast
    import json

    example = "--config.data.mixture='{\"code\": 0.5, \"math\": 0.5}'"
    try:
        value = json.loads(text)
    except ValueError as e:
        try:  # Python's spelling, {'code': 0.5}, is accepted too
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            raise ConfigError(
                f"config key 'data.mixture' has value {text!r}, which is not valid JSON ({e}); allowed: "
                f"a JSON object domain -> weight, quoted for the shell, e.g. {example}; or one "
                "--config.data.mixture.DOMAIN=WEIGHT per domain."
            ) from None
    if not isinstance(value, dict) or not value:
        raise ConfigError(f"config key 'data.mixture' has value {text!r}; allowed: a non-empty JSON object "
                          f"domain -> weight, e.g. {example}.")
    for domain, weight in value.items():
        if (not isinstance(domain, str) or isinstance(weight, bool) or not isinstance(weight, (int, float))
                or not math.isfinite(weight) or weight < 0):
            raise ConfigError(f"config key 'data.mixture' has value {text!r}: the weight of {domain!r} is "
                              f"{weight!r}; allowed: finite numbers >= 0, e.g. {example}.")
    return {domain: float(weight) for domain, weight in value.items()}


def _weight_from_text(domain: str, text: str) -> float:
    try:
        weight = float(text)
    except ValueError:
        weight = math.nan
    if not math.isfinite(weight) or weight < 0:
        raise ConfigError(f"config key 'data.mixture.{domain}' has value {text!r}; allowed: a finite weight "
                          f">= 0, e.g. --config.data.mixture.{domain}=0.5.")
    return weight


def resolve_mesh_shape(mesh_cfg: ConfigDict, num_devices: int, changed: Any = ()) -> dict[str, int]:
    """Mesh axis sizes with the one -1 filled in, checked against the device count.

    ``changed``: the keys the command line set; when the fixed axes do not divide the devices, the
    message names the axis the user set (``mesh.expert=3`` on 4 devices), not the ``-1`` default.
    """
    sizes = {axis: mesh_cfg[axis] for axis in MESH_AXES}
    free = [axis for axis, size in sizes.items() if size == -1]
    for axis, size in sizes.items():
        if size == 0 or size < -1:
            _fail(f"mesh.{axis}", size, "a positive size, or -1 to fill the remaining devices")
    if len(free) > 1:
        _fail(f"mesh.{free[1]}", -1, "-1 on at most one axis", f"mesh.{free[0]} is already -1.")
    fixed = math.prod(size for size in sizes.values() if size != -1)
    if free:
        if num_devices % fixed:
            set_by_user = [a for a in MESH_AXES if f"mesh.{a}" in changed and sizes[a] not in (-1, 1)]
            if set_by_user and f"mesh.{free[0]}" not in changed:
                axis = set_by_user[-1]
                others = math.prod(s for a, s in sizes.items() if s != -1 and a != axis)
                _fail(f"mesh.{axis}", sizes[axis], f"a size that, times the other fixed axes ({others}), divides "
                      f"the {num_devices} devices",
                      f"mesh.{free[0]}=-1 fills the devices the fixed axes leave; the fixed axes multiply to "
                      f"{fixed}, which does not divide {num_devices}.")
            _fail(
                f"mesh.{free[0]}", -1, f"a fill of the {num_devices} devices",
                f"The other axes multiply to {fixed}, which does not divide {num_devices}.",
            )
        sizes[free[0]] = num_devices // fixed
    elif fixed != num_devices:
        shape = " x ".join(f"{a}={s}" for a, s in sizes.items())
        raise ConfigError(
            f"mesh axis sizes {shape} multiply to {fixed}, but there are {num_devices} devices. "
            "Make them multiply to the device count, or set one axis to -1 to fill the rest."
        )
    return sizes


def effective_warmup_steps(warmup_steps: int, total_steps: int) -> int:
    """The warmup the schedule uses: ``optim.warmup_steps``, at most half of ``train.steps``.

    A warmup past half the run leaves the decay no room (past the whole run, the learning rate
    never reaches its peak), so it is shortened rather than refused: a user who shortens a run
    (``--config.train.steps=20``) expects it to work without retuning the warmup. Levanter takes a
    warmup fraction for the same reason. A warmup of at most half the run is used as given (every
    shipped experiment warms up over a tenth of its steps or less).
    """
    return min(warmup_steps, total_steps // 2)


def check_values(cfg: ConfigDict, num_devices: int, *, changed: Any = (), notes: bool = True) -> dict[str, int]:
    """Checks the schema and the generic per-key checks; returns the resolved mesh shape. Raises
    ConfigError. The packages' own checks come after it in :func:`moejax.checks.validate`.

    ``changed``: the keys the command line set. When two keys conflict, the message is about the
    one the user changed (and names the other), not about a default they never touched.
    ``notes``: print notes about training (a shortened warmup); off for commands that only read
    a trained model.
    """
    _check_tree(cfg, default_config())
    t, m, moe = cfg.train, cfg.model, cfg.model.moe
    _positive(cfg, *POSITIVE)
    _non_negative(cfg, *NON_NEGATIVE)
    for path in ("optim.min_lr_ratio", "optim.decay_fraction", "optim.b1", "optim.b2"):
        if not 0.0 <= _get(cfg, path) <= 1.0:
            _fail(path, _get(cfg, path), "a number in [0, 1]")
    if m.num_heads % m.num_kv_heads:
        _fail_pair(
            changed,
            ("model.num_kv_heads", m.num_kv_heads, f"a divisor of model.num_heads={m.num_heads}"),
            ("model.num_heads", m.num_heads, f"a multiple of model.num_kv_heads={m.num_kv_heads}"),
            "Each key/value head serves num_heads / num_kv_heads query heads.",
        )
    if moe.experts_per_token > moe.num_experts:
        _fail_pair(
            changed,
            ("model.moe.experts_per_token", moe.experts_per_token, f"at most model.moe.num_experts={moe.num_experts}"),
            ("model.moe.num_experts", moe.num_experts,
             f"at least model.moe.experts_per_token={moe.experts_per_token}"),
        )
    if m.first_k_dense > m.num_layers:
        _fail_pair(
            changed,
            ("model.first_k_dense", m.first_k_dense, f"at most model.num_layers={m.num_layers}"),
            ("model.num_layers", m.num_layers, f"at least model.first_k_dense={m.first_k_dense}"),
        )
    if moe.num_shared_experts and not moe.shared_expert_dim:
        _fail("model.moe.shared_expert_dim", 0, "a positive width when num_shared_experts > 0")
    if moe.shared_gate and not (moe.num_shared_experts and moe.shared_expert_dim):
        _fail("model.moe.shared_gate", True, "False when there are no shared experts",
              "Set model.moe.num_shared_experts and model.moe.shared_expert_dim, or turn the gate off.")
    _check_groups(moe)
    _check_layer_experts(m)
    warmup = effective_warmup_steps(cfg.optim.warmup_steps, t.steps)
    if warmup != cfg.optim.warmup_steps and notes:
        log.warning(f"moejax: note: optim.warmup_steps={cfg.optim.warmup_steps} is more than half of "
                    f"train.steps={t.steps}; warming up over {warmup} steps instead.")

    _check_trackers(t)
    if cfg.data.benchmarks not in BENCHMARK_VERSIONS:
        _fail("data.benchmarks", cfg.data.benchmarks, " or ".join(map(repr, BENCHMARK_VERSIONS)))
    mixture = cfg.data.mixture
    if not hasattr(mixture, "items") or not mixture:
        _fail("data.mixture", mixture, "a non-empty mapping domain -> weight")
    for domain, weight in mixture.items():
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight >= 0:
            _fail(f"data.mixture.{domain}", weight, "a finite weight >= 0")
    if not sum(mixture.values()) > 0:
        _fail("data.mixture", dict(mixture), "weights that are not all zero")
    if cfg.data.schedule and cfg.data.mixture_file:
        _fail("data.schedule", cfg.data.schedule, "'' while data.mixture_file is set",
              "Set one: a schedule with one stage [[0, weights]] is a plain mixture.")

    mesh = resolve_mesh_shape(cfg.mesh, num_devices, changed)
    batch_shards = mesh["data"] * mesh["fsdp"] * mesh["expert"]
    per_step = batch_shards * t.grad_accum_steps
    if t.global_batch_size % per_step:
        _fail(
            "train.global_batch_size", t.global_batch_size,
            f"a multiple of {per_step} (mesh data x fsdp x expert = {batch_shards}, "
            f"times train.grad_accum_steps = {t.grad_accum_steps})",
        )
    if moe.num_experts % mesh["expert"]:
        _fail("model.moe.num_experts", moe.num_experts, f"a multiple of mesh.expert={mesh['expert']}")
    _check_llep(moe, mesh)
    return mesh


def split_list(text: str) -> tuple[str, ...]:
    """The items of a comma-separated knob (``train.loggers``, ``train.tags``), stripped, empty ones dropped."""
    return tuple(item.strip() for item in text.split(",") if item.strip())


def _check_trackers(t: ConfigDict) -> None:
    """train.loggers names known writers, jsonl among them; train.run_id is a usable id."""
    names = split_list(t.loggers)
    unknown = [name for name in names if name not in LOGGERS]
    if unknown:
        near = difflib.get_close_matches(unknown[0], LOGGERS, n=1)
        hint = f" Did you mean {near[0]!r}?" if near else ""
        _fail("train.loggers", t.loggers, f"a comma-separated list of {' | '.join(LOGGERS)}",
              f"{unknown[0]!r} is not a logger.{hint} E.g. --config.train.loggers=jsonl,tensorboard,wandb")
    if "jsonl" not in names:
        _fail("train.loggers", t.loggers, "a list that includes jsonl",
              "WORKDIR/metrics.jsonl is what resuming, the run's summary and data_mixture read; add "
              f"it, e.g. --config.train.loggers=jsonl,{','.join(n for n in names if n != 'jsonl') or 'tensorboard'}")
    if len(t.run_id) > 64 or not RUN_ID_CHARS.issuperset(t.run_id):
        _fail("train.run_id", t.run_id, "'' or up to 64 letters, digits, '_' or '-'")


def _fail_pair(changed: Any, first: tuple[str, Any, str], second: tuple[str, Any, str], why: str = "") -> None:
    """Two keys conflict: report against ``second`` if the user changed it and not ``first``."""
    report, other = (second, first) if second[0] in changed and first[0] not in changed else (first, second)
    fix = f"Change {report[0]}, or set {other[0]} to fit it."
    _fail(report[0], report[1], report[2], f"{why} {fix}".strip())


def _check_llep(moe: ConfigDict, mesh: dict[str, int]) -> None:
    """ep_balance = llep: an expert axis to spill over, buffers that can spill."""
    if moe.ep_balance != "llep":
        return
    if moe.backend != "expert_parallel":
        _fail("model.moe.ep_balance", "llep", f"'drop' with model.moe.backend={moe.backend!r}",
              "LLEP spills over the expert axis: set model.moe.backend=expert_parallel.")
    if mesh["expert"] < 2:
        _fail("model.moe.ep_balance", "llep", f"'drop' with mesh.expert={mesh['expert']}",
              "LLEP needs an expert mesh axis of size >= 2 to spill over: set mesh.expert.")
    if not isinstance(moe.ep_spill_slots, int) or isinstance(moe.ep_spill_slots, bool):
        _fail("model.moe.ep_spill_slots", moe.ep_spill_slots, "an int >= 1 (experts a device may host)")
    if moe.ep_spill_slots > moe.num_experts:
        _fail("model.moe.ep_spill_slots", moe.ep_spill_slots,
              f"at most model.moe.num_experts={moe.num_experts} (each slot hosts one expert's weights)")
    if moe.ep_capacity_factor >= mesh["expert"]:
        _fail("model.moe.ep_capacity_factor", moe.ep_capacity_factor,
              f"less than mesh.expert={mesh['expert']} with model.moe.ep_balance=llep",
              "At >= mesh.expert the native buffer already holds every assignment and nothing can "
              "spill: use ep_balance=drop (it is then dropless), or lower the factor.")


def _check_layer_experts(m: ConfigDict) -> None:
    """Per-layer expert counts (a pruned model): one per MoE layer, within [top-k, num_experts]."""
    moe, counts = m.moe, tuple(m.moe.layer_experts)
    if not counts:
        return
    num_moe = sum(
        1 for layer in range(m.num_layers)
        if layer >= m.first_k_dense and (layer - m.first_k_dense) % m.moe_every == 0
    )
    if len(counts) != num_moe:
        _fail("model.moe.layer_experts", counts, f"one count per MoE layer ({num_moe} of them), or ()")
    if min(counts) < moe.experts_per_token or max(counts) != moe.num_experts:
        _fail("model.moe.layer_experts", counts,
              f"counts between model.moe.experts_per_token={moe.experts_per_token} and "
              f"model.moe.num_experts={moe.num_experts}, the largest equal to num_experts")
    if moe.num_groups > 1:
        _fail("model.moe.layer_experts", counts, "() with group-limited routing (model.moe.num_groups > 1)",
              "Expert groups are equal slices of every layer's experts; prune to one count per layer.")
    if moe.backend == "expert_parallel":
        _fail("model.moe.layer_experts", counts, "() with model.moe.backend='expert_parallel'",
              "Expert parallelism splits every layer's experts evenly over mesh.expert; use the "
              "dropless or capacity backend, or prune every layer to the same count.")


def _check_groups(moe: ConfigDict) -> None:
    """Group-limited routing: equal groups of at least two experts (a group scores its top two)."""
    if moe.num_experts % moe.num_groups:
        _fail("model.moe.num_groups", moe.num_groups, f"a divisor of model.moe.num_experts={moe.num_experts}")
    if moe.topk_groups > moe.num_groups:
        _fail("model.moe.topk_groups", moe.topk_groups, f"at most model.moe.num_groups={moe.num_groups}")
    if moe.num_groups == 1:
        return
    per_group = moe.num_experts // moe.num_groups
    if per_group < 2:
        _fail("model.moe.num_groups", moe.num_groups,
              f"at most model.moe.num_experts / 2 = {moe.num_experts // 2} (each group needs two experts)")
    if moe.experts_per_token > moe.topk_groups * per_group:
        _fail("model.moe.experts_per_token", moe.experts_per_token,
              f"at most topk_groups * experts per group = {moe.topk_groups * per_group}")


def to_dict(cfg: ConfigDict) -> dict[str, Any]:
    """Plain nested dict of the config (for config.json and checkpoint metadata)."""
    return cfg.to_dict()


# Keys added after configs were saved with the behaviour they now switch off: a saved config
# (config.json) without the key reads it as this value, so an old run evaluates as it did.
SAVED_BEFORE_KEY = {"train.eval_windows": "first"}


def from_dict(values: dict[str, Any]) -> ConfigDict:
    """The inverse of :func:`to_dict` (e.g. a workdir's config.json): the defaults, overridden.

    Unknown keys raise (ml_collections' KeyError); run :func:`moejax.checks.validate` on the result. The
    user-keyed groups (:data:`FREE_KEYS`, e.g. the mixture's domains) are replaced, not merged.
    """
    cfg = default_config()
    values = {key: dict(group) if isinstance(group, dict) else group for key, group in values.items()}
    for path, value in SAVED_BEFORE_KEY.items():  # a saved config made before the key: its behaviour then
        section, key = path.split(".")
        if isinstance(values.get(section), dict) and key not in values[section]:
            values[section][key] = value
    free = {}
    for path in FREE_KEYS:
        section, key = path.split(".")
        if key in values.get(section, {}):
            free[path] = values[section].pop(key)
    cfg.update(values)
    for path, group in free.items():
        section, key = path.split(".")
        cfg[section][key] = ConfigDict(group)
    return cfg


# ------------------------------------------------------------------------------------- loading

MIXTURE_KEY = "data.mixture"
# One override in the command line's spellings: --config.a.b=v, --config.a.b (a switch), --noconfig.a.b.
_FLAG_OVERRIDE = re.compile(r"^--?(no)?config\.([^=]*)(=.*)?$", re.DOTALL)
_module_ids = itertools.count()  # a module name of its own for each loaded experiment file


def load(config_file: str, overrides: Sequence[str] | Mapping[str, Any] = ()) -> tuple[ConfigDict, tuple[str, ...]]:
    """The config an experiment file and overrides ask for, and the keys the overrides set.

    ``config_file``: the path of a Python file whose ``get_config()`` returns the config (a
    ``ConfigDict``, usually :func:`default_config` changed, or a plain ``dict`` of just the keys it
    changes, laid over the defaults), optionally followed by ``:ARG`` (passed to
    ``get_config(ARG)``); or a built-in config's name (``tiny_moe``, see :mod:`moejax.configs`).
    ``overrides``: ``"KEY=VALUE"`` strings (``"train.steps=20"``; the command line's
    ``--config.KEY=VALUE``, ``--config.KEY`` and ``--noconfig.KEY`` spellings too) whose text is
    parsed as the command line parses it, or a mapping ``{KEY: value}`` of Python values. A
    ``data.mixture`` override takes a mapping or JSON text, or ``data.mixture.DOMAIN=WEIGHT`` per
    domain (:func:`apply_mixture_overrides`).

    Returns ``(cfg, changed)``: ``changed`` lists the keys the overrides set (pass it on to
    :func:`moejax.checks.validate`, whose messages then name the key the user set). Every problem
    raises :class:`ConfigError` with a one-paragraph message; nothing is printed and the process
    never exits, so a notebook, a Ray task or several threads at once may call it. Paths in the
    config are as written (relative ones to the current directory). The values are checked
    against each other and the devices by :func:`moejax.checks.validate`, not here.
    """
    args = _override_args(overrides)
    args, mixture = split_mixture_overrides(args)
    changed, reference = [], default_config()
    for arg in args:
        path = _FLAG_OVERRIDE.match(arg).group(2)  # type: ignore[union-attr]
        problem = describe_unknown_key(reference, path)
        if problem:
            raise ConfigError(f"{arg}: {problem}.")
        changed.append(path)
    cfg = _load_file(config_file)
    if args:
        cfg = _apply_overrides(cfg, args)
    cfg = apply_mixture_overrides(cfg, mixture)
    changed += [MIXTURE_KEY + (f".{domain}" if domain else "") for domain, _ in mixture]
    return cfg, tuple(changed)


def _override_args(overrides: Sequence[str] | Mapping[str, Any]) -> list[str]:
    """Overrides as the command line spells them: ``--config.KEY=VALUE``."""
    if isinstance(overrides, str):
        raise ConfigError(f"overrides {overrides!r}: give a list of 'KEY=VALUE' strings or a mapping "
                          "{KEY: value}, e.g. ['train.steps=20'].")
    if isinstance(overrides, Mapping):
        args = []
        for key, value in overrides.items():
            if isinstance(value, str):
                text = value
            elif key == MIXTURE_KEY and isinstance(value, Mapping):
                text = json.dumps(dict(value))
            else:
                text = repr(value)
            args.append(f"--config.{key}={text}")
        return args
    args = []
    for item in overrides:
        if not isinstance(item, str) or not (_FLAG_OVERRIDE.match(item) or "=" in item):
            raise ConfigError(f"override {item!r}: allowed: 'KEY=VALUE', e.g. 'train.steps=20' "
                              "(or --config.train.steps=20).")
        args.append(item if _FLAG_OVERRIDE.match(item) else f"--config.{item}")
    return args


def split_mixture_overrides(args: Sequence[str]) -> tuple[list[str], list[tuple[str | None, str]]]:
    """Takes the ``data.mixture`` overrides out of ``args`` (each ``--config.KEY=VALUE``): (the
    rest, [(domain or None, text)]), applied by :func:`apply_mixture_overrides`.

    ml_collections can only override keys the config already has, and a mixture's keys are the
    dataset's domains, so these are applied apart.
    """
    rest, mixture = [], []
    for arg in args:
        match = _FLAG_OVERRIDE.match(arg)
        path = match.group(2) if match else ""
        if not (match and (path == MIXTURE_KEY or path.startswith(MIXTURE_KEY + "."))):
            rest.append(arg)
            continue
        domain = path[len(MIXTURE_KEY) + 1:] or None
        if match.group(1):
            raise ConfigError(f"{arg}: data.mixture{'.' + domain if domain else ''} is not a switch; give a "
                              f"weight, e.g. --config.data.mixture.{domain or 'code'}=0.5.")
        if match.group(3) is None:
            raise ConfigError(f"{arg} needs a value, e.g. {arg}=" + ("0.5" if domain else "'{\"code\": 1}'") + ".")
        mixture.append((domain, match.group(3)[1:]))
    return rest, mixture


def _load_file(config_file: str) -> ConfigDict:
    """The config ``config_file`` (``PATH[:ARG]`` or a built-in's name) returns; ``ConfigError``.

    The file is executed as a module of its own name (never one name shared by every load, as
    ml_collections' loader does), so loads in several threads at once cannot see each other's.
    """
    name, sep, argument = config_file.partition(":")
    path = os.path.expanduser(name)
    if not os.path.isfile(path):
        from moejax import configs as builtin_configs  # the built-in files; a leaf package

        found = builtin_configs.find(name)
        if found is None:
            where = "" if os.path.isabs(path) else f" (relative to {os.getcwd()})"
            raise ConfigError(
                f"config file {config_file!r} not found{where}; give the path of an experiment file, e.g. "
                "experiments/configs/tiny_moe.py, or the name of a built-in config: "
                f"{', '.join(builtin_configs.BUILTIN)}.")
        path = found
    module_name = f"moejax_experiment_{next(_module_ids)}"
    loader = importlib.machinery.SourceFileLoader(module_name, path)
    spec = importlib.util.spec_from_file_location(module_name, path, loader=loader)  # sets __file__
    assert spec is not None  # a loader is given
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses and pickling look a module up by name while it runs
    try:
        loader.exec_module(module)
        get_config = module.get_config
    except (Exception, SystemExit) as e:  # noqa: BLE001 - any failure of the user's file is reported
        raise ConfigError(
            f"config file {config_file!r} could not be loaded: {type(e).__name__}: {e}. An experiment file is a "
            "Python file whose get_config() returns the config, e.g. experiments/configs/tiny_moe.py.") from None
    finally:
        sys.modules.pop(module_name, None)
    try:
        cfg = get_config(*([argument] if sep else []))
    except (Exception, SystemExit) as e:  # noqa: BLE001
        places = [f'File "{frame.filename}", line {frame.lineno}, in {frame.name}'
                  for frame in traceback.extract_tb(e.__traceback__)[1:] if "site-packages" not in frame.filename]
        where = f" ({places[-1]})" if places else ""
        raise ConfigError(
            f"config file {config_file!r} could not be loaded: {type(e).__name__}: {e}{where}. Fix the file's "
            "get_config(), or the ':argument' after the file name if you gave one.") from None
    if isinstance(cfg, ConfigDict):
        return cfg
    if isinstance(cfg, Mapping):
        return _from_changes(cfg, config_file)
    raise ConfigError(
        f"config file {config_file!r}: get_config() returned {type(cfg).__name__} {cfg!r:.60}; allowed: a "
        "ConfigDict (moejax.config.default_config() with the changes made) or a dict of the keys it changes, "
        "e.g. {'train': {'steps': 20}}." + (" Did you forget a return statement?" if cfg is None else ""))


def _from_changes(changes: Mapping[str, Any], config_file: str) -> ConfigDict:
    """The defaults with a plain (nested) dict of changes laid over them; unknown keys and wrong
    types are ``ConfigError``s naming the key."""
    cfg = default_config()

    def lay(group: ConfigDict, values: Mapping[str, Any], prefix: str) -> None:
        for key, value in values.items():
            path = f"{prefix}{key}"
            problem = describe_unknown_key(cfg, path)
            if problem:
                raise ConfigError(f"config file {config_file!r}: get_config() returned a dict with {problem}.")
            if isinstance(group[key], ConfigDict) and path not in FREE_KEYS:
                if not isinstance(value, Mapping):
                    _fail(path, value, "a dict of its keys", f"Set its members, e.g. {{{key!r}: {{...}}}}.")
                lay(group[key], value, path + ".")
                continue
            try:
                group[key] = ConfigDict(dict(value)) if path in FREE_KEYS and isinstance(value, Mapping) else value
            except TypeError:
                _fail(path, value, _type_phrase(get_path(default_config(), path)))

    lay(cfg, changes, "")
    return cfg


def _apply_overrides(cfg: ConfigDict, args: list[str]) -> ConfigDict:
    """``cfg`` with ``--config.KEY=VALUE`` overrides applied, each value parsed as the type of the
    key (ml_collections' parsers, on a flag registry of this call's own)."""
    from absl import flags
    from ml_collections import config_flags

    values = flags.FlagValues()
    argv = ["moejax", *args]
    try:
        held = config_flags.DEFINE_config_dict("config", cfg, flag_values=values, sys_argv=argv)
        values(argv)
    except flags.Error as e:
        raise ConfigError(_describe_override_error(e, args)) from None
    return held.value


def _describe_override_error(error: Exception, args: list[str]) -> str:
    """A one-paragraph message for a bad override value (absl's and ml_collections' errors)."""
    from ml_collections.config_flags import config_flags as flags_module

    text = str(error)
    if isinstance(error, flags_module.FlagOrderError):
        return f"{text.rstrip('.')}. Put --config FILE first, then the --config.KEY=VALUE overrides, each key once."
    match = re.match(r"flag --config\.([A-Za-z0-9_.]+)", text)
    if match:
        path = match.group(1)
        try:
            default = get_path(default_config(), path)
        except KeyError:
            default = None
        if default is not None:
            typed = [arg.split("=", 1)[1] for arg in args if arg.startswith(f"--config.{path}=")]
            value = f"={typed[-1]}" if typed else ""
            return f"flag --config.{path}{value}: {describe_expected(path, default)}"
    return text
