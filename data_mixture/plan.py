"""Compute allocation: which proxy runs (sizes, mixtures, tokens) to train under a FLOP budget.

Cost model: a run of N_active active parameters trained on D tokens costs ``6 x N_active x D``
FLOPs (forward 2, backward 4 per parameter per token; attention and embeddings ignored, as in
the usual scaling-law accounting). The plan's total never exceeds ``--budget-flops``.

Candidate allocations: size presets (model overrides; ``params_total``/``params_active`` from
moejax's own ``param_counts`` of ``--config`` with the overrides and the vocabulary moejax derives
from ``--dataset``'s tokenizer, :func:`preset_sizes`) below the target size, sorted by size. A candidate is a
*contiguous window* of presets (at least the law's ``min_sizes``), a tokens-per-parameter ratio
r (D = r x N, N in the prior's size column), and the largest number n of runs per size the
budget affords for that window (equal at every size, at least ``--min-runs-per-size`` and the
law's ``min_runs``; at most 32). Small windows of small models buy many mixtures; windows that
reach close to the target buy a shorter extrapolation. Mixtures: the same space-filling design
at every size (uniform first, then scrambled-Sobol points mapped to the simplex by sorted
spacings, projected exactly onto the per-domain bounds), so that size x mixture interactions
are identified.

Method: **simulate each candidate's extrapolation error from a prior law**. The prior is a
fitted law (``--prior fit.json``: its point fit per validation domain) or, without one, a
documented default (:func:`default_prior`). For every candidate and simulation s = 1..S: draw
its ladder's losses from the prior (``--checkpoints`` evenly spaced checkpoints per run, default 2: at half and all of its tokens) times
log-normal noise ``exp(noise x z)``, fit the law being planned for on that synthetic table,
and predict 64 held-out mixtures at the target (N, D). Scored by the mean relative error
against the prior's own prediction there (``sim_error``, averaged over domains, mixtures and
simulations), with ``sim_regret`` (the prior's mean loss of the mixture the simulated fit ranks
best among the 64, minus the best of the 64) reported alongside. The candidate with the lowest
``sim_error`` wins. Validated on synthetic ground truth in tests/test_dm_plan.py and by
leave-one-scale-out on the ladder table (docs/mixture/commands.md, "Planning").

Protocols (``protocol`` in the plan JSON): runs **from scratch** (every run trains a fresh model
on its mixture), or **mid-training**: at each size one *base* is pretrained on a base mixture
(default uniform) for T_base tokens, then every candidate mixture continues from that base for
T_mid tokens (``checkpoint.init_from`` = the base's run directory, resolved by the sweep under its
root; a fresh optimizer; the mid-training learning-rate schedule of :func:`mid_schedule`). The law
is planned and later fitted on the mid-training runs with D = T_mid: the base is the same for every
mixture of a size, so its contribution is a function of the size and is absorbed by the law's size
term. The bases count once in the FLOPs. Either protocol can replicate runs with ``seeds`` (train
seeds ``seed .. seed + K - 1``, at every size or only at ``seed_sizes``); replicates are simulated
with independent noise.

Training and validation-only domains (:func:`split_domains`): a held-out target (a domain no run
trains on, e.g. ``--dataset DIR --target qa``) is recorded in ``validation_only``, left out of every
mixture, and simulated by the default prior as the mean of the training domains' losses
(:func:`heldout_truth`); the sweep collects it as a ``loss:`` column without a ``mix:`` column.

The plan JSON (schema in docs/mixture/commands.md, "Planning") lists every run with the overrides
``launch.sh`` needs; the sweep runner executes it.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any, Callable

import numpy as np
from moejax.errors import UserError

PLAN_VERSION = 1
MAX_RUNS_PER_SIZE = 32
TEST_MIXTURES = 64
BASE_SEED_OFFSET = 10_000  # a base's train.seed is the plan's seed + this (see mid_schedule)
MID_WARMUP_FRACTION = 0.05  # of a mid-training run's steps (as MergeMix's experts)
DEFAULT_BASE_TOKENS_PER_PARAM = 20.0
DEFAULT_MID_TOKENS_PER_PARAM = (4.0,)

# Default size presets: the ladder's four (experiments/studies/do_laws_predict_larger_sizes.py) and four larger ones,
# all MoE with the tiny default's 8 experts top-2 plus one shared expert.
DEFAULT_PRESETS: dict[str, dict[str, Any]] = {
    "s1": {"model.d_model": 64, "model.num_layers": 2, "model.num_heads": 2, "model.num_kv_heads": 1,
           "model.mlp_dim": 256, "model.moe.expert_dim": 128, "model.moe.shared_expert_dim": 128},
    "s2": {"model.d_model": 96, "model.num_layers": 3, "model.num_heads": 3, "model.num_kv_heads": 1,
           "model.mlp_dim": 384, "model.moe.expert_dim": 192, "model.moe.shared_expert_dim": 192},
    "s3": {},
    "s4": {"model.d_model": 192, "model.num_layers": 4, "model.num_heads": 6, "model.num_kv_heads": 2,
           "model.mlp_dim": 768, "model.moe.expert_dim": 384, "model.moe.shared_expert_dim": 384},
    "s5": {"model.d_model": 256, "model.num_layers": 6, "model.num_heads": 8, "model.num_kv_heads": 2,
           "model.mlp_dim": 1024, "model.moe.expert_dim": 512, "model.moe.shared_expert_dim": 512},
    "s6": {"model.d_model": 384, "model.num_layers": 8, "model.num_heads": 12, "model.num_kv_heads": 4,
           "model.mlp_dim": 1536, "model.moe.expert_dim": 768, "model.moe.shared_expert_dim": 768},
    "s7": {"model.d_model": 512, "model.num_layers": 12, "model.num_heads": 16, "model.num_kv_heads": 4,
           "model.mlp_dim": 2048, "model.moe.expert_dim": 1024, "model.moe.shared_expert_dim": 1024},
    "s8": {"model.d_model": 768, "model.num_layers": 16, "model.num_heads": 12, "model.num_kv_heads": 4,
           "model.head_dim": 64, "model.mlp_dim": 3072, "model.moe.expert_dim": 1536,
           "model.moe.shared_expert_dim": 1536},
}


class PlanError(UserError):
    """A plan that cannot be made: the budget, presets, prior or bounds at fault, with the numbers."""


@dataclasses.dataclass
class PlanSpec:
    budget_flops: float
    target_size: float
    target_tokens: float
    prior: str | None = None  # fit JSON; None: default_prior
    law: str | None = None  # default: the prior's law, else camel
    presets: Mapping[str, Mapping[str, Any]] | None = None
    tokens_per_param: Sequence[float] = (20.0,)
    min_weight: Mapping[str, float] = dataclasses.field(default_factory=dict)
    max_weight: Mapping[str, float] = dataclasses.field(default_factory=dict)
    noise: float = 0.01
    simulations: int = 3
    sim_starts: int = 16
    seed: int = 0
    config: str = "experiments/configs/tiny_moe.py"
    batch: int = 16
    seq_len: int = 256
    domains: str | None = None  # comma-separated training domains (default: the prior's)
    min_runs_per_size: int = 3
    max_candidates: int = 12
    min_sizes: int = 0  # fewest presets per candidate window (0: the planned law's own minimum)
    checkpoints: int = 2  # evaluated checkpoints per run, evenly spaced (rows of the runs table per run)
    # Mid-training protocol (see the module docstring); tokens_per_param is then not used.
    mid_training: bool = False
    base_tokens_per_param: float | None = None  # T_base = this x N (default 20); or base_tokens
    base_tokens: float | None = None  # T_base, the same at every size
    mid_tokens_per_param: Sequence[float] | None = None  # candidate T_mid = r x N (default 4); or mid_tokens
    mid_tokens: float | None = None  # T_mid, the same at every size
    base_mixture: Mapping[str, float] | None = None  # default: uniform over the training domains
    mid_lr_scale: float = 1.0  # mid-training peak lr = this x the experiment's optim.lr
    # Replicates: train seeds seed .. seed + seeds - 1 at seed_sizes (None: every size).
    seeds: int = 1
    seed_sizes: Sequence[str] | None = None
    # What the mixture is chosen for (data_mixture.target text; None: every validation domain).
    target: str | None = None
    # Unique tokens per scarce domain (the data's pool, data.unique_tokens). Without
    # match_repetition every run trains on this same pool (a proxy repeats it fewer times than the
    # target run will); with it every proxy run gets U x (its tokens / target_tokens), so that a
    # proxy repeats each scarce domain as many times as the target run will at the same weight.
    unique_tokens: Mapping[str, float] = dataclasses.field(default_factory=dict)
    match_repetition: bool = False
    # A prepared dataset every run trains on (data.path): its tokenizer sizes the models, its
    # domains are the training domains (less the validation-only ones) unless --domains or a prior say.
    dataset: str | None = None
    # Domains no run trains on (held-out targets): evaluated, never weighted. None: derived
    # (a --target naming one dataset domain, with no --domains, is held out; :func:`split_domains`).
    validation_only: Sequence[str] | None = None


@dataclasses.dataclass(frozen=True)
class Protocol:
    """The checked protocol of a plan: how runs are trained (see the module docstring)."""

    mid: bool
    ratios: tuple[float | None, ...]  # candidate tokens-per-parameter ratios of the law's runs (scratch or mid)
    fixed_tokens: float | None  # mid_tokens: the law's runs' tokens at every size (ratios unused)
    base_ratio: float | None
    base_tokens: float | None
    base_mixture: dict[str, float]
    seeds: int
    seed_sizes: tuple[str, ...] | None  # None: every size

    def run_tokens(self, n: float, ratio: float | None) -> float:
        """Tokens of a law run (scratch or mid-training) at size n (in the planning size column)."""
        if self.fixed_tokens is not None:
            return self.fixed_tokens
        assert ratio is not None, "the ratios are None only where fixed_tokens is set"
        return ratio * n

    def base_goal(self, n: float) -> float:
        """Tokens of the base at size n (0 for a from-scratch plan)."""
        if not self.mid:
            return 0.0
        if self.base_tokens is not None:
            return self.base_tokens
        assert self.base_ratio is not None, "a mid-training protocol has base_tokens or base_ratio"
        return self.base_ratio * n

    def seeds_at(self, preset: str) -> int:
        return self.seeds if self.seed_sizes is None or preset in self.seed_sizes else 1


def checkpoint_fractions(checkpoints: int) -> tuple[float, ...]:
    """The fractions of a run's tokens at which its ``checkpoints`` evaluated checkpoints fall."""
    return tuple((k + 1) / checkpoints for k in range(checkpoints))


