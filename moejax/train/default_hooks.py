"""The training loop's built-in hooks, in the order they fire after a step, and what runs around them.

1. ``clock``: times the steps (the first one, with any compilation left, apart).
2. ``skipped_steps``: counts steps the train step skipped (a non-finite loss or gradient); see
   :func:`bad_step_limit` for when the run stops.
3. ``progress``: the progress bar; 4. ``stage``: a line when a ``data.schedule`` stage begins.
5. ``log_metrics`` (every ``train.log_every`` steps, and on the events above): loss, throughput,
   routing health, tokens per domain into the step's record.
6. ``evaluate`` (every ``train.eval_every`` steps): held-out loss per domain into the record; a
   loss that is not finite stops the run before it is logged (``BadEvaluation``, exit 3).
7. the user's hooks (they may add to the record);
8. ``trackers``: writes the record (metrics.jsonl, TensorBoard, W&B, MLflow) and the log line.
9. ``stop_if_diverged``: after ``train.max_bad_steps`` skipped steps in a row, or a skipped last step.
10. ``preemption_and_saves``: SIGTERM/SIGINT on any process; a background save that failed stops
    the run (``SaveFailed``, one paragraph).
11. ``checkpoint`` (every ``checkpoint.every_steps`` steps, and when preempted; never during a
    streak of skipped steps); 12. ``stop_if_preempted``: waits for that checkpoint, then stops.

At the last step every hook fires once (:mod:`moejax.train.hooks`).
"""

from __future__ import annotations

import logging
import math
import signal
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from moejax.data.mixture import stage_index
from moejax.errors import RunStopped
from moejax.train.checkpoint import SaveFailed, any_processes
from moejax.train.hooks import Hook, StepInfo
from moejax.train.metrics import eval_losses_from_metrics, routing_summary
from moejax.train.preemption import Preempted
from moejax.train.startup import Training, flops_and_peak
from moejax.train.state import to_global

log = logging.getLogger(__name__)


class Diverged(RunStopped):
    """Too many consecutive steps (or every step of the run, or its last) had a non-finite loss or gradient."""

    exit_code = 3


class BadEvaluation(RunStopped):
    """An evaluation gave a non-finite held-out loss: never logged or saved as a result."""

    exit_code = 3


def evaluate(
    eval_step, state, eval_batches: dict[str, list], sharding_, batch_size: int | None = None
) -> dict[str, float]:
    """Held-out cross-entropy per domain, and ``eval_loss`` = their unweighted mean.

    ``eval_batches`` hold this process's rows of global batches of ``batch_size`` (None: whole
    batches, one process). Routes with the state's balancing selection biases (loss-free), as
    training does.
    """
    out = {}
    for domain, batches in eval_batches.items():
        total = count = 0.0
        for batch in batches:
            ce_sum, n = eval_step(state["params"], to_global(batch, sharding_, None, batch_size), state["balance"])
            total, count = total + float(ce_sum), count + float(n)
        out[f"eval_loss/{domain}"] = total / max(count, 1.0)
    out["eval_loss"] = float(np.mean(list(out.values())))
    return out


def step_record(metrics, step_time: float, tokens_per_step: int, flops_tok: float, peak: float) -> dict:
    """The logged training metrics of one step, with throughput and routing health."""
    tokens_per_sec = tokens_per_step / step_time
    record = {
        key: float(metrics[key]) for key in ("loss", "total_loss", "balance_loss", "lr", "grad_norm")
    }
    record.update(
        step_time_s=step_time,
        tokens_per_sec=tokens_per_sec,
        flops_per_token=flops_tok,
        achieved_flops=flops_tok * tokens_per_sec,
        mfu=flops_tok * tokens_per_sec / peak if peak else "n/a",
    )
    record.update(routing_summary(metrics))  # per-layer loads, MaxVio, Gini, entropy, objective metrics
    return record


def bad_step_limit(cfg) -> int:
    """Consecutive skipped steps that stop the run: ``train.max_bad_steps``, or ``train.steps`` if
    the run is shorter, so a run whose every step is skipped never ends as a success."""
    return max(1, min(cfg.train.max_bad_steps, cfg.train.steps))


def begin(tr: Training) -> None:
    """Before the first step: the evaluation at step 0 (not after a resume) and the data stage."""
    t = tr.cfg.train
    if tr.step < t.steps and tr.is_main:  # from here a SIGTERM stops the run after its next step
        log.info(f"moejax: training (the steps compiled in {tr.compile_s:.1f} s, while the data loaded)")
    if tr.step == 0:
        first_eval = checked_evaluation(tr, tr.state, 0)
        tr.logger.log(0, first_eval)
        tr.summary["initial_eval_loss"] = first_eval["eval_loss"]
    tr.clock.restart()
    tr.stage = stage_index(tr.data.schedule, tr.step)
    if len(tr.data.schedule) > 1 and tr.is_main:
        log.info(_stage_line(tr.data.schedule, tr.stage, tr.step))


