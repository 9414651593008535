"""Default configuration and its generic validation.

Every experiment file in ``experiments/`` defines ``get_config()``, which starts from
:func:`default_config` and overrides what it needs. Every knob is documented here, where it is
defined. :func:`check_values` checks the schema and the knobs one by one (and the relations this
module can judge alone): it rejects unknown keys (with a did-you-mean), wrong types and
incompatible values, and its errors name the key, the value, what is allowed and how to fix it.

The ``model.*`` keys are also declared, once each, as the fields of the typed configs the model
receives (:mod:`moejax.schema`: ``ModelConfig``, ``MoEConfig``, ``DispatchConfig``, ``L3Config``,
converted once from this ConfigDict with ``from_config``): their allowed choices (:data:`CHOICES`)
and ``> 0`` / ``>= 0`` bounds (:data:`POSITIVE`, :data:`NON_NEGATIVE`) are generated from those
declarations; the other keys' are listed here by hand. The defaults here and there are held equal
by a test; the comments here document each knob for the command line.

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
import logging
import math
from typing import Any

from ml_collections import ConfigDict

from moejax import schema
# ConfigError is defined in moejax.errors; ``from moejax.config import ConfigError`` keeps working.
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
    # Weights by training stage, replacing data.mixture and data.mixture_file: JSON text or the
    # path of a JSON file, [[start_step, {domain: weight}], ...], first stage at step 0.
    c.data.schedule = ""
    c.data.cache_dir = ""  # where the built-in corpus is cached; "" means $MOEJAX_CACHE or ~/.cache/moejax
    # The built-in benchmarks `python -m moejax.eval` scores by default on runs of the built-in
    # corpus (docs/eval.md): "benchmarks-v2", graded tasks that carry signal for sweep-sized models
    # (code_chars, ..., know_type, math_copy), or "benchmarks-v1", one task per domain (code,
    # prose, math, knowledge). Only evaluation reads it; a saved config without it gets this default.
    c.data.benchmarks = "benchmarks-v2"

    c.model = ConfigDict()
    c.model.vocab_size = 272  # embedding rows; at least the tokenizer's vocabulary (byte: 259)
    c.model.d_model = 128
    c.model.num_layers = 4
    c.model.num_heads = 4  # query heads
    c.model.num_kv_heads = 2  # key/value heads (grouped-query attention); divides num_heads
    c.model.head_dim = 32
    c.model.mlp_dim = 512  # hidden width of dense (non-MoE) SwiGLU layers
    c.model.rope_theta = 10_000.0
    c.model.attn_bias = False  # learned biases on the q/k/v projections (Qwen2-MoE)
    c.model.qk_norm = False  # RMSNorm of each query and key head over head_dim, before RoPE (Qwen3-MoE)
    c.model.norm_eps = 1e-6
    c.model.init_std = 0.02  # std of the normal init of all matrices (output projections scaled by depth)
    c.model.tie_embeddings = True  # share the input embedding with the output projection
    c.model.logits_z_loss = 0.0  # weight of mean(logsumexp(logits)^2) on the output logits
    c.model.first_k_dense = 0  # the first k layers use a dense MLP instead of MoE
    c.model.moe_every = 1  # after those, every n-th layer is MoE (1: all of them)

    c.model.moe = ConfigDict()
    c.model.moe.num_experts = 8  # routed experts
    c.model.moe.experts_per_token = 2  # top-k
    c.model.moe.expert_dim = 256  # hidden width of each routed expert (fine-grained: small)
    c.model.moe.num_shared_experts = 1  # always-on experts, fused into one SwiGLU of their total width
    c.model.moe.shared_expert_dim = 256  # hidden width of each shared expert
    c.model.moe.shared_gate = False  # scale the shared experts' output per token by sigmoid(x . w) (Qwen2-MoE)
    c.model.moe.score_func = "softmax"  # router scores: softmax | sigmoid
    c.model.moe.renormalize = True  # rescale the top-k weights to sum to 1
    c.model.moe.routed_scaling = 1.0  # multiplies the routed experts' output (DeepSeek-V3: 2.5)
    # A fixed per-expert bias added to the scores for top-k selection only, stored in the router
    # (float32 [E], no gradient, no decay): an imported DeepSeek-V3 e_score_correction_bias.
    c.model.moe.router_bias = False
    c.model.moe.num_groups = 1  # group-limited routing (DeepSeek-V3 n_group): experts in this many equal groups; 1: off
    c.model.moe.topk_groups = 1  # with num_groups > 1: each token selects only from its best topk_groups groups
    # Routed experts of each MoE layer, in depth order, when they differ (a pruned checkpoint written
    # by `python -m moejax.prune --auto`; docs/pruning.md): each between experts_per_token and
    # num_experts, the largest equal to num_experts. (): num_experts in every MoE layer. Not with
    # group-limited routing or the expert_parallel backend.
    c.model.moe.layer_experts = ()
    # dispatch: dropless (sort + grouped matmul) | capacity (GShard) | expert_parallel (tokens travel
    # to the devices of their experts over mesh.expert; docs/expert_parallel.md)
    c.model.moe.backend = "dropless"
    c.model.moe.capacity_factor = 1.25  # capacity backend: slots per expert = ceil(cf * T * k / E)
    # Dropless matmul: auto (ragged on GPU/TPU; on CPU hybrid, or tiled under 256 rows per expert) | ragged |
    # tiled | hybrid (each expert's first even-share rows in one batched matmul, the rest tiled);
    # moejax/model/grouped_matmul.py.
    c.model.moe.grouped_matmul = "auto"
    c.model.moe.tile_size = 64  # tiled grouped matmul (and hybrid's overflow): rows per tile
    c.model.moe.ep_comm = "all_to_all"  # expert_parallel: how tokens travel: all_to_all | all_gather
    # expert_parallel: slots each device keeps for each of the mesh.expert devices = ceil(factor x its
    # share under perfect balance); assignments past them are dropped (drop_rate); >= mesh.expert: none
    c.model.moe.ep_capacity_factor = 2.0
    # expert_parallel: what happens to assignments past the buffers: drop (counted in drop_rate) |
    # llep (Least-Loaded EP: an overloaded device's excess assignments, and the weights of their
    # experts, go to the least-loaded devices; docs/expert_parallel.md). llep needs mesh.expert > 1;
    # its spilling exchange moves tokens in the all_gather form (ep_comm is the form of the standard
    # exchange it takes below ep_llep_threshold); ep_capacity_factor also sizes each device's native
    # spill-mode buffer, ceil(factor x q) rows with q = its tokens x experts_per_token.
    c.model.moe.ep_balance = "drop"
    # llep: S, the extra experts (spill slots) a device may host, each with its weights and
    # ceil(ep_spill_capacity_factor x q) token rows. Memory per device and MoE layer, static (in
    # elements, forward): buffer rows r = ceil(ep_capacity_factor x q) + S x ceil(spill factor x q)
    # times (2 d_model + 3 expert_dim); hosted weights (S + E / mesh.expert) x 3 x d_model x
    # expert_dim (the slots and the weight ring's travelling block); gathered tokens and partial
    # outputs 2 x mesh.expert x s x d_model (s local tokens). Nothing can be dropped, for any
    # routing, when S >= num_experts / mesh.expert + 1 / ep_spill_capacity_factor.
    c.model.moe.ep_spill_slots = 2
    c.model.moe.ep_spill_capacity_factor = 1.0
    # llep: a layer spills only when an expert group's imbalance, its largest device load over the
    # mean (loads as standard EP asks them), reaches this threshold, or when standard EP's buffers
    # would drop; otherwise it takes standard EP's exchange (no plan, no weight ring, no spill rows)
    # in the ep_comm form with this threshold as its capacity factor (per device pair
    # ceil(threshold x q / mesh.expert) slots: what a device can be asked for under the threshold).
    # The step's metrics count it (llep_engaged, per MoE layer).
    # 1.3 is the value the LLEP authors' reference code runs with (MOE_ADAPTIVE_LPT_ROUTING_RATIO);
    # <= 1: always spill.
    c.model.moe.ep_llep_threshold = 1.3
    # Load-balancing objectives, composed (losses and selection biases add up): a tuple of
    # (name, {hyperparameter: value}) pairs. Names: none | switch | global_batch | seq_aux | z_loss
    # | loss_free | phi | dpsl; formulas, hyperparameters and how to choose: docs/balancing.md.
    # Command line: --config.model.moe.balancing="(('phi', {'alpha': 0.01}), ('z_loss', {'weight': 0.001}))"
    c.model.moe.balancing = (("switch", {"weight": 1e-2}), ("z_loss", {"weight": 1e-3}))

    # Large Lookup Layers (L3, docs/l3.md): token id t owns rows [b_t, b_{t+1}) of a key and a value
    # table; the normed hidden state attends over them, and the up-projected, normed result is mixed
    # back into the residual stream. No auxiliary loss. The size checks apply once after_layers is set.
    c.model.l3 = ConfigDict()
    c.model.l3.after_layers = ()  # an L3 layer after each of these decoder layers (0-based), e.g. (1, 3); (): none
    c.model.l3.budget = 2176  # v: table rows over all tokens; vocab_size <= v <= vocab_size * max_rows
    c.model.l3.max_rows = 16  # k: the most rows one token owns (each owns >= 1); every token gathers k slots
    c.model.l3.key_dim = 0  # key width; 0: d_model, the normed hidden state is the query (else a projection)
    c.model.l3.value_dim = 0  # value width; 0: the key width (tied tables always use the key width)
    c.model.l3.up_dim = 0  # width u of W_up's output o (mixed back as RMSNorm(o)); 0: d_model
    c.model.l3.tied = False  # one table serves as keys and values (V = K): half the table parameters
    c.model.l3.output = "concat"  # concat: W_mix [RMSNorm(o); x] | residual: x + W_out RMSNorm(o)
    # "": uniform rows per token from budget and max_rows; else an allocation JSON written by
    # `python -m moejax.data.l3_alloc` (LZW rows per token) for this vocabulary, budget and max_rows.
    c.model.l3.allocation = ""

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
    "optim.schedule": ("cosine", "wsd", "constant"),
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
BENCHMARK_VERSIONS = ("benchmarks-v1", "benchmarks-v2")  # values of data.benchmarks (moejax/data/benchmarks.py)
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


def resolve_mesh_shape(mesh_cfg: ConfigDict, num_devices: int) -> dict[str, int]:
    """Mesh axis sizes with the one -1 filled in, checked against the device count."""
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

    mesh = resolve_mesh_shape(cfg.mesh, num_devices)
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


def from_dict(values: dict[str, Any]) -> ConfigDict:
    """The inverse of :func:`to_dict` (e.g. a workdir's config.json): the defaults, overridden.

    Unknown keys raise (ml_collections' KeyError); run :func:`moejax.checks.validate` on the result. The
    user-keyed groups (:data:`FREE_KEYS`, e.g. the mixture's domains) are replaced, not merged.
    """
    cfg = default_config()
    values = {key: dict(group) if isinstance(group, dict) else group for key, group in values.items()}
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