def preset_sizes(presets: Mapping[str, Mapping[str, Any]], config_file: str | None = None,
                 dataset: str | None = None) -> dict[str, dict[str, float]]:
    """params_total/params_active of each preset: the experiment file ``config_file`` (default:
    moejax's default config) plus the preset's overrides, with the values moejax derives from the
    prepared ``dataset`` (``model.vocab_size`` from its tokenizer) as training will derive them, so
    the FLOPs and tokens per parameter are those of the models the sweep trains."""
    from moejax.config import default_config, load
    from moejax.derive import derive_from_dataset
    from moejax.errors import ConfigError
    from moejax.model.transformer import param_counts

    out = {}
    for name, overrides in presets.items():
        if config_file:
            try:
                cfg, _ = load(config_file)
            except ConfigError as e:
                raise PlanError(f"--config {config_file!r}: {e}") from None
        else:
            cfg = default_config()
        for key, value in overrides.items():
            parts = key.split(".")
            group = cfg
            try:
                for p in parts[:-1]:
                    group = group[p]
                if parts[-1] not in group:
                    raise KeyError(parts[-1])
                group[parts[-1]] = value
            except (KeyError, TypeError, ConfigError):
                raise PlanError(f"preset {name!r}: override {key!r} is not a moejax config key (see moejax/config.py).") from None
        if dataset:
            cfg.data.path = dataset
            derive_from_dataset(cfg, changed=tuple(overrides), notes=False)
        counts = param_counts(cfg.model)
        out[name] = {"params_total": float(counts["total"]), "params_active": float(counts["active"])}
    return out