def hooks(tr: Training, user_hooks: Sequence[Hook] = ()) -> list[Hook]:
    """The built-in hooks of ``tr`` around ``user_hooks``, in firing order (module docstring)."""
    return [*_bookkeeping_hooks(tr), *_measuring_hooks(tr), *user_hooks, *_saving_and_stopping_hooks(tr)]


def _on(*events: str):
    """A hook's ``when``: any of ``events`` happened at this step."""
    return lambda info: bool(info.events.intersection(events))


def _bookkeeping_hooks(tr: Training) -> list[Hook]:
    """1-4: the step clock, the skipped-step streak, the progress bar, the data stage."""
    first_step = tr.start_step + 1
    limit = bad_step_limit(tr.cfg)

    def clock(info: StepInfo) -> None:
        tr.clock.steps += 1
        if info.step == first_step:  # first-run costs (and any compile not done ahead)
            jax.block_until_ready(info.state)
            tr.summary["compile_and_first_step_s"] = tr.clock.elapsed()
            tr.clock.restart()
            if tr.is_main:
                log.info(f"moejax: first step took {tr.summary['compile_and_first_step_s']:.1f} s")

    def skipped_steps(info: StepInfo) -> None:  # a skipped step left the state unchanged
        if bool(info.metrics["skipped"]):
            tr.bad_streak, tr.skipped_steps = tr.bad_streak + 1, tr.skipped_steps + 1
        else:
            tr.bad_streak = 0
        if tr.bad_streak >= limit:
            info.events.add("diverged")

    def progress(info: StepInfo) -> None:
        tr.logger.advance()
        if info.step == first_step and tr.is_main:
            _restart_eta(tr.logger.bar, info.step)  # the rate and ETA from here on are of steps alone

    def stage(info: StepInfo) -> None:
        stage_now = stage_index(tr.data.schedule, info.step - 1)  # the stage of the batch just trained
        if stage_now != tr.stage:
            tr.stage = stage_now
            info.events.add("stage")
            if tr.is_main:
                log.info(_stage_line(tr.data.schedule, tr.stage, info.step - 1))

    return [Hook(clock, name="clock"), Hook(skipped_steps, name="skipped_steps"), Hook(progress, name="progress"),
            Hook(stage, name="stage")]


def _measuring_hooks(tr: Training) -> list[Hook]:
    """5-6: the training metrics into the step's record (every ``train.log_every`` steps, and when the
    run diverges or a stage begins) and the held-out losses (every ``train.eval_every`` steps)."""
    t = tr.cfg.train
    flops_tok, peak = flops_and_peak(tr.cfg)

    def log_metrics(info: StepInfo) -> None:
        # Right after the first step, its time (with compilation) is all there is.
        step_time = tr.clock.step_time() if tr.clock.steps else tr.summary["compile_and_first_step_s"]
        record = step_record(jax.device_get(info.metrics), step_time, t.global_batch_size * t.seq_len, flops_tok,
                             peak)
        record.update({f"tokens/{d}": int(n) for d, n in zip(tr.data.domains, tr.domain_tokens)})
        record.update({f"epochs/{d}": e for d, e in tr.data.train_iter.epochs().items()})
        record["skipped_steps"] = tr.skipped_steps
        if len(tr.data.schedule) > 1:  # which data.schedule stage this step trained on
            record["stage"] = tr.stage
        tr.logger.advance(0, loss=record["loss"])
        info.record.update(record)

    def evaluate_(info: StepInfo) -> None:
        info.record.update(checked_evaluation(tr, info.state, info.step, bool(info.metrics["skipped"])))

    return [Hook(log_metrics, t.log_every, _on("diverged", "stage"), name="log_metrics"),
            Hook(evaluate_, t.eval_every, name="evaluate")]


def _saving_and_stopping_hooks(tr: Training) -> list[Hook]:
    """8-12: the record written, a diverged run stopped, preemption and failed saves seen on every
    process, the checkpoint (every ``checkpoint.every_steps`` steps, and when preempted), and a
    preempted run stopped once its checkpoint is saved."""

    def trackers(info: StepInfo) -> None:
        if info.record:  # evaluation and logging are not training time: restart the clock after them
            tr.logger.log(info.step, info.record)
            tr.summary.update(info.record)
            tr.clock.restart()

    def stop_if_diverged(info: StepInfo) -> None:  # a run never ends on a skipped step either
        if "diverged" in info.events or (info.last and tr.bad_streak):
            raise Diverged(_diverged_message(tr.bad_streak, info.step, tr.checkpointer.latest_step(),
                                             every_step=tr.bad_streak == info.step, last="diverged" not in info.events))

    def preemption_and_saves(info: StepInfo) -> None:
        # A signal or a failed save may reach some hosts only, or at other steps: all stop together.
        failure = tr.checkpointer.failure()
        preempted, failed = any_processes(tr.preemption is not None and tr.preemption.requested,
                                          failure is not None)
        if failed:
            raise failure or SaveFailed("a checkpoint save failed on another process (its message says why).")
        if preempted:
            info.events.add("preempted")

    def checkpoint(info: StepInfo) -> None:
        if tr.bad_streak == 0:  # no checkpoint during a streak of bad steps: the newest is from before it
            tr.save()

    def stop_if_preempted(info: StepInfo) -> None:
        if "preempted" in info.events:
            tr.checkpointer.wait()
            raise Preempted(tr.preemption.signum or signal.SIGTERM, info.step)  # type: ignore[union-attr]

    return [Hook(trackers, name="trackers"), Hook(stop_if_diverged, name="stop_if_diverged"),
            Hook(preemption_and_saves, name="preemption_and_saves"),
            Hook(checkpoint, tr.cfg.checkpoint.every_steps, _on("preempted"), name="checkpoint"),
            Hook(stop_if_preempted, name="stop_if_preempted")]


