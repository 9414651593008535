"""moejax workdirs -> runs table: one row per evaluated checkpoint.

A workdir (what ``./launch.sh ... --workdir W`` writes) holds ``config.json`` (the run's full
config), ``checkpoints/<step>/`` and, once evaluated with ``python -m moejax.eval``,
``eval/step_<step>.json`` (docs/eval.md). Each ``eval/step_N.json`` with N > 0 becomes one row:

=================  ==========================================================================
``run``            the workdir's name (its path relative to the longest common parent when two
                   workdirs share a name)
``params_total``   ``moejax.model.transformer.param_counts`` of the saved model config (the
``params_active``  numbers the training log prints: embeddings included, the tied output head
                   once; active = shared + top-k routed experts per MoE layer)
``tokens``         ``N x train.global_batch_size x train.seq_len``: the tokens of N optimizer
                   steps (gradient accumulation splits the global batch, it does not add to it)
``flops``          ``6 x params_active x tokens``, the budget measure ``plan`` uses (the finer
                   count with attention is the training log's ``flops_per_token``)
``mix:<domain>``   the training weights; for a ``data.schedule`` the token-weighted average of
                   the stages over steps [0, N) (every step trains on the same number of
                   tokens, so the average weights stage i by the steps it covered before N).
                   Every domain of the dataset gets a column (0 when unused).
``loss:<domain>``  ``losses.domains[<domain>].loss`` of the eval JSON: nats per token on the
                   run's held-out batches
``bench:<task>``   ``accuracy`` for multiple-choice tasks, ``exact_match`` for exact-match tasks;
                   with ``bench_metric="gold_logprob"`` the continuous score of either kind, the
                   mean log-probability of the correct answer (empty when not scored)
``loss:<set>``     ``losses.targets[<set>].loss``: held-out *target sets* no run trains on (the
                   built-in corpus's ``heldout_qa``, docs/data.md): a loss column without a
                   ``mix:`` column
``logprob:<task>`` the task's ``gold_logprob`` (mean log-probability of the correct answer), beside
                   ``bench:<task>`` whatever ``bench_metric`` is: a continuous target
                   (``--target logprob:<task>``)
``unique:<domain>`` the run's pool of unique tokens of a data-constrained domain (its
                   ``data.unique_tokens``, else the prepared dataset's ``unique_tokens``)
``epochs:<domain>`` epochs of that pool seen at the checkpoint: ``epochs/<domain>`` of the training
                   log at that step, else share x tokens / unique tokens
``seed``           ``train.seed`` of the run; written when the runs' seeds differ or a run is a
                   mid-training run (a table without it reads as seed 0 everywhere)
``base``           mid-training runs only (below): the base's run name as collected, empty for
``base_tokens``    runs from scratch; ``base_tokens`` = the base's tokens at the step the run
                   started from
``step``           extra columns carried through: the checkpoint step and the workdir path
``workdir``
``started_at``     when a sweep first started the run (UTC, ISO 8601; ``status.json``), empty when
                   the workdir was not run by a sweep: the time a pre-registration is checked against
=================  ==========================================================================

**Mid-training runs.** A run whose config sets ``checkpoint.init_from`` started from another
run's parameters with moejax's step counter at 0, so its ``tokens`` (and ``flops``) count the
mid-training tokens only. Its base is the workdir ``init_from`` names (a workdir, its
``checkpoints/`` or one step's directory, relative paths from the current directory), which must
be among the collected workdirs with evaluated checkpoints of its own (its rows are the base rows
of the table); ``base_tokens`` is the base's tokens at ``checkpoint.init_step`` (its latest
checkpoint when -1). ``bases="none"`` collects such runs as ordinary runs (MergeMix's experts,
warm-started from a base outside the table); a mapping {workdir: base workdir} names the bases
explicitly (the sweep runner's, from the plan).

**Scheduled checkpoints only.** A run saves a checkpoint every ``checkpoint.every_steps`` steps,
at its last step, and when it is stopped (Ctrl-C, a sweep's stop, preemption) so that it can
resume. Only the scheduled ones make rows (and are evaluated): a run interrupted and resumed gives
the table an uninterrupted run gives. The others are named in :attr:`Collected.skipped`.

A checkpoint without an evaluation is **reported, not guessed**: by default it is left out and
named in :attr:`Collected.unevaluated` (the CLI prints it with the command that evaluates it);
with ``evaluate=True`` collect first runs ``python -m moejax.eval --workdir W --step N`` for each
such checkpoint (a subprocess, so JAX owns the devices only there). With
``losses_from_log=True`` such a checkpoint instead takes its held-out losses from the training
log (``eval_loss/<domain>`` of ``metrics.jsonl`` at that step, which the training loop computes on
the same held-out batches as ``moejax.eval --loss-batches <train.eval_batches>``) and has no
benchmark scores; the ``loss_source`` column says ``eval`` or ``train_log`` per row. A directory without
``config.json`` whose sub-directories are workdirs is expanded one level (a ladder's root).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from moejax.errors import UserError

_STEP_JSON = re.compile(r"^step_(\d+)\.json$")


class CollectError(UserError):
    """A workdir that cannot be read into the table; names the workdir, the file and the fix."""


@dataclasses.dataclass
class Collected:
    """Rows (column -> values, CSV order) plus what was left out and why."""

    columns: dict[str, list[Any]]
    unevaluated: list[tuple[str, int]]  # (workdir, step) checkpoints with no eval/step_N.json
    skipped: list[str]  # human-readable notes (e.g. step-0 evaluations)


def expand_workdirs(paths: Sequence[str | os.PathLike]) -> list[Path]:
    """Workdirs as given; a directory without config.json whose children have one is expanded."""
    out: list[Path] = []
    for p in map(Path, paths):
        if not p.is_dir():
            raise CollectError(f"workdir {str(p)!r} does not exist or is not a directory.")
        if (p / "config.json").is_file():
            out.append(p)
            continue
        children = sorted(c for c in p.iterdir() if c.is_dir() and (c / "config.json").is_file())
        if not children:
            raise CollectError(
                f"{str(p)!r} is not a moejax workdir (no config.json) and has no sub-directory that is one. "
                "Pass the --workdir of a training run (it holds config.json, checkpoints/ and eval/)."
            )
        out.extend(children)
    return out


def checkpoint_steps(workdir: str | os.PathLike) -> list[int]:
    """Committed checkpoints of a workdir (orbax writes ``<step>`` only once a save is complete)."""
    ckpt = Path(workdir) / "checkpoints"
    if not ckpt.is_dir():
        return []
    return sorted(int(c.name) for c in ckpt.iterdir() if c.is_dir() and c.name.isdigit())


def eval_steps(workdir: str | os.PathLike) -> dict[int, Path]:
    """step -> its ``eval/step_N.json``."""
    ev = Path(workdir) / "eval"
    if not ev.is_dir():
        return {}
    return {int(m.group(1)): ev / f.name for f in ev.iterdir() if (m := _STEP_JSON.match(f.name))}


def stage_average(stages: Sequence[tuple[int, dict[str, float]]], step: int) -> dict[str, float]:
    """Token-weighted average of schedule stages over steps [0, step) (weights already normalised)."""
    total: dict[str, float] = {}
    for i, (start, weights) in enumerate(stages):
        end = stages[i + 1][0] if i + 1 < len(stages) else step
        covered = max(0, min(end, step) - start)
        for d, w in weights.items():
            total[d] = total.get(d, 0.0) + covered * w
    norm = sum(total.values())
    if norm <= 0:  # step 0: the first stage's weights
        return dict(stages[0][1])
    return {d: w / norm for d, w in total.items()}


def on_schedule(cfg, step: int) -> bool:
    """Whether ``step`` is one of the run's scheduled checkpoints (every ``checkpoint.every_steps``
    and the last, ``train.steps``); a checkpoint off the schedule was saved when the run was
    stopped, so that it can resume, and makes no row."""
    every = int(cfg.checkpoint.every_steps)
    return step == int(cfg.train.steps) or (every > 0 and step % every == 0)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise CollectError(f"cannot read {path}: {e}") from None


def _run_config(workdir: Path):
    import ml_collections

    cfg = _read_json(workdir / "config.json")
    for key in ("train", "model", "data"):
        if key not in cfg:
            raise CollectError(f"{workdir / 'config.json'} has no {key!r} group; is it a moejax run config?")
    return ml_collections.ConfigDict(cfg)


def _schedule(cfg, domains: Sequence[str], workdir: Path) -> list[tuple[int, dict[str, float]]]:
    """The run's stages with normalised weights, through moejax's own reader (same rules as training)."""
    import warnings

    from moejax.errors import DataError
    from moejax.data.mixture import MixtureWarning, schedule_from_config

    data = cfg.data
    if data.mixture_file and not Path(data.mixture_file).is_absolute() and not Path(data.mixture_file).exists():
        raise CollectError(
            f"{workdir}: the run's data.mixture_file {data.mixture_file!r} is not readable from here; "
            "run collect from the directory the run was launched from (paths in config.json are relative to it)."
        )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", MixtureWarning)
            schedule = schedule_from_config(data, list(domains), "the run's dataset")
    except DataError as e:
        raise CollectError(f"{workdir}: cannot read the run's mixture: {e}") from None
    return [(s.start_step, dict(s.weights)) for s in schedule]


def evaluate_checkpoints(missing: Sequence[tuple[str, int]], eval_args: Sequence[str] = ()) -> None:
    """Runs ``python -m moejax.eval --workdir W --step N`` for each (W, N); stops at the first failure."""
    for workdir, step in missing:
        cmd = [sys.executable, "-m", "moejax.eval", "--workdir", workdir, "--step", str(step), "--no-progress",
               *eval_args]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            raise CollectError(f"evaluating {workdir} step {step} failed ({' '.join(cmd)}): {' '.join(tail)}")


def _started_at(workdir: Path) -> str:
    """The run's first start time a sweep wrote to its ``status.json`` ("" when there is none)."""
    try:
        return str(json.loads((workdir / "status.json").read_text()).get("started_at") or "")
    except (OSError, ValueError):
        return ""


