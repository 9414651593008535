"""One checkpoint's full evaluation: held-out losses, benchmarks, routing, throughput, as one dict.

An :class:`Evaluator` is built once per run (it reads the tasks and held-out batches and builds the
jitted functions) and then evaluates any number of that run's checkpoints: parameters are
arguments of the compiled functions, so later checkpoints cost no compilation.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np

from moejax.config import BENCHMARK_VERSIONS
from moejax.errors import ConfigError
from moejax.data.pipeline import make_eval_batches
from moejax.data.targets import target_eval_batches
from moejax.eval import harness, losses, routing
from moejax.eval.benchmarks import task_names
from moejax.eval.restore import Checkpoint, EvalRun
from moejax.eval.tasks import EXACT_MATCH, Task, resolve_tasks
from moejax.model.balancing import Balancer
from moejax.model.transformer import is_moe_layer


@dataclasses.dataclass(frozen=True)
class Settings:
    """What an evaluation computes; recorded in the JSON (``settings``), so results with other
    settings are never mixed up."""

    tasks: tuple[str, ...]  # built-in task names and/or JSONL paths
    benchmarks: str  # the built-in benchmarks version the default tasks came from (data.benchmarks)
    max_items: int  # items per task, the first ones of each file; 0: all
    loss_batches: int  # held-out batches per domain (training batch shape)
    batch_size: int  # rows per multiple-choice batch and prompts per generation batch
    max_new_tokens: int  # exact-match generation budget
    max_len: int  # longest row / generation context: the training sequence length


DEFAULT_MAX_ITEMS = 64  # per task: the whole tiny-model evaluation then takes well under a minute on 2 CPU cores
DEFAULT_BATCH_SIZE = 32
DEFAULT_MAX_NEW_TOKENS = 16


def make_settings(
    erun: EvalRun, *, tasks: list[str] | None = None, max_items: int = DEFAULT_MAX_ITEMS,
    loss_batches: int | None = None, batch_size: int = DEFAULT_BATCH_SIZE,
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, benchmarks: str | None = None,
) -> Settings:
    """Settings with the run's defaults: the built-in tasks of ``benchmarks`` (default: the run's
    ``data.benchmarks``) for a run on the built-in corpus (none otherwise), the run's
    ``train.eval_batches``, a batch size rounded up to a multiple of the devices a batch is split
    over, and the training sequence length as the context."""
    cfg = erun.cfg
    if max_new_tokens >= cfg.train.seq_len:
        raise ConfigError(f"max_new_tokens={max_new_tokens} must be below the context of {cfg.train.seq_len} tokens")
    version = benchmarks or cfg.data.get("benchmarks", BENCHMARK_VERSIONS[-1])
    if version not in BENCHMARK_VERSIONS:
        raise ConfigError(f"benchmarks version {version!r} is unknown; allowed: {', '.join(BENCHMARK_VERSIONS)}")
    shards = erun.batch_shards
    return Settings(
        tasks=tuple(tasks if tasks is not None else (task_names(version) if not cfg.data.path else ())),
        benchmarks=version,
        max_items=max_items, loss_batches=loss_batches or cfg.train.eval_batches,
        batch_size=-(-batch_size // shards) * shards, max_new_tokens=max_new_tokens, max_len=cfg.train.seq_len,
    )


def _phase(tokens: int, seconds: float) -> dict[str, float]:
    return {"tokens": int(tokens), "seconds": seconds, "tokens_per_sec": tokens / max(seconds, 1e-9)}


class Evaluator:
    """Evaluates checkpoints of ``erun`` under ``settings``; its jitted functions are built once and
    compile on first use.

    ``balancer`` replaces the run's balancing objectives (e.g. with an expert mask, see
    :mod:`masking`); the checkpoint's ``balance`` must then hold its state.
    """

    def __init__(self, erun: EvalRun, settings: Settings, *, balancer: Balancer | None = None, progress: bool = True):
        self.erun, self.settings, self.progress = erun, settings, progress
        cfg = erun.cfg
        tasks = resolve_tasks(list(settings.tasks), cfg.data.cache_dir or None)
        self.tasks = [_first(task, settings.max_items) for task in tasks]
        self.eval_batches = make_eval_batches(
            erun.dataset.domains, seq_len=cfg.train.seq_len, batch_size=cfg.train.global_batch_size,
            batches_per_domain=settings.loss_batches, dataset=erun.dataset,
            windows=cfg.train.get("eval_windows", "first"),
        )
        # The built-in corpus's held-out target sets (moejax.data.targets): scored apart from the
        # domains (losses.targets), so loss_mean stays the training log's eval_loss.
        self.target_batches = {} if cfg.data.path else target_eval_batches(
            seq_len=cfg.train.seq_len, batch_size=cfg.train.global_batch_size, batches_per_set=settings.loss_batches,
            first_domain_id=len(erun.dataset.domains), cache_dir=cfg.data.cache_dir or None,
            windows=cfg.train.get("eval_windows", "first"),
        )
        self.scorer = erun.scorer(balancer)
        self.generator = (erun.generator(settings.max_len, balancer)
                          if any(t.kind == EXACT_MATCH for t in self.tasks) else None)
        self.moe_layers = [layer for layer in range(cfg.model.num_layers) if is_moe_layer(cfg.model, layer)]

    def evaluate(self, ckpt: Checkpoint) -> dict[str, Any]:
        """The result dict of one checkpoint (the keys of ``step_N.json``, see ``docs/eval.md``)."""
        s, tokenizer = self.settings, self.erun.tokenizer
        start = time.perf_counter()
        loss_summary, routing_sums, loss_tokens = losses.heldout_losses(
            self.scorer, ckpt, self.eval_batches, tokenizer, progress=self.progress
        )
        if self.target_batches:
            targets, _, target_tokens = losses.heldout_losses(
                self.scorer, ckpt, self.target_batches, tokenizer, progress=self.progress
            )
            loss_summary["targets"] = targets["domains"]
            loss_tokens += target_tokens
        loss_summary["eval_windows"] = self.erun.cfg.train.get("eval_windows", "first")
        loss_seconds = time.perf_counter() - start
        benchmarks, phases = {}, {"multiple_choice": [0, 0.0], "exact_match": [0, 0.0]}
        for task in self.tasks:
            task_start = time.perf_counter()
            if task.kind == EXACT_MATCH:
                result, tokens = harness.score_exact_match(
                    self.generator, ckpt, task, tokenizer, max_new_tokens=s.max_new_tokens,
                    batch_size=s.batch_size, progress=self.progress,
                )
                result["gold_logprob"], forced = harness.answer_logprob(
                    self.scorer, ckpt, task, tokenizer, max_len=s.max_len, batch_size=s.batch_size,
                    progress=self.progress,
                )
                tokens += forced
            else:
                result, tokens = harness.score_multiple_choice(
                    self.scorer, ckpt, task, tokenizer, max_len=s.max_len, batch_size=s.batch_size,
                    progress=self.progress,
                )
            benchmarks[task.name] = {**result, "source": task.source}
            phases[task.kind][0] += tokens
            phases[task.kind][1] += time.perf_counter() - task_start
        total_seconds = time.perf_counter() - start
        throughput = {
            "losses": _phase(loss_tokens, loss_seconds),
            **{kind: _phase(*phases[kind]) for kind in phases if phases[kind][0]},
            "total": _phase(loss_tokens + sum(p[0] for p in phases.values()), total_seconds),
        }
        return {
            "step": ckpt.step,
            "workdir": self.erun.workdir,
            "tokenizer": tokenizer.name,
            "settings": dataclasses.asdict(self.settings),
            "losses": loss_summary,
            "benchmarks": benchmarks,
            "routing": routing.summarize(routing_sums, self.moe_layers),
            "throughput": throughput,
            "eval_seconds": total_seconds,
        }


def benchmark_score(result: dict[str, Any]) -> float:
    """A task's headline number: accuracy (multiple choice) or exact match; NaN if no item was scored."""
    score = result["accuracy"] if result["kind"] == "multiple_choice" else result["exact_match"]
    return float("nan") if score is None else score


def _first(task: Task, max_items: int) -> Task:
    return dataclasses.replace(task, items=task.items[:max_items]) if max_items else task


def mean_score(benchmarks: dict[str, Any]) -> float:
    """Unweighted mean of the tasks' headline numbers (tasks with no scored item left out)."""
    scores = [benchmark_score(b) for b in benchmarks.values()]
    return float(np.nanmean(scores)) if not np.isnan(scores).all() else float("nan")
