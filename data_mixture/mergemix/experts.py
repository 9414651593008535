"""MergeMix's domain experts: one short, constant-learning-rate run per domain from a shared base.

The paper (Wang et al., arXiv 2601.17858) trains every expert from the same base checkpoint on
100% of its domain, at a constant learning rate, for a few percent of the base's tokens. Here each
expert is an ordinary moejax run of the sweep runner (``data_mixture.sweep``), so it is resumable,
skipped when done, and runs on ``--backend ray`` as well as locally.

**How an expert's config is expressed.** The plan entry's experiment file is this module itself,
with an argument: ``"config": "<abs path>/experts.py:STEP:BASE_WORKDIR"``. moejax's ``--config``
(ml_collections) calls :func:`get_config` with ``"STEP:BASE_WORKDIR"``, which returns the config
the base's checkpoint ``STEP`` was trained with (its ``meta`` item; ``BASE_WORKDIR/config.json``
for checkpoints without one), missing keys filled from moejax's defaults. So the expert has the
base's exact model, batch, sequence length, mesh, data path and optimizer betas without copying
dozens of keys into overrides, and the overrides hold only what makes it an expert (readable in
each run's ``record.json``):

- ``checkpoint.init_from`` / ``checkpoint.init_step``: the base workdir and step (parameters
  only; fresh optimizer state, data position and step counter, as moejax's ``init_from`` does);
- ``data.mixture``: 1.0 on the domain and 0.0 on every other domain of the base's dataset (the
  zero-weight domains are still evaluated); ``data.mixture_file`` / ``data.schedule`` cleared
  when the base used them;
- ``optim.schedule=constant``, ``optim.lr`` (default: the base's peak ``optim.lr``, the learning
  rate the base was trained at before its decay: the paper trains experts at a constant rate
  and does not give a value), ``optim.warmup_steps`` (default: 5% of the expert's steps, at
  least 1 and at most the base's warmup: the optimizer moments start from zero, so a short ramp
  avoids a first full-size Adam step; moejax's warmup starts at 0, so with the default the
  first step only fills the Adam moments; moejax caps any warmup at half the run);
- ``train.steps = ceil(expert_tokens / tokens_per_step)`` with ``tokens_per_step =
  train.global_batch_size * train.seq_len`` of the base, rounded up to a multiple of the
  fractions' common denominator (8 for the default fractions; see below); ``train.seed``;
- the checkpoint cadence (below).

The file path is absolute so the plan works from any working directory (the runner starts every
run from its own current directory); plans and run directories compare it by its path inside the
checkout (``data_mixture.sweep.record.portable_config``), so experts trained from one checkout
resume or are reused from another checkout of the same code (the base workdir must stay where it
was).

**Checkpoints at every fraction.** The expert budget's fractions (default 1/8, 1/4, 1/2, 1) give
the steps ``ceil(f * steps)`` (duplicates merged; the final step is always written). moejax saves
at the multiples of ``checkpoint.every_steps`` and at the end, so ``every_steps`` is the greatest
common divisor of the fraction steps, ``keep_period`` the same (orbax never deletes a multiple of
it, not even after extra saves at a preemption), and ``max_to_keep`` the number of scheduled
saves. Every fraction step is therefore on disk; when the fraction steps are not evenly spaced the
multiples in between are saved too (8 saves for the default fractions: steps is rounded up to a
multiple of 8 for them, at most 7 steps more than asked; without the rounding, 542 steps would give
fraction steps 68, 136, 271, 542 and a save at every step) and the
sweep runner evaluates them all (a run counts as done only when every checkpoint has its
``eval/step_N.json``; pass small ``eval_args``, e.g. ``["--max-items", "64", "--loss-batches",
"2"]``, to keep that cheap: MergeMix evaluates merges, not the experts).

The plan (the sweep runner's JSON schema, plus MergeMix's own keys: ``mergemix`` at the top,
``domain`` / ``fraction_steps`` / ``tokens_per_step`` per entry, which the runner ignores) is written
to ``OUT_DIR/experts_plan.json`` by :func:`train_experts`; rerunning with the same plan resumes
(the runner skips finished experts and resumes the others from their checkpoints).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from fractions import Fraction
from functools import reduce
from pathlib import Path
from typing import Any
from moejax.errors import UserError

PLAN_FILE = "experts_plan.json"
PLAN_KIND = "mergemix-experts"
DEFAULT_FRACTIONS = (0.125, 0.25, 0.5, 1.0)
WARMUP_FRACTION = 0.05  # default warmup: this fraction of the expert's steps (at least 1)
EXPERIMENT_FILE = str(Path(__file__).resolve())


class MergeMixError(UserError):
    """Bad MergeMix expert input (base, step, domain, budget, fractions, plan), named with the fix."""


# ------------------------------------------------------------------------------ experiment file


def get_config(arg: str):
    """moejax experiment-file entry point: ``experts.py:STEP:BASE_WORKDIR`` -> the base's config.

    The config saved with the base's checkpoint ``STEP`` (``STEP`` -1: its latest), keys it
    predates filled from moejax's defaults. Overrides on the command line make it an expert.
    """
    from moejax import config as config_lib

    step_text, sep, workdir = str(arg).partition(":")
    if not sep or not workdir or not step_text.lstrip("-").isdigit():
        raise ValueError(f"experts.py needs the argument STEP:BASE_WORKDIR (e.g. experts.py:6:runs/base), got {arg!r}")
    step = int(step_text)
    saved = base_config_dict(workdir, None if step < 0 else step)
    return config_lib.from_dict(saved)


def base_config_dict(workdir: str, step: int | None) -> dict[str, Any]:
    """The config (a plain dict) the base's checkpoint ``step`` was trained with, defaults filled."""
    from moejax import config as config_lib
    from moejax.eval import restore

    steps = base_steps(workdir)
    step = steps[-1] if step is None else step
    meta = restore.read_meta(os.path.join(workdir, "checkpoints", str(step)))
    saved = meta.get("config") or restore.read_config_json(workdir)
    return restore.fill_defaults(saved, config_lib.default_config().to_dict())