def space_filling_mixtures(n: int, m: int, lo_m: np.ndarray, hi_m: np.ndarray, seed: int) -> np.ndarray:
    """(n, m) mixtures inside the bounds: the (projected) uniform mixture, then scrambled Sobol
    points mapped to the simplex by sorted uniform spacings (uniform on the simplex), projected."""
    from scipy.stats import qmc

    from data_mixture.optimize import project

    pts = [np.full((1, m), 1.0 / m)]
    if n > 1:
        k = max(1, math.ceil(math.log2(n)))
        u = qmc.Sobol(d=max(1, m - 1), scramble=True, seed=seed).random(2 ** k)[: n - 1]
        u = np.sort(u, axis=1)
        spacings = np.diff(np.concatenate([np.zeros((n - 1, 1)), u, np.ones((n - 1, 1))], axis=1), axis=1)
        pts.append(spacings)
    return project(np.concatenate(pts), lo_m, hi_m)


DEFAULT_PRIOR_FORMULA = "L_v = 1.0 + 40 / N^0.3 + 300 / D^0.3 + 0.8 exp(-3 w_v)(1 + 5e3 / N^0.5)"


def default_prior(domains: Sequence[str]) -> Callable:
    """A weakly informative prior when no fit is given: per validation domain v (one per training
    domain) ``DEFAULT_PRIOR_FORMULA``: a Chinchilla-like scaling in N and D plus a mixture term
    whose weight shrinks with size, so the optimum moves."""
    def loss_fn(v, n_r, d_r, mix_rm):
        return 1.0 + 40.0 / n_r ** 0.3 + 300.0 / d_r ** 0.3 + 0.8 * np.exp(-3.0 * mix_rm[:, v]) * (1 + 5e3 / n_r ** 0.5)
    return loss_fn


def _prior_fn(fit) -> Callable:
    def loss_fn(v, n_r, d_r, mix_rm):
        return fit.point[fit.loss_domains[v]].predict(n_r, d_r, mix_rm)
    return loss_fn