def _run_names(workdirs: Sequence[Path]) -> list[str]:
    names = [w.name for w in workdirs]
    if len(set(names)) == len(names):
        return names
    resolved = [w.resolve() for w in workdirs]
    common = Path(os.path.commonpath([str(r) for r in resolved]))
    return [str(r.relative_to(common)) or r.name for r in resolved]


def _log_losses(workdir: Path) -> dict[int, dict[str, float]]:
    """step -> {domain: held-out loss} from the training log's evaluation records."""
    path = workdir / "metrics.jsonl"
    out: dict[int, dict[str, float]] = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            losses = {k[len("eval_loss/"):]: float(v) for k, v in rec.items() if k.startswith("eval_loss/")}
            if losses:
                out[int(rec["step"])] = losses
    return out


def _init_from_dir(path: str) -> tuple[Path, int | None]:
    """(base workdir, step or None) of a ``checkpoint.init_from`` value, as moejax reads it."""
    p = Path(path).resolve()
    step = None
    if p.name.isdigit() and p.parent.name == "checkpoints":
        p, step = p.parent, int(p.name)
    if p.name == "checkpoints" and not (p / "config.json").is_file():
        p = p.parent
    return p, step


def _base_tokens(base_dir: Path, step: int | None, run: str) -> float:
    """Tokens the base had trained on at ``step`` (its latest checkpoint when None)."""
    cfg = _run_config(base_dir)
    if step is None:
        steps = checkpoint_steps(base_dir)
        if not steps:
            raise CollectError(f"run {run!r} continued from {base_dir}, which has no checkpoint left to count its "
                               "tokens; allowed: a base workdir with its checkpoints.")
        step = steps[-1]
    return float(step * int(cfg.train.global_batch_size) * int(cfg.train.seq_len))