def base_steps(workdir: str | os.PathLike) -> list[int]:
    """The committed checkpoint steps of a workdir (orbax writes ``<step>/`` once a save is done)."""
    from data_mixture.collect import checkpoint_steps

    return checkpoint_steps(workdir)


# -------------------------------------------------------------------------------------- planning


def aligned_steps(steps: int, fractions: Sequence[float]) -> int:
    """``steps`` rounded up to a multiple of the fractions' common denominator (each fraction read as
    p/q with q <= 64), so every fraction step is a multiple of ``steps / denominator`` and the
    checkpoint cadence stays coarse; unchanged when that denominator exceeds ``steps``."""
    lcm = reduce(math.lcm, (Fraction(f).limit_denominator(64).denominator for f in fractions), 1)
    return steps if lcm > steps else math.ceil(steps / lcm) * lcm


def plan_experts(base_workdir: str | os.PathLike, *, base_step: int | None = None, domains: Sequence[str] | str,
                 expert_tokens: float, fractions: Sequence[float] = DEFAULT_FRACTIONS, lr: float | None = None,
                 warmup_steps: int | None = None, seed: int = 0) -> dict[str, Any]:
    """A sweep-runner plan with one entry ``expert_<domain>`` per domain (see the module docstring).

    Every input is checked first (``MergeMixError`` naming the value and the fix): the base workdir
    and step, each domain against the base's dataset (and that it has training tokens), the token
    budget (positive, at least one step), the fractions (in (0, 1]), lr and warmup. Finally every
    entry is resolved with moejax's own parser and validator, as the sweep runner does.
    """
    domain_list = _check_domains(domains)
    fraction_list = _check_fractions(fractions)
    if not isinstance(expert_tokens, (int, float)) or isinstance(expert_tokens, bool) or not math.isfinite(
            expert_tokens) or expert_tokens <= 0:
        raise MergeMixError(f"expert_tokens {expert_tokens!r}; allowed: a positive number of training tokens per "
                            "expert (e.g. a few percent of the base's tokens).")
    workdir = _check_base(base_workdir)
    step = _check_step(workdir, base_step)
    cfg = base_config_dict(workdir, step)
    tokens_per_step = int(cfg["train"]["global_batch_size"]) * int(cfg["train"]["seq_len"])
    if expert_tokens < tokens_per_step:
        raise MergeMixError(
            f"expert_tokens {expert_tokens:g} is smaller than one step of the base ({tokens_per_step} tokens = "
            f"train.global_batch_size {cfg['train']['global_batch_size']} x train.seq_len {cfg['train']['seq_len']}); "
            f"allowed: at least {tokens_per_step}.")
    dataset_domains = _check_domain_data(cfg, domain_list, workdir)
    steps = aligned_steps(math.ceil(expert_tokens / tokens_per_step - 1e-9), fraction_list)
    base_lr = float(cfg["optim"]["lr"])
    if lr is None:
        lr = base_lr
    if not isinstance(lr, (int, float)) or isinstance(lr, bool) or not math.isfinite(lr) or lr <= 0:
        raise MergeMixError(f"lr {lr!r}; allowed: a positive finite learning rate (default: the base's optim.lr, "
                            f"{base_lr:g}).")
    if warmup_steps is None:
        warmup_steps = default_warmup_steps(steps, int(cfg["optim"]["warmup_steps"]))
    if not isinstance(warmup_steps, int) or isinstance(warmup_steps, bool) or warmup_steps < 0:
        raise MergeMixError(f"warmup_steps {warmup_steps!r}; allowed: an integer >= 0 (moejax shortens a warmup "
                            "longer than half the run to half of it).")
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise MergeMixError(f"seed {seed!r}; allowed: an integer >= 0 (train.seed of every expert).")
    fraction_steps = {f: max(1, math.ceil(f * steps - 1e-9)) for f in fraction_list}
    wanted = sorted(set(fraction_steps.values()) | {steps})
    every = reduce(math.gcd, [s for s in wanted if s < steps], 0) or steps
    saves = sorted(set(range(every, steps + 1, every)) | {steps})
    runs = []
    for domain in domain_list:
        overrides: dict[str, Any] = {
            "checkpoint.init_from": workdir,
            "checkpoint.init_step": step,
            "data.mixture": {d: (1.0 if d == domain else 0.0) for d in dataset_domains},
        }
        if cfg["data"].get("mixture_file"):
            overrides["data.mixture_file"] = ""
        if cfg["data"].get("schedule"):
            overrides["data.schedule"] = ""
        overrides.update({
            "optim.schedule": "constant",
            "optim.lr": float(lr),
            "optim.warmup_steps": warmup_steps,
            "train.steps": steps,
            "train.seed": seed,
            "checkpoint.every_steps": every,
            "checkpoint.keep_period": every,
            "checkpoint.max_to_keep": len(saves),
        })
        runs.append({
            "name": expert_name(domain), "domain": domain, "config": f"{EXPERIMENT_FILE}:{step}:{workdir}",
            "steps": steps, "tokens_per_step": tokens_per_step,
            "fraction_steps": {repr(f): s for f, s in fraction_steps.items()}, "checkpoint_steps": saves,
            "overrides": overrides,
        })
    plan = {
        "kind": PLAN_KIND, "eval_windows": cfg["train"].get("eval_windows", "first"),  # evaluated as their base
        "mergemix": {"base_workdir": workdir, "base_step": step, "domains": domain_list,
                     "expert_tokens": expert_tokens, "tokens_per_step": tokens_per_step, "steps": steps,
                     "fractions": fraction_list, "lr": float(lr), "warmup_steps": warmup_steps, "seed": seed},
        "runs": runs,
    }
    _check_with_moejax(plan)
    return plan