def _candidates(spec: PlanSpec, proto: Protocol, sizes: dict[str, dict[str, float]], size_column: str,
                min_sizes: int, min_runs: int) -> list[dict[str, Any]]:
    names = sorted((n for n in sizes if sizes[n][size_column] < spec.target_size), key=lambda n: sizes[n][size_column])
    if len(names) < min_sizes:
        raise PlanError(f"{len(names)} preset(s) are below the target size {spec.target_size:.4g} ({size_column}): "
                        f"{', '.join(names) or 'none'}; the law needs at least {min_sizes} sizes. Add presets (--presets).")
    out, cheapest = [], math.inf
    for ratio in proto.ratios:
        for k in range(min_sizes, len(names) + 1):
            for start in range(0, len(names) - k + 1):
                window = names[start:start + k]
                base_flops = sum(6.0 * sizes[n]["params_active"] * proto.base_goal(sizes[n][size_column]) for n in window)
                per_mixture = sum(6.0 * sizes[n]["params_active"] * proto.run_tokens(sizes[n][size_column], ratio)
                                  * proto.seeds_at(n) for n in window)
                need = max(spec.min_runs_per_size, math.ceil(min_runs / k))
                cheapest = min(cheapest, base_flops + per_mixture * need)
                runs = min(MAX_RUNS_PER_SIZE, int(max(0.0, spec.budget_flops - base_flops) // per_mixture))
                if runs >= need:
                    out.append(_candidate(proto, window, ratio, runs, base_flops, per_mixture))
    if not out:
        bases = " plus one base per size" if proto.mid else ""
        raise PlanError(f"budget {spec.budget_flops:.4g} FLOPs affords no allocation: the cheapest needs {cheapest:.4g} "
                        f"(the {min_sizes} smallest presets x {spec.min_runs_per_size} runs each{bases}, "
                        f"{_tokens_text(proto)}, FLOPs = 6 x N_active x D). Raise --budget-flops, lower the "
                        "tokens, --seeds or --min-runs-per-size, or add smaller presets.")
    if len(out) > spec.max_candidates:  # keep an even spread, always including the ones reaching highest
        idx = np.unique(np.linspace(0, len(out) - 1, spec.max_candidates).round().astype(int))
        out = [out[i] for i in idx]
    return out


def _candidate(proto: Protocol, window: list[str], ratio: float | None, runs: int, base_flops: float,
               per_mixture: float) -> dict[str, Any]:
    cand: dict[str, Any] = {"sizes": window, "tokens_per_param": ratio, "runs_per_size": runs,
                            "flops": base_flops + per_mixture * runs}
    if proto.fixed_tokens is not None:
        cand["tokens"] = {n: proto.fixed_tokens for n in window}
    if proto.mid:
        cand["base_flops"] = base_flops
    if any(proto.seeds_at(n) > 1 for n in window):
        cand["seeds"] = {n: proto.seeds_at(n) for n in window}
    return cand


def _tokens_text(proto: Protocol) -> str:
    runs = (f"{proto.fixed_tokens:g} tokens per run" if proto.fixed_tokens is not None
            else f"{min(r for r in proto.ratios if r is not None):g} tokens/param")
    if not proto.mid:
        return f"at {runs}"
    base = f"{proto.base_tokens:g} tokens" if proto.base_tokens is not None else f"{proto.base_ratio:g} tokens/param"
    return f"bases at {base}, mid-training runs at {runs}"


def simulate(truth: Callable, law_name: str, cand: Mapping[str, Any], sizes, size_column: str, mix_domains, loss_domains,
             lo_m, hi_m, *, target_size: float, target_tokens: float, noise: float, simulations: int,
             starts: int, seed: int) -> dict[str, float]:
    """Simulated extrapolation error of one candidate allocation (see the module docstring).

    ``cand["seeds"]`` ({preset: K}, optional): K replicates of every mixture at that size, each with
    its own noise draw, as the sweep trains them."""
    from data_mixture.laws import get_law
    from data_mixture.table import from_columns

    law = get_law(law_name)
    m = len(mix_domains)
    rng = np.random.default_rng(seed)
    test_km = rng.dirichlet(np.ones(m), TEST_MIXTURES)
    from data_mixture.optimize import project

    test_km = project(test_km, lo_m, hi_m)
    n_t, d_t = np.full(TEST_MIXTURES, target_size), np.full(TEST_MIXTURES, target_tokens)
    true_kv = np.stack([np.asarray(truth(v, n_t, d_t, test_km)) for v in range(len(loss_domains))], axis=1)
    errors, regrets = [], []
    for s in range(simulations):
        mix = space_filling_mixtures(cand["runs_per_size"], m, lo_m, hi_m, seed=seed + 1000 * s)
        cols: dict[str, list] = {"run": [], "params_total": [], "params_active": [], "tokens": []}
        cols.update({f"mix:{d}": [] for d in mix_domains})
        for name in cand["sizes"]:  # cand["tokens"] {preset: tokens} (a fixed-budget ladder) overrides the ratio
            total = cand.get("tokens", {}).get(name) or cand["tokens_per_param"] * sizes[name][size_column]
            for k, rep in itertools.product(range(mix.shape[0]), range(cand.get("seeds", {}).get(name, 1))):
                for frac in checkpoint_fractions(cand.get("checkpoints", 2)):
                    cols["run"].append(f"{name}_m{k}" + (f"_s{rep}" if rep else ""))
                    cols["params_total"].append(sizes[name]["params_total"])
                    cols["params_active"].append(sizes[name]["params_active"])
                    cols["tokens"].append(frac * total)
                    for j, d in enumerate(mix_domains):
                        cols[f"mix:{d}"].append(float(mix[k, j]))
        n_r = np.asarray(cols[size_column])
        d_r = np.asarray(cols["tokens"])
        mix_rm = np.stack([np.asarray(cols[f"mix:{d}"]) for d in mix_domains], axis=1)
        for v, dom in enumerate(loss_domains):
            clean = np.asarray(truth(v, n_r, d_r, mix_rm), np.float64)
            cols[f"loss:{dom}"] = list(clean * np.exp(noise * rng.standard_normal(clean.shape)))
        table = from_columns(cols)
        pred_kv = np.stack([law.fit(table, dom, size_column=size_column, seed=seed + s, starts=starts).predict(n_t, d_t, test_km)
                            for dom in loss_domains], axis=1)
        errors.append(float(np.mean(np.abs(pred_kv - true_kv) / true_kv)))
        true_mean = true_kv.mean(axis=1)
        regrets.append(float(true_mean[np.argmin(pred_kv.mean(axis=1))] - true_mean.min()))
    return {"sim_error": float(np.mean(errors)), "sim_error_std": float(np.std(errors)),
            "sim_regret": float(np.mean(regrets))}


def _bounds(domains, spec: PlanSpec):
    from data_mixture.optimize import Constraints, OptimizeError, feasible_bounds

    try:
        lo, hi, _ = feasible_bounds(domains, Constraints(min_weight=spec.min_weight, max_weight=spec.max_weight), 1.0)
    except OptimizeError as e:
        raise PlanError(str(e).replace("target tokens", "tokens")) from None
    return lo, hi


def _check_numbers(spec: PlanSpec) -> None:
    for name, value in (("--budget-flops", spec.budget_flops), ("--target-size", spec.target_size),
                        ("--target-tokens", spec.target_tokens)):
        if not (math.isfinite(value) and value > 0):
            raise PlanError(f"{name} is {value!r}; allowed: a number > 0.")
    if spec.min_sizes < 0:
        raise PlanError(f"--min-sizes {spec.min_sizes}: allowed: an integer >= 0 (0: the law's own minimum).")
    if spec.checkpoints < 1:
        raise PlanError(f"--checkpoints {spec.checkpoints}: allowed: an integer >= 1 (evaluated checkpoints per run).")
    if spec.noise < 0 or spec.simulations < 1 or spec.sim_starts < 1:
        raise PlanError(f"--noise {spec.noise}, --simulations {spec.simulations}, --sim-starts {spec.sim_starts}: "
                        "allowed: noise >= 0, at least 1 simulation and 1 start.")
    if any(not (math.isfinite(r) and r > 0) for r in spec.tokens_per_param):
        raise PlanError(f"--tokens-per-param {list(spec.tokens_per_param)}: allowed: numbers > 0.")
    if isinstance(spec.seeds, bool) or not isinstance(spec.seeds, int) or spec.seeds < 1:
        raise PlanError(f"--seeds {spec.seeds!r}: allowed: an integer >= 1 (replicates per run, train seeds "
                        f"{spec.seed} .. {spec.seed} + K - 1; 1: no replicates).")


def _positive(flag: str, value: float | None) -> None:
    if value is not None and not (math.isfinite(value) and value > 0):
        raise PlanError(f"{flag} {value!r}: allowed: a number > 0.")


def _protocol(spec: PlanSpec, mix_domains: Sequence[str], presets: Mapping[str, Any]) -> Protocol:
    """The plan's protocol from the spec, every flag checked (a clear error names the flag)."""
    if spec.seed_sizes is not None:
        unknown = [x for x in spec.seed_sizes if x not in presets]
        if unknown or not spec.seed_sizes:
            raise PlanError(f"--seed-sizes {','.join(spec.seed_sizes)!r}: {', '.join(map(repr, unknown)) or 'empty'} "
                            f"is not a size preset; allowed: a comma-separated list of {', '.join(presets)}.")
    mid_flags = [f for f, v in (("--base-tokens-per-param", spec.base_tokens_per_param), ("--base-tokens", spec.base_tokens),
                                ("--mid-tokens-per-param", spec.mid_tokens_per_param), ("--mid-tokens", spec.mid_tokens),
                                ("--base-mixture", spec.base_mixture)) if v is not None]
    if spec.mid_lr_scale != 1.0:
        mid_flags.append("--mid-lr-scale")
    seeds: dict[str, Any] = dict(seeds=spec.seeds, seed_sizes=tuple(spec.seed_sizes) if spec.seed_sizes is not None else None)
    if not spec.mid_training:
        if mid_flags:
            raise PlanError(f"{', '.join(mid_flags)} describe(s) a mid-training plan; add --mid-training (or leave "
                            "them out for runs from scratch, sized by --tokens-per-param).")
        return Protocol(False, tuple(spec.tokens_per_param), None, None, None, {}, **seeds)
    for a, b in (("--base-tokens-per-param", "--base-tokens"), ("--mid-tokens-per-param", "--mid-tokens")):
        if a in mid_flags and b in mid_flags:
            raise PlanError(f"{a} and {b} are both given; allowed: one of them (a ratio to the size, or tokens at "
                            "every size).")
    _positive("--base-tokens-per-param", spec.base_tokens_per_param)
    _positive("--base-tokens", spec.base_tokens)
    _positive("--mid-tokens", spec.mid_tokens)
    _positive("--mid-lr-scale", spec.mid_lr_scale)
    ratios = tuple(spec.mid_tokens_per_param or DEFAULT_MID_TOKENS_PER_PARAM)
    if not ratios or any(not (math.isfinite(r) and r > 0) for r in ratios):
        raise PlanError(f"--mid-tokens-per-param {list(ratios)}: allowed: numbers > 0.")
    base_ratio = None if spec.base_tokens is not None else (spec.base_tokens_per_param or DEFAULT_BASE_TOKENS_PER_PARAM)
    return Protocol(True, (None,) if spec.mid_tokens is not None else ratios, spec.mid_tokens, base_ratio, spec.base_tokens,
                    _base_mixture(spec.base_mixture, mix_domains), **seeds)


def _base_mixture(weights: Mapping[str, float] | None, mix_domains: Sequence[str]) -> dict[str, float]:
    """The base mixture over the training domains (default uniform), checked and normalised."""
    if not weights:
        return {d: 1.0 / len(mix_domains) for d in mix_domains}
    unknown = [d for d in weights if d not in mix_domains]
    bad = [f"{d}={w!r}" for d, w in weights.items() if not (math.isfinite(w) and w >= 0)]
    total = sum(weights.values())
    if unknown or bad or not abs(total - 1.0) <= 1e-3:
        what = (f"unknown domain(s) {', '.join(unknown)}" if unknown else f"weight(s) {', '.join(bad)}" if bad
                else f"weights summing to {total:g}")
        raise PlanError(f"--base-mixture has {what}; allowed: weights >= 0 over the training domains "
                        f"{', '.join(mix_domains)} (missing ones 0), summing to 1.")
    return {d: float(weights.get(d, 0.0)) / total for d in mix_domains}


def _experiment_optim(config_file: str):
    """The ``optim`` group of the experiment file the runs start from (moejax's own loader)."""
    from moejax.config import load
    from moejax.errors import ConfigError

    try:
        cfg, _ = load(config_file)
    except ConfigError as e:
        raise PlanError(f"--config {config_file!r}: {e}") from None
    return cfg.optim


def mid_schedule(steps: int, optim, lr_scale: float) -> dict[str, Any]:
    """The learning-rate overrides of a mid-training run of ``steps`` steps.

    moejax's ``init_from`` takes the base's parameters only: the Adam moments start at zero, so a
    short linear warmup (``MID_WARMUP_FRACTION`` of the steps, at least 1; MergeMix's experts use
    the same) keeps the first, sign-like Adam steps from jolting the trained weights. It warms up
    again to the base's peak ``optim.lr`` (times ``lr_scale``) and decays with a cosine to
    ``optim.min_lr_ratio`` of that peak over the mid-training tokens (re-warming and re-decaying
    as in continual pretraining): a learning rate large enough for the new mixture to move the
    model within T_mid, annealed at the end so the final checkpoint's losses are comparable across
    mixtures and with the annealed base. The base is trained with ``train.seed`` = seed +
    ``BASE_SEED_OFFSET``: moejax shuffles each domain by (``train.seed``, domain), so a mid-training
    run with the base's seed would read each domain in the base's order again.
    """
    return {"optim.schedule": "cosine", "optim.lr": float(optim.lr) * lr_scale,
            "optim.warmup_steps": max(1, math.ceil(MID_WARMUP_FRACTION * steps))}


def _plan_target(spec: PlanSpec):
    from data_mixture.table import TableError
    from data_mixture.target import parse_target

    if not spec.target:
        return None
    try:
        return parse_target(spec.target)
    except TableError as e:
        raise PlanError(str(e)) from None


HELDOUT_PRIOR = "L_target = the mean of the training domains' L_v (the default prior has no held-out domain)"


def heldout_truth(truth: Callable, n_mix: int) -> Callable:
    """The default prior's loss of a held-out target (a domain no run trains on): the mean of the
    training domains' prior losses, a target that every training domain serves alike
    (``HELDOUT_PRIOR``). A ``--prior`` fitted on a pilot that evaluated the target replaces it."""
    return lambda v, n_r, d_r, mix_rm: np.mean([np.asarray(truth(u, n_r, d_r, mix_rm)) for u in range(n_mix)], axis=0)


def _single_domain(target) -> str | None:
    """The loss domain of a target that is one validation domain (``--target qa``), else None."""
    parts = target.loss_domains() if target is not None else {}
    return next(iter(parts)) if len(parts) == 1 else None


def split_domains(spec: PlanSpec) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(training domains, validation-only domains) of a plan without a prior fit.

    Training domains: ``--domains``, else the ``--dataset``'s domains less the validation-only ones.
    Validation-only: ``--validation-only``, else, when the domains come from the dataset, a
    ``--target`` that is one of its domains (a single-domain target a run trains on makes the choice
    trivial: weight that domain; a weighted set such as ``code=0.6,prose=0.4`` keeps its domains
    trained). A single-domain target that is not a training domain (the built-in corpus's
    ``heldout_qa``, or a dataset domain left out of ``--domains``) is validation-only too."""
    target = _plan_target(spec)
    held = list(spec.validation_only or ())
    if spec.domains:
        mix = [x.strip() for x in spec.domains.split(",") if x.strip()]
    elif spec.dataset:
        from moejax.data import describe_dataset

        every = list(describe_dataset(spec.dataset).domains)
        if spec.validation_only is None and _single_domain(target) in every:
            held = [str(_single_domain(target))]
        unknown = [d for d in held if d not in every]
        if unknown:
            raise PlanError(f"--validation-only {','.join(unknown)}: not a domain of dataset {spec.dataset}; its domains: "
                            f"{', '.join(every)}.")
        mix = [d for d in every if d not in held]
    else:
        raise PlanError("without --prior, give the training domains with --domains (e.g. --domains "
                        "code,prose,math,knowledge) or a prepared dataset with --dataset (its domains).")
    both = [d for d in held if d in mix]
    if both:
        raise PlanError(f"{', '.join(both)} is both a training domain (--domains) and validation-only "
                        "(--validation-only); allowed: one or the other.")
    single = _single_domain(target)
    if single is not None and single not in mix and single not in held:
        held.append(single)
    if len(mix) < 2:
        raise PlanError(f"training domains {', '.join(mix) or 'none'} (validation-only: {', '.join(held) or 'none'}): "
                        "a mixture needs at least 2; allowed: --domains naming 2 or more.")
    return tuple(mix), tuple(held)


def target_truth(truth: Callable, loss_domains: Sequence[str], target) -> Callable:
    """The prior's loss of ``target`` (one validation domain) from its per-domain losses."""
    if target.domain in loss_domains:
        v0 = list(loss_domains).index(target.domain)
        return lambda v, n_r, d_r, mix_rm: truth(v0, n_r, d_r, mix_rm)
    parts = target.loss_domains()
    missing = [d for d in parts if d not in loss_domains] if parts else list(target.weights)
    if missing:
        raise PlanError(f"--target {target.text!r} needs {', '.join(missing)}, which the prior does not predict; it predicts "
                        f"{', '.join(loss_domains)}. Give a --prior fitted with --target {target.text!r}.")
    idx = {d: list(loss_domains).index(d) for d in parts}
    return lambda v, n_r, d_r, mix_rm: sum(w * np.asarray(truth(idx[d], n_r, d_r, mix_rm)) for d, w in parts.items())


def _check_pools(spec: PlanSpec, mix_domains: Sequence[str]) -> None:
    unknown = sorted(set(spec.unique_tokens) - set(mix_domains))
    if unknown:
        raise PlanError(f"--unique-tokens names domain(s) {', '.join(unknown)} that are not training domains: "
                        f"{', '.join(mix_domains)}.")
    bad = {d: v for d, v in spec.unique_tokens.items() if not (math.isfinite(v) and v >= 1)}
    if bad:
        raise PlanError(f"--unique-tokens {bad}; allowed: a number of tokens >= 1 per domain.")
    if spec.match_repetition and not spec.unique_tokens:
        raise PlanError("--match-repetition subsamples the scarce domains' pools per proxy; name them with "
                        "--unique-tokens DOMAIN=N (the unique tokens the target run has).")


def proxy_pools(run: Mapping[str, Any], unique_tokens: Mapping[str, float], target_tokens: float,
                seq_len: int) -> dict[str, Any]:
    """``run`` with the pools that give it the target's repetition rate: U_d x tokens / target
    tokens unique tokens per scarce domain d (at least one window of ``seq_len``), written as
    ``unique_tokens`` and the override ``data.unique_tokens`` the sweep trains with."""
    pools = {d: int(max(seq_len, round(u * run["tokens"] / target_tokens))) for d, u in sorted(unique_tokens.items())}
    text = ",".join(f"{d}={n}" for d, n in pools.items())
    return {**run, "overrides": {**run["overrides"], "data.unique_tokens": text}, "unique_tokens": pools}


def fixed_pools(run: Mapping[str, Any], unique_tokens: Mapping[str, float]) -> dict[str, Any]:
    """``run`` training on the data's own pools: U_d unique tokens per scarce domain d at every
    size, written as ``unique_tokens`` and the override ``data.unique_tokens``."""
    pools = {d: int(u) for d, u in sorted(unique_tokens.items())}
    text = ",".join(f"{d}={n}" for d, n in pools.items())
    return {**run, "overrides": {**run["overrides"], "data.unique_tokens": text}, "unique_tokens": pools}


def _steps(tokens_goal: float, per_step: int) -> int:
    return max(2, math.floor(tokens_goal / per_step))


def _run(spec: PlanSpec, name: str, preset: str, presets, sizes, steps: int, seed: int, mixture: dict[str, float],
         role: str, extra: Mapping[str, Any] | None = None, **fields: Any) -> dict[str, Any]:
    """One plan entry: the preset's model keys, the run length and cadence, seed, mixture, ``extra``."""
    every = math.ceil(steps / spec.checkpoints)  # the last checkpoint is the final step
    overrides = {**presets[preset], "train.steps": steps, "train.global_batch_size": spec.batch,
                 "train.seq_len": spec.seq_len, "checkpoint.every_steps": every,
                 "train.eval_every": every, "train.seed": seed,
                 "optim.warmup_steps": max(1, steps // 10), "data.mixture": mixture, **(extra or {})}
    tokens = float(steps * spec.batch * spec.seq_len)
    return {"name": name, "role": role, "preset": preset, "config": spec.config, "overrides": overrides,
            "mixture": mixture, "tokens": tokens, "steps": steps, "seed": seed, **fields,
            "params_total": sizes[preset]["params_total"], "params_active": sizes[preset]["params_active"],
            "flops": 6.0 * sizes[preset]["params_active"] * tokens}


def replicate_name(preset: str, k: int, seed: int, plan_seed: int) -> str:
    """``<preset>_m<k>`` for the plan's own seed (today's names), ``<preset>_m<k>_s<seed>`` for replicates."""
    return f"{preset}_m{k}" if seed == plan_seed else f"{preset}_m{k}_s{seed}"


def _plan_runs(spec: PlanSpec, proto: Protocol, best: Mapping[str, Any], presets, sizes, size_column: str,
               mix_km: np.ndarray, mix_domains: Sequence[str], optim) -> list[dict[str, Any]]:
    """Bases first (mid-training plans, one per size), then every (size, mixture, seed) run."""
    per_step = spec.batch * spec.seq_len
    runs, bases = [], {}
    if proto.mid:
        for preset in best["sizes"]:
            steps = _steps(proto.base_goal(sizes[preset][size_column]), per_step)
            bases[preset] = _run(spec, f"{preset}_base", preset, presets, sizes, steps, spec.seed + BASE_SEED_OFFSET,
                                 dict(proto.base_mixture), "base")
            runs.append(bases[preset])
    for preset in best["sizes"]:
        steps = _steps(proto.run_tokens(sizes[preset][size_column], best["tokens_per_param"]), per_step)
        for k, rep in itertools.product(range(mix_km.shape[0]), range(proto.seeds_at(preset))):
            seed = spec.seed + rep
            mixture = {d: float(w) for d, w in zip(mix_domains, mix_km[k])}
            name = replicate_name(preset, k, seed, spec.seed)
            if not proto.mid:
                runs.append(_run(spec, name, preset, presets, sizes, steps, seed, mixture, "scratch"))
                continue
            base = bases[preset]
            extra = {"checkpoint.init_from": base["name"], "checkpoint.init_step": base["steps"],
                     **mid_schedule(steps, optim, spec.mid_lr_scale)}
            runs.append(_run(spec, name, preset, presets, sizes, steps, seed, mixture, "mid", extra,
                             base=base["name"], base_tokens=base["tokens"]))
    return runs


def continuation_runs(spec: PlanSpec, preset: str, mixtures: Mapping[str, Mapping[str, float]],
                      seeds: Sequence[int]) -> list[dict[str, Any]]:
    """A mid-training plan's runs at one preset for mixtures chosen later (e.g. the target runs of
    a ladder's picks): the preset's base, exactly as :func:`make_plan` plans it, then one run
    ``<preset>_<name>_s<seed>`` per (named mixture, seed) continued from it with make_plan's
    mid-training recipe. ``spec`` must be a mid-training spec; its budget and target are unused."""
    if not spec.mid_training:
        raise PlanError("continuation runs need a mid-training spec (mid_training=True).")
    presets = dict(spec.presets or DEFAULT_PRESETS)
    if preset not in presets:
        raise PlanError(f"preset {preset!r} is not among the presets: {', '.join(presets)}.")
    domains = list(next(iter(mixtures.values())))
    proto = _protocol(spec, domains, presets)
    optim = _experiment_optim(spec.config)
    sizes = {preset: preset_sizes({preset: presets[preset]}, spec.config, spec.dataset)[preset]}
    n, per_step = sizes[preset]["params_active"], spec.batch * spec.seq_len
    base = _run(spec, f"{preset}_base", preset, presets, sizes, _steps(proto.base_goal(n), per_step),
                spec.seed + BASE_SEED_OFFSET, dict(proto.base_mixture), "base")
    steps = _steps(proto.run_tokens(n, proto.ratios[0]), per_step)
    extra = {"checkpoint.init_from": base["name"], "checkpoint.init_step": base["steps"],
             **mid_schedule(steps, optim, spec.mid_lr_scale)}
    runs = [base]
    for name, mixture in mixtures.items():
        if list(mixture) != domains:
            raise PlanError(f"mixture {name!r} has domains {list(mixture)}; the others have {domains}.")
        for seed in seeds:
            runs.append(_run(spec, f"{preset}_{name}_s{seed}", preset, presets, sizes, steps, seed,
                             {d: float(w) for d, w in mixture.items()}, "mid", extra,
                             base=base["name"], base_tokens=base["tokens"]))
    return runs


def _protocol_record(spec: PlanSpec, proto: Protocol, best: Mapping[str, Any], runs: Sequence[Mapping[str, Any]],
                     optim) -> dict[str, Any]:
    """The plan's top-level ``protocol`` object (docs/mixture/commands.md, "Mid-training plans")."""
    sizes = list(dict.fromkeys(r["preset"] for r in runs))
    out: dict[str, Any] = {
        "kind": "mid_training" if proto.mid else "scratch",
        "seeds": proto.seeds, "seed_values": [spec.seed + r for r in range(proto.seeds)],
        "seed_sizes": [p for p in sizes if proto.seeds_at(p) > 1],
        "seed_sizes_requested": list(proto.seed_sizes) if proto.seed_sizes is not None else None,
    }
    if not proto.mid:
        return out
    mids = {r["preset"]: r for r in runs if r["role"] == "mid"}
    out.update({
        "base_mixture": dict(proto.base_mixture), "base_seed": spec.seed + BASE_SEED_OFFSET,
        "base_tokens_per_param": proto.base_ratio,
        "base_tokens": {r["preset"]: r["tokens"] for r in runs if r["role"] == "base"},
        "mid_tokens_per_param": best["tokens_per_param"],
        "mid_tokens": {p: r["tokens"] for p, r in mids.items()},
        "law_tokens": "mid",
        "schedule": {"optimizer": "fresh", "optim.schedule": "cosine", "base_lr": float(optim.lr),
                     "lr_scale": spec.mid_lr_scale, "peak_lr": float(optim.lr) * spec.mid_lr_scale,
                     "min_lr_ratio": float(optim.min_lr_ratio), "warmup_fraction": MID_WARMUP_FRACTION},
    })
    return out


def _prior(spec: PlanSpec):
    """What the plan simulates from: the prior's loss function, size column, training and
    validation domains, the validation-only domains, the law planned for, and a record of the
    prior (a fit, or the default)."""
    if spec.prior:
        from data_mixture.fit import Fit

        prior = Fit.load(spec.prior, "--prior")
        truth, size_column = _prior_fn(prior), prior.size_column
        mix_domains, loss_domains = tuple(prior.mix_domains), tuple(prior.loss_domains)
        law = spec.law or prior.law
        prior_desc = {"kind": "fit", "path": str(spec.prior), "law": prior.law}
        if spec.domains and tuple(x.strip() for x in spec.domains.split(",")) != mix_domains:
            raise PlanError(f"--domains {spec.domains!r} differs from the prior fit's training domains {', '.join(mix_domains)}.")
        held_out = tuple(spec.validation_only or ())
    else:
        mix_domains, held_out = split_domains(spec)
        loss_domains, size_column = mix_domains, "params_active"
        truth, law = default_prior(mix_domains), spec.law or "camel"
        prior_desc = {"kind": "default", "formula": DEFAULT_PRIOR_FORMULA}
    return truth, size_column, mix_domains, loss_domains, held_out, law, prior_desc


def make_plan(spec: PlanSpec, *, progress: bool = False) -> dict[str, Any]:
    """The plan JSON (see docs/mixture/commands.md, "Planning")."""
    t0 = time.perf_counter()
    _check_numbers(spec)
    truth, size_column, mix_domains, loss_domains, held_out, law, prior_desc = _prior(spec)
    target = _plan_target(spec)
    if target is not None:
        if not spec.prior and target.domain in held_out:  # the default prior knows no held-out domain
            truth, loss_domains = heldout_truth(truth, len(mix_domains)), (target.domain,)
            prior_desc["heldout_target"] = HELDOUT_PRIOR
        else:
            truth, loss_domains = target_truth(truth, loss_domains, target), (target.domain,)
    _check_pools(spec, mix_domains)
    from data_mixture.laws import get_law

    law_obj = get_law(law)
    lo, hi = _bounds(mix_domains, spec)
    presets = dict(spec.presets or DEFAULT_PRESETS)
    proto = _protocol(spec, mix_domains, presets)
    optim = _experiment_optim(spec.config) if proto.mid else None
    sizes = preset_sizes(presets, spec.config, spec.dataset)
    cands = _candidates(spec, proto, sizes, size_column, max(spec.min_sizes, law_obj.min_sizes()),
                        law_obj.min_runs(len(mix_domains)))
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(cands), desc="plan: simulating allocations", unit="allocation")
    for c in cands:
        c["checkpoints"] = spec.checkpoints
        c.update(simulate(truth, law, c, sizes, size_column, mix_domains, loss_domains, lo, hi,
                          target_size=spec.target_size, target_tokens=spec.target_tokens, noise=spec.noise,
                          simulations=spec.simulations, starts=spec.sim_starts, seed=spec.seed))
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    best = min(cands, key=lambda c: (c["sim_error"], c["flops"]))
    mix = space_filling_mixtures(best["runs_per_size"], len(mix_domains), lo, hi, seed=spec.seed)
    runs = _plan_runs(spec, proto, best, presets, sizes, size_column, mix, mix_domains, optim)
    if spec.match_repetition:
        runs = [proxy_pools(r, spec.unique_tokens, spec.target_tokens, spec.seq_len) if r["role"] != "base" else r
                for r in runs]
    elif spec.unique_tokens:
        runs = [fixed_pools(r, spec.unique_tokens) for r in runs]
    if spec.dataset:  # every run trains on the user's dataset (moejax derives its vocabulary size from it)
        runs = [{**r, "overrides": {**r["overrides"], "data.path": spec.dataset}} for r in runs]
    total = float(sum(r["flops"] for r in runs))
    if total > spec.budget_flops:
        raise PlanError(f"the chosen runs need {total:.4g} FLOPs, over --budget-flops {spec.budget_flops:.4g}: the "
                        f"shortest runs are 2 steps of --batch {spec.batch} x --seq-len {spec.seq_len} tokens. Lower "
                        "--batch or --seq-len, or raise the budget or the tokens per run.")
    chosen_keys = ("sizes", "tokens_per_param", "runs_per_size", "sim_error", "sim_error_std", "sim_regret")
    return {
        "version": PLAN_VERSION,
        "budget_flops": float(spec.budget_flops), "total_flops": total,
        "flops_formula": "6 * params_active * tokens",
        "target": {"size": float(spec.target_size), "size_column": size_column, "tokens": float(spec.target_tokens),
                   **({"objective": target.to_json()} if target is not None else {}),
                   **({"unique_tokens": {d: float(v) for d, v in spec.unique_tokens.items()}} if spec.unique_tokens else {}),
                   **({"match_repetition": True} if spec.match_repetition else {})},
        "law": law, "prior": prior_desc,
        "mix_domains": list(mix_domains), "loss_domains": list(loss_domains), "validation_only": list(held_out),
        **({"dataset": spec.dataset} if spec.dataset else {}),
        "eval_windows": "sampled",  # train.eval_windows of every run (a plan without the key: first)
        "bounds": {"min_weight": dict(zip(mix_domains, lo.tolist())), "max_weight": dict(zip(mix_domains, hi.tolist()))},
        "method": {"checkpoints": spec.checkpoints, "noise": spec.noise, "simulations": spec.simulations, "sim_starts": spec.sim_starts,
                   "test_mixtures": TEST_MIXTURES, "score": "sim_error"},
        "seed": spec.seed,
        "protocol": _protocol_record(spec, proto, best, runs, optim),
        "chosen": {k: best[k] for k in chosen_keys + tuple(k for k in ("base_flops", "seeds") if k in best)},
        "candidates": cands,
        "runs": runs,
        "warnings": evaluation_warnings(best["sizes"], law_obj.min_sizes()),
        "seconds": time.perf_counter() - t0,
    }


def evaluation_warnings(sizes: Sequence[str], law_min_sizes: int) -> list[str]:
    """What the plan's sizes leave unchecked: ``evaluate`` and ``recommend`` score a law by holding
    out the largest size and fitting the rest, so a plan needs one size more than the laws' minimum
    (2 for camel, additive, mixing_law and the trend baseline) for every law to be scored."""
    need = max(law_min_sizes, 2) + 1
    if len(sizes) >= need:
        return []
    return [f"the plan's {len(sizes)} size(s) ({', '.join(sizes)}) cannot be checked by `evaluate` or `recommend`: "
            f"holding out the largest leaves {len(sizes) - 1} size(s) to fit, and camel, additive, mixing_law and the "
            f"trend baseline need 2. Plan --min-sizes {need} (with the --budget-flops it needs) to score the laws at a "
            "held-out size."]