def _bases(dirs: Sequence[Path], names: Sequence[str], cfgs: Sequence[Any],
           bases: str | Mapping[str, str]) -> dict[str, tuple[str, float]]:
    """run name -> (base run name, base tokens) of every mid-training run among ``dirs``."""
    if isinstance(bases, str) and bases not in ("auto", "none"):
        raise CollectError(f"bases={bases!r}; allowed: 'auto', 'none' or a mapping {{workdir: base workdir}}.")
    if bases == "none":
        return {}
    name_of = {d.resolve(): n for d, n in zip(dirs, names)}
    explicit = None if isinstance(bases, str) else {Path(k).resolve(): Path(v).resolve() for k, v in bases.items()}
    out = {}
    for wd, name, cfg in zip(dirs, names, cfgs):
        init_from = str(cfg.get("checkpoint", {}).get("init_from", "") or "")
        if explicit is not None:
            if wd.resolve() not in explicit:
                continue
            base_dir, step = explicit[wd.resolve()], None
        elif not init_from:
            continue
        else:
            base_dir, step = _init_from_dir(init_from)
        init_step = int(cfg.get("checkpoint", {}).get("init_step", -1))
        step = init_step if init_step >= 0 else step
        if base_dir not in name_of:
            raise CollectError(f"run {name!r} ({wd}) is a mid-training run of {base_dir} (checkpoint.init_from="
                               f"{init_from!r}), which is not among the collected workdirs; allowed: collect the base "
                               "too (its evaluated checkpoints are the table's base rows), or pass --ignore-init-from "
                               "to collect warm-started runs as runs from scratch.")
        out[name] = (name_of[base_dir], _base_tokens(base_dir, step, name))
    return out