def default_warmup_steps(steps: int, base_warmup: int) -> int:
    """5% of the expert's steps, at least 1, at most the base's own warmup."""
    return max(0, min(base_warmup, max(1, math.ceil(WARMUP_FRACTION * steps))))


def expert_name(domain: str) -> str:
    return f"expert_{domain}"


def _check_domains(domains: Sequence[str] | str) -> list[str]:
    if isinstance(domains, str):
        domains = [d.strip() for d in domains.split(",")]
    if not isinstance(domains, Sequence) or not domains:
        raise MergeMixError(f"domains {domains!r}; allowed: a non-empty list of the base dataset's domain names "
                            "(e.g. ['code', 'math']) or a comma-separated string.")
    out: list[str] = []
    for i, d in enumerate(domains):
        if not isinstance(d, str) or not d:
            raise MergeMixError(f"domains[{i}] is {d!r}; allowed: a non-empty domain name.")
        if d in out:
            raise MergeMixError(f"domains[{i}] {d!r} is given twice; allowed: each domain once (one expert each).")
        out.append(d)
    return out


def _check_fractions(fractions: Sequence[float]) -> list[float]:
    if isinstance(fractions, (str, bytes)) or not isinstance(fractions, Sequence) or not fractions:
        raise MergeMixError(f"fractions {fractions!r}; allowed: a non-empty list of numbers in (0, 1], the points "
                            f"of the expert budget to keep checkpoints at (default {list(DEFAULT_FRACTIONS)}).")
    out = []
    for i, f in enumerate(fractions):
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not math.isfinite(f) or not 0 < f <= 1:
            raise MergeMixError(f"fractions[{i}] is {f!r}; allowed: a number in (0, 1] (a fraction of the expert's "
                                "training steps; 1 is the final checkpoint, always kept).")
        out.append(float(f))
    return sorted(set(out))