def checked_evaluation(tr: Training, state, step: int, step_skipped: bool = False) -> dict[str, float]:
    """``evaluate`` at ``step``; a ``BadEvaluation`` naming the step, the domains and the likely
    cause when a held-out loss is not finite (before it is logged or a checkpoint is saved)."""
    t = tr.cfg.train
    out = evaluate(tr.eval_step, state, tr.data.eval_batches, tr.eval_sharding, t.global_batch_size)
    bad = {key: value for key, value in out.items() if key != "eval_loss" and not math.isfinite(value)}
    if not bad:
        return out
    vocab = tr.cfg.model.vocab_size
    outside = [key.split("/", 1)[1] for key in bad
               if any(int(np.max(b["targets"])) >= vocab or int(np.min(b["targets"])) < 0
                      for b in tr.data.eval_batches[key.split("/", 1)[1]])]
    if outside:
        cause = (f"data: the held-out batches of {', '.join(outside)} hold token ids outside the model's "
                 f"vocabulary of {vocab}; check the dataset (moejax.data.verify_dataset(path)) or model.vocab_size")
    elif step_skipped:
        cause = ("divergence: this step's training loss is non-finite too; lower optim.lr or lengthen "
                 "optim.warmup_steps")
    else:
        cause = ("the data or the model: the parameters are finite (a non-finite update is never applied), so "
                 "the forward pass overflows on those held-out batches; check the dataset "
                 "(moejax.data.verify_dataset(path)), then lower optim.lr")
    latest = tr.checkpointer.latest_step()
    raise BadEvaluation(
        f"the evaluation at step {step} gave a non-finite held-out loss "
        f"({', '.join(f'{key} {value}' for key, value in bad.items())}); it was not logged and no checkpoint of "
        f"step {step} was saved. Likely cause: {cause}. "
        + (f"The newest checkpoint is step {latest}." if latest is not None else "No checkpoint was saved."))


def _diverged_message(bad_streak: int, step: int, latest: int | None, every_step: bool = False,
                      last: bool = False) -> str:
    """Why the run stopped, and what a rerun will do with the checkpoints there are."""
    if last and not every_step:
        steps = "the last step" if bad_streak == 1 else f"the last {bad_streak} steps"
        head = (f"{steps} ({step}) had a non-finite loss or gradient; " if bad_streak == 1 else
                f"{steps} (up to step {step}) had a non-finite loss or gradient; ")
        head += "each was skipped, so the run does not end on a result."
    elif every_step:
        head = (f"every step of the run ({bad_streak}, up to step {step}) had a non-finite loss or "
                "gradient; each was skipped, so nothing was learned and the run stops here.")
    else:
        head = (f"{bad_streak} consecutive steps (up to step {step}) had a non-finite loss or gradient; "
                "each was skipped and the run stops here.")
    fix = "lower optim.lr, lengthen optim.warmup_steps or check the data"
    if latest is None:
        return (f"{head} No checkpoint was saved before the trouble, so a rerun starts from scratch: "
                f"{fix}, then rerun.")
    return (f"{head} The newest checkpoint (step {latest}) is from before the trouble: {fix}, then "
            "rerun to resume from it.")


def _stage_line(schedule, stage: int, batch: int) -> str:
    weights = ", ".join(f"{d} {w:.3g}" for d, w in schedule[stage].weights.items())
    return (f"moejax: data.schedule stage {stage + 1} of {len(schedule)} (from batch "
            f"{schedule[stage].start_step}) trains step {batch + 1} on: {weights}")


def _restart_eta(bar, done: int) -> None:
    """Restart the progress bar's clock after compilation, so its rate and ETA are of steps alone."""
    if bar.disable:  # not a terminal: no bar
        return
    bar.reset()
    bar.initial = bar.n = bar.last_print_n = done
    bar.refresh()


def finish(tr: Training) -> dict[str, Any]:
    """The run's summary: where it started and ended, and its first and last evaluation."""
    summary = dict(tr.summary, final_step=tr.step, resumed_from=tr.start_step if tr.resumed else None)
    if tr.is_main:  # the whole run's first and last evaluation, also when this process resumed it
        summary["first_eval"], summary["last_eval"] = eval_losses_from_metrics(tr.workdir)
    return summary