BENCH_METRICS = ("accuracy", "gold_logprob")  # accuracy: exact_match for exact-match tasks


def collect(workdirs: Sequence[str | os.PathLike], *, evaluate: bool = False,
            eval_args: Sequence[str] = (), losses_from_log: bool = False,
            bases: str | Mapping[str, str] = "auto", bench_metric: str = "accuracy",
            validation_only: Sequence[str] = ()) -> Collected:
    """Reads moejax workdirs into runs-table columns (see the module docstring).

    ``bases``: which runs are mid-training runs of which base: ``"auto"`` (every run with a
    ``checkpoint.init_from``), ``"none"`` (none) or {workdir: base workdir}. ``bench_metric``: one of
    BENCH_METRICS, the score in the ``bench:`` columns. ``validation_only``: domains no run trains
    on (a prepared dataset's held-out target): a ``loss:`` column and no ``mix:`` column; a run
    that gives one a weight is a CollectError."""
    from moejax.model.transformer import param_counts

    if bench_metric not in BENCH_METRICS:
        raise ValueError(f"bench_metric {bench_metric!r}: allowed: {', '.join(BENCH_METRICS)}.")
    dirs = expand_workdirs(workdirs)
    cfgs = [_run_config(wd) for wd in dirs]
    if evaluate:
        missing = [(str(w), s) for w, cfg in zip(dirs, cfgs) for s in checkpoint_steps(w)
                   if s > 0 and s not in eval_steps(w) and on_schedule(cfg, s)]
        evaluate_checkpoints(missing, eval_args)
    rows: list[dict[str, Any]] = []
    unevaluated: list[tuple[str, int]] = []
    skipped: list[str] = []
    seen = _Seen()
    names = _run_names(dirs)
    base_of = _bases(dirs, names, cfgs, bases)
    for name, wd, cfg in zip(names, dirs, cfgs):
        evals = _evaluations(wd, cfg, losses_from_log, skipped, unevaluated)
        if not evals:
            continue
        run = _RunFacts(name=name, workdir=wd, cfg=cfg, counts=param_counts(cfg.model), pools=run_pools(cfg, wd),
                        base=base_of.get(name, ("", "")))
        logged_epochs = _log_epochs(wd) if run.pools else {}
        for step in sorted(evals):
            if step == 0:
                skipped.append(f"{wd}: eval/step_0.json (no training tokens yet)")
                continue
            rows.append(_checkpoint_row(run, step, evals[step], logged_epochs.get(step, {}), seen,
                                        validation_only=validation_only, bench_metric=bench_metric))
    unknown = [d for d in validation_only if d not in seen.loss]
    if unknown:
        raise CollectError(f"--validation-only names {', '.join(unknown)}, which no collected run was evaluated on; "
                           f"their validation domains: {', '.join(seen.loss) or 'none'}.")
    _check_base_rows(rows, base_of, dirs, names)
    return Collected(columns=_columns(rows, seen, bool(base_of)), unevaluated=unevaluated, skipped=skipped)