def _check_base(base_workdir: str | os.PathLike) -> str:
    workdir = os.path.abspath(os.fspath(base_workdir))
    if not os.path.isdir(workdir):
        raise MergeMixError(f"base workdir {workdir!r} does not exist; allowed: the workdir of a trained moejax run "
                            "(it holds checkpoints/).")
    if not base_steps(workdir):
        raise MergeMixError(f"base workdir {workdir!r} has no checkpoint (no {os.path.join(workdir, 'checkpoints')}"
                            "/<step>/); train the base first, or give the workdir that holds its checkpoints.")
    return workdir


def _check_step(workdir: str, base_step: int | None) -> int:
    steps = base_steps(workdir)
    if base_step is None:
        return steps[-1]
    if isinstance(base_step, bool) or not isinstance(base_step, int) or base_step not in steps:
        raise MergeMixError(f"base_step {base_step!r} is not a checkpoint of {workdir}; allowed: one of "
                            f"{steps} (or None: the latest, {steps[-1]}).")
    return base_step


def _check_domain_data(cfg: Mapping[str, Any], domains: Sequence[str], workdir: str) -> tuple[str, ...]:
    """The base dataset's domains; each expert domain must be one of them and have training tokens."""
    from moejax.data.dataset import describe_dataset, open_dataset
    from moejax.errors import DataError

    path = cfg["data"].get("path", "")
    try:
        info = describe_dataset(path)
    except DataError as e:
        raise MergeMixError(f"the base {workdir}'s dataset (data.path={path!r}) cannot be read: {e}") from None
    for d in domains:
        if d not in info.domains:
            raise MergeMixError(f"domain {d!r} is not in the base's dataset ({info.description}); allowed: "
                                f"{', '.join(info.domains)}.")
    dataset = open_dataset(path, cfg["data"].get("cache_dir") or None)
    for d in domains:
        tokens = sum(s.num_tokens for s in dataset.streams(d, "train"))
        if tokens == 0:
            raise MergeMixError(f"domain {d!r} has no training data in the base's dataset ({info.description}: 0 "
                                "train tokens); allowed: a domain with data (prepare a source for it, or leave it "
                                "out of the domains).")
    return tuple(info.domains)


def _check_with_moejax(plan: Mapping[str, Any]) -> None:
    """Every entry through moejax's own parser + validator (as ``sweep`` does before launching)."""
    import tempfile

    from data_mixture.sweep.targets import SweepError, targets_from_plan

    try:
        targets_from_plan(plan, tempfile.gettempdir(), plan_name="experts plan")
    except SweepError as e:
        raise MergeMixError(str(e)) from None


# -------------------------------------------------------------------------------------- training


def _comparable(runs):
    """A plan's runs with each config as plans compare it (``record.portable_config``): the same plan
    written from another checkout of the same code is the same plan."""
    from data_mixture.sweep.record import portable_config

    if not isinstance(runs, list):
        return runs
    return [{**r, "config": portable_config(r["config"])} if isinstance(r, dict) and isinstance(r.get("config"), str)
            else r for r in runs]