@dataclasses.dataclass
class _Seen:
    """The table's column names per kind, in the order the rows first name them."""

    mix: list[str] = dataclasses.field(default_factory=list)
    loss: list[str] = dataclasses.field(default_factory=list)
    bench: list[str] = dataclasses.field(default_factory=list)
    logprob: list[str] = dataclasses.field(default_factory=list)
    pooled: list[str] = dataclasses.field(default_factory=list)

    def add(self, kind: str, name: str) -> None:
        names = getattr(self, kind)
        if name not in names:
            names.append(name)


@dataclasses.dataclass(frozen=True)
class _RunFacts:
    """What every row of one run shares."""

    name: str
    workdir: Path
    cfg: Any
    counts: Mapping[str, Any]  # param_counts of the model: total, active
    pools: Mapping[str, int]  # {domain: unique tokens} of its data-constrained domains
    base: tuple[Any, Any]  # (base run, base tokens), or ("", "") for a run from scratch


def _evaluations(wd: Path, cfg, losses_from_log: bool, skipped: list[str],
                 unevaluated: list[tuple[str, int]]) -> dict[int, Any]:
    """step -> its eval/step_N.json path (or, with ``losses_from_log``, {domain: loss} the training
    log recorded) for the run's checkpoints on its schedule; notes the others in ``skipped`` and the
    checkpoints without an evaluation in ``unevaluated``."""
    evals: dict[int, Any] = dict(eval_steps(wd))
    for step in [s for s in evals if s > 0 and not on_schedule(cfg, s)]:
        del evals[step]
        skipped.append(f"{wd}: step {step} (a checkpoint saved when the run was stopped, off its schedule of every "
                       f"{cfg.checkpoint.every_steps} steps and step {cfg.train.steps}: an interrupted run gives the "
                       "rows an uninterrupted one gives)")
    missing = [s for s in checkpoint_steps(wd) if s > 0 and s not in evals and on_schedule(cfg, s)]
    if losses_from_log and missing:
        logged = _log_losses(wd)
        for s in missing:
            if s in logged:
                evals[s] = logged[s]
    unevaluated += [(str(wd), s) for s in missing if s not in evals]
    return evals


def _checkpoint_row(run: _RunFacts, step: int, evaluation: Any, logged_epochs: Mapping[str, float], seen: _Seen, *,
                    validation_only: Sequence[str], bench_metric: str) -> dict[str, Any]:
    """One row of the table: a checkpoint of ``run`` at ``step`` and its evaluation (a step_N.json
    path, or the losses the training log recorded)."""
    wd, cfg = run.workdir, run.cfg
    if isinstance(evaluation, dict):  # from the training log
        result = {"losses": {"domains": {d: {"loss": v} for d, v in evaluation.items()}}, "benchmarks": {}}
        source = "train_log"
    else:
        result = _read_json(evaluation)
        source = "eval"
    try:
        domain_losses = result["losses"]["domains"]
    except (KeyError, TypeError):
        raise CollectError(f"{evaluation} has no losses.domains; is it a moejax.eval step_N.json?") from None
    dataset_domains = list(domain_losses)
    mix = stage_average(_schedule(cfg, dataset_domains, wd), step)
    tokens_per_step = int(cfg.train.global_batch_size) * int(cfg.train.seq_len)
    row: dict[str, Any] = {
        "run": run.name,
        "params_total": float(run.counts["total"]),
        "params_active": float(run.counts["active"]),
        "tokens": float(step * tokens_per_step),
        "flops": 6.0 * run.counts["active"] * step * tokens_per_step,
    }
    trained = [d for d in validation_only if mix.get(d, 0.0) > 0]
    if trained:
        raise CollectError(f"{wd}: --validation-only {', '.join(trained)}, but the run trains on it (weight "
                           f"{mix[trained[0]]:.4g}); a validation-only domain must have weight 0 in every run.")
    for d in dataset_domains:
        if d not in validation_only:
            seen.add("mix", d)
            row["mix:" + d] = mix.get(d, 0.0)
        seen.add("loss", d)
        row["loss:" + d] = float(domain_losses[d]["loss"])
        _standard_error(row, d, domain_losses[d])
    for d, v in ((result.get("losses") or {}).get("targets") or {}).items():  # target sets: loss only
        seen.add("loss", d)
        row["loss:" + d] = float(v["loss"])
        _standard_error(row, d, v)
    for d, u in run.pools.items():
        seen.add("pooled", d)
        row["unique:" + d] = float(u)
        row["epochs:" + d] = logged_epochs.get(d, mix.get(d, 0.0) * row["tokens"] / u)
    _add_benchmarks(row, result.get("benchmarks") or {}, seen, bench_metric)
    row["seed"] = int(cfg.train.seed)
    row["base"], row["base_tokens"] = run.base
    row["step"] = step
    row["loss_source"] = source
    row["workdir"] = str(wd)
    row["started_at"] = _started_at(wd)
    return row


def _add_benchmarks(row: dict[str, Any], benchmarks: Mapping[str, Any], seen: _Seen, bench_metric: str) -> None:
    """The ``bench:`` score (``bench_metric``) and ``logprob:`` of every benchmark into ``row``."""
    for task, res in benchmarks.items():
        seen.add("bench", task)
        if bench_metric == "gold_logprob":
            value = res.get("gold_logprob")
        else:
            value = res.get("exact_match") if res.get("kind") == "exact_match" else res.get("accuracy")
        row["bench:" + task] = "" if value is None else float(value)
        if res.get("gold_logprob") is not None:
            seen.add("logprob", task)
            row["logprob:" + task] = float(res["gold_logprob"])


def _columns(rows: list[dict[str, Any]], seen: _Seen, mid_training: bool) -> dict[str, list[Any]]:
    """The rows as columns in the table's order; every run has every loss column."""
    protocol = (["seed"] if mid_training or len({r["seed"] for r in rows}) > 1 else []) + (
        ["base", "base_tokens"] if mid_training else [])
    columns: dict[str, list[Any]] = {}
    order = (["run", "params_total", "params_active", "tokens", "flops"] + ["mix:" + d for d in seen.mix]
             + ["loss:" + d for d in seen.loss] + ["bench:" + t for t in seen.bench]
             + ["logprob:" + t for t in seen.logprob] + [f"{k}:{d}" for d in seen.pooled for k in ("unique", "epochs")]
             + [LOSS_SE + d for d in seen.loss if any(LOSS_SE + d in r for r in rows)]
             + protocol
             + ["step", "loss_source", "workdir", "started_at"])
    for col in order:
        if col.startswith("mix:"):
            columns[col] = [r.get(col, 0.0) for r in rows]  # a domain the run's dataset lacks: weight 0
        else:
            columns[col] = [r.get(col, "") for r in rows]
    missing_loss = [(r["run"], c) for r in rows for c in order if c.startswith("loss:") and c not in r]
    if missing_loss:
        run, col = missing_loss[0]
        raise CollectError(
            f"run {run!r} has no {col!r} while other runs do: the workdirs were evaluated on different "
            "validation domains (different datasets). Collect them into separate tables."
        )
    return columns