def train_experts(plan: Mapping[str, Any] | str | os.PathLike, out_dir: str | os.PathLike, *, backend: str = "local",
                  parallel: int | None = 1, retries: int = 1, eval_args: Sequence[str] = (), progress: bool = True,
                  **sweep_options: Any):
    """Trains (and evaluates) every expert of ``plan`` into ``out_dir/expert_<domain>`` with the sweep runner.

    ``plan``: the dict :func:`plan_experts` returned, or the path of a plan JSON. It is written to
    ``out_dir/experts_plan.json``; a plan there from different inputs is refused (use a new
    ``out_dir``), the same one resumes. ``backend``: ``local`` | ``ray``; ``eval_args`` go to
    ``python -m moejax.eval --all`` for every checkpoint (e.g. ``["--max-items", "64"]``);
    ``sweep_options``: further ``data_mixture.sweep.runner.SweepOptions`` fields. Returns the
    runner's ``SweepResult``; raises ``MergeMixError`` on bad input (before any training) and when
    an expert failed or the sweep was interrupted (with the runner's summary: rerun to resume).
    """
    from data_mixture.sweep import record
    from data_mixture.sweep.runner import SweepOptions, run_sweep
    from data_mixture.sweep.targets import SweepError

    plan = _load(plan) if not isinstance(plan, Mapping) else dict(plan)
    if plan.get("kind") != PLAN_KIND or not isinstance(plan.get("runs"), list):
        raise MergeMixError(f"the plan is not a MergeMix experts plan (kind {plan.get('kind')!r}); make it with "
                            "plan_experts(...).")
    out = Path(out_dir).resolve()
    path = out / PLAN_FILE
    if path.is_file():
        old = _load(path)
        if _comparable(old.get("runs")) != _comparable(json.loads(json.dumps(plan["runs"]))):
            raise MergeMixError(f"{path} holds a different experts plan (base, domains or budget changed); use a new "
                                f"out_dir, or delete {out} to retrain.")
    out.mkdir(parents=True, exist_ok=True)
    record.write_json_atomic(path, plan)
    options = SweepOptions(root=str(out), backend=backend, parallel=parallel, retries=retries,
                           eval_args=list(eval_args), progress=progress, **sweep_options)
    try:
        result = run_sweep(path, options)
    except SweepError as e:
        raise MergeMixError(str(e)) from None
    if result.exit_code != 0:
        raise MergeMixError(f"training the experts did not finish (exit {result.exit_code}):\n{result.summary}")
    return result


def load_plan(out_dir: str | os.PathLike) -> dict[str, Any]:
    """The experts plan written to ``out_dir`` by :func:`train_experts`."""
    path = Path(out_dir) / PLAN_FILE
    if not path.is_file():
        raise MergeMixError(f"{path} does not exist: {out_dir} is not an experts directory (train_experts writes it).")
    return _load(path)


def _load(path: str | os.PathLike) -> dict[str, Any]:
    try:
        plan = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise MergeMixError(f"cannot read the experts plan {str(path)!r}: {e}") from None
    if not isinstance(plan, dict):
        raise MergeMixError(f"the experts plan {str(path)!r} is not a JSON object.")
    return plan


def _entry(plan: Mapping[str, Any], domain: str, out_dir) -> Mapping[str, Any]:
    for entry in plan["runs"]:
        if entry.get("domain") == domain:
            return entry
    known = [e.get("domain") for e in plan["runs"]]
    raise MergeMixError(f"domain {domain!r} has no expert in {out_dir}; allowed: {', '.join(map(str, known))}.")


def expert_checkpoints(out_dir: str | os.PathLike) -> dict[str, list[int]]:
    """``{domain: [step, ...]}``: the committed checkpoints of every expert (step 0 excluded)."""
    plan = load_plan(out_dir)
    return {e["domain"]: [s for s in base_steps(Path(out_dir) / e["name"]) if s > 0] for e in plan["runs"]}


def expert_dir(out_dir: str | os.PathLike, domain: str) -> str:
    """The workdir of one expert."""
    return str(Path(out_dir) / _entry(load_plan(out_dir), domain, out_dir)["name"])


def expert_tokens_at(out_dir: str | os.PathLike, domain: str, step: int) -> int:
    """Training tokens the expert of ``domain`` had seen at ``step`` (``step * tokens_per_step``)."""
    entry = _entry(load_plan(out_dir), domain, out_dir)
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= int(entry["steps"]):
        raise MergeMixError(f"step {step!r} of expert {domain!r}; allowed: an integer in [0, {entry['steps']}] "
                            f"(its checkpoints: {entry['checkpoint_steps']}).")
    return step * int(entry["tokens_per_step"])