LOSS_SE = "loss_se:"  # the evaluation's own standard error of loss:<domain> (moejax.eval's loss_se)


def _standard_error(row: dict[str, Any], domain: str, losses: Mapping[str, Any]) -> None:
    """``row[loss_se:<domain>]``: the evaluation's standard error of the domain's loss, where it has one."""
    if losses.get("loss_se") is not None:
        row[LOSS_SE + domain] = float(losses["loss_se"])


def run_pools(cfg, workdir: Path) -> dict[str, int]:
    """{domain: unique tokens} of a run's data-constrained domains: its prepared dataset's pools
    (``dataset.json``) overridden by its ``data.unique_tokens`` (as training reads them)."""
    from moejax.data.pools import parse_unique_tokens

    pools: dict[str, int] = {}
    path = str(cfg.data.get("path", "") or "")
    if path and (Path(path) / "dataset.json").is_file():
        for d, entry in (_read_json(Path(path) / "dataset.json").get("domains") or {}).items():
            if isinstance(entry, dict) and entry.get("unique_tokens"):
                pools[d] = int(entry["unique_tokens"])
    try:
        pools.update(parse_unique_tokens(cfg.data.get("unique_tokens", "")))
    except ValueError as e:
        raise CollectError(f"{workdir}: {e}") from None
    return pools


def _log_epochs(workdir: Path) -> dict[int, dict[str, float]]:
    """step -> {domain: epochs} from the training log (``epochs/<domain>``)."""
    path = workdir / "metrics.jsonl"
    out: dict[int, dict[str, float]] = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            found = {k[len("epochs/"):]: float(v) for k, v in rec.items() if k.startswith("epochs/")}
            if found:
                out[int(rec["step"])] = found
    return out


def _check_base_rows(rows: Sequence[Mapping[str, Any]], base_of: Mapping[str, tuple[str, float]],
                     dirs: Sequence[Path], names: Sequence[str]) -> None:
    """Every base named has rows of its own (the table's check, said here with the fix)."""
    have = {r["run"] for r in rows}
    dir_of = dict(zip(names, dirs))
    for run, (base, _) in base_of.items():
        if run in have and base not in have:
            raise CollectError(f"run {run!r} is a mid-training run of {base!r} ({dir_of[base]}), which has no evaluated "
                               f"checkpoint; evaluate it (python -m moejax.eval --workdir {dir_of[base]} --all) or "
                               "pass --evaluate: the base's rows are part of a mid-training table.")


def write_columns(columns: dict[str, list[Any]], path: str | os.PathLike) -> None:
    """Writes collected columns as CSV (floats with repr, so they round-trip), under a temporary
    name renamed into place."""
    from data_mixture.user_files import write_text

    names = list(columns)
    n = len(next(iter(columns.values()))) if columns else 0
    text = io.StringIO(newline="")
    w = csv.writer(text)
    w.writerow(names)
    for i in range(n):
        w.writerow([repr(v) if isinstance(v, float) else str(v) for v in (columns[c][i] for c in names)])
    write_text(path, text.getvalue())


def realised_mixture(workdir: str | os.PathLike, step: int) -> dict[str, float] | None:
    """The share of tokens each domain actually got up to ``step`` (``tokens/<domain>`` of metrics.jsonl),
    or None when no metrics line is logged at that step; a check on :func:`stage_average`."""
    path = Path(workdir) / "metrics.jsonl"
    if not path.is_file():
        return None
    found = None
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        if rec.get("step") == step and any(k.startswith("tokens/") for k in rec):
            found = {k[len("tokens/"):]: float(v) for k, v in rec.items() if k.startswith("tokens/")}
    if not found:
        return None
    total = float(np.sum(list(found.values())))
    return {d: v / total for d, v in found.items()}
