"""The training loop: validate, build mesh and state, resume, train, evaluate, log, checkpoint.

Multi-host: every process runs this same loop in lockstep. A process loads only the batch rows
its devices hold (``process_rows``), builds global arrays from them (``to_global``), and takes
every branch the others take (evaluation, checkpoint, stop); process 0 alone writes
``config.json``, ``metrics.jsonl`` and TensorBoard events. See docs/multihost.md.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import signal
import time
import warnings
from typing import Any

import jax
import numpy as np
from ml_collections import ConfigDict

from moejax import allocator, code_version, paths, sharding
from moejax import config as config_lib
from moejax.checks import check_config
from moejax.data.dataset import DatasetInfo
from moejax.data.from_config import check_data_config, make_data
from moejax.data.mixture import MixtureWarning, resolved_data_values, stage_index
from moejax.data.tokenizer import check_tokenizer_matches
from moejax.errors import ConfigError
from moejax.model.transformer import flops_per_token, param_counts
from moejax.train import trackers
from moejax.train.checkpoint import (Checkpointer, Restored, any_process, check_same_on_every_process, init_from_meta,
                                     load_params)
from moejax.train.preemption import Preempted, PreemptionGuard
from moejax.train.metrics import MetricsLogger, routing_summary, truncate_metrics
from moejax.train.precompile import Precompile
from moejax.train.state import (
    Run, abstract_batch, check_l3_allocation_matches, init_state, make_init, process_rows, setup, to_global,
)
from moejax.train.step import make_eval_step, make_train_step

log = logging.getLogger(__name__)



def resolved_config(cfg) -> ConfigDict:
    """A copy of ``cfg`` whose data group holds the weights the run trains on (a mixture file's,
    normalised; a schedule's stages as JSON text), so WORKDIR/config.json says what the run used."""
    with warnings.catch_warnings():  # check_config has shown them
        warnings.simplefilter("ignore", MixtureWarning)
        _, schedule = check_data_config(cfg)
    cfg = copy.deepcopy(cfg)
    for key, value in resolved_data_values(cfg.data, schedule).items():
        cfg.data[key] = ConfigDict(value) if isinstance(value, dict) else value
    return cfg


def _remove_if_empty(path: str) -> None:
    try:
        os.rmdir(path)
    except OSError:  # not empty, already gone, or another process's
        pass


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


class Diverged(RuntimeError):
    """Too many consecutive steps with a non-finite loss or gradient."""


def restore_checked(run: Run, checkpointer: Checkpointer, tokenizer_name: str, data_path: str) -> Restored | None:
    """The latest readable checkpoint, checked against this run's tokenizer and L3 allocation, or None."""
    restored = checkpointer.restore_latest(run.abstract_state)
    if restored is not None:
        check_tokenizer_matches(
            tokenizer_name, restored.meta.get("tokenizer"), data_source=f"data.path={data_path!r}",
            checkpoint=f"{checkpointer.directory}/{restored.step}",
        )
        check_l3_allocation_matches(run, restored.meta, f"{checkpointer.directory}/{restored.step}")
    return restored


def check_init_from_tokenizer(cfg, tokenizer_name: str) -> None:
    """A warm start's parameters only make sense with the tokenizer they were trained (or imported)
    with; a ``DataError`` naming both, and the ``prepare`` command that fits, otherwise. A Hugging
    Face import without tokenizer files carries no tokenizer to check against."""
    init_step = None if cfg.checkpoint.init_step < 0 else cfg.checkpoint.init_step
    step_dir, meta = init_from_meta(cfg.checkpoint.init_from, init_step)
    recorded = str(meta.get("tokenizer", ""))
    if not recorded or recorded.startswith("huggingface:"):
        return
    tokenizer_dir = os.path.join(cfg.checkpoint.init_from, "tokenizer")  # written by moejax hf import
    source = tokenizer_dir if os.path.isdir(tokenizer_dir) else "the data.path of its config.json"
    check_tokenizer_matches(
        tokenizer_name, recorded, data_source=f"data.path={cfg.data.path!r}",
        checkpoint=f"checkpoint.init_from {step_dir}",
        fix=f"Prepare the data with that tokenizer (python -m moejax.data.prepare --tokenizer {source} "
            "--source DOMAIN=PATH --out DIR) and set data.path=DIR, or drop checkpoint.init_from.",
    )


def fresh_state(cfg, run: Run, init=None) -> dict[str, Any]:
    """A fresh start (with ``init``, the run's jitted state initialiser, if given), or a warm one
    from ``checkpoint.init_from``'s parameters."""
    state = init_state(cfg, run, init)
    if cfg.checkpoint.init_from:
        init_step = None if cfg.checkpoint.init_step < 0 else cfg.checkpoint.init_step
        state["params"], step = load_params(cfg.checkpoint.init_from, run.abstract_state["params"], init_step)
        if jax.process_index() == 0:
            log.info(f"moejax: parameters from {cfg.checkpoint.init_from} (step {step}); fresh optimizer and data")
    return state


def train(cfg, workdir: str, *, changed=()) -> dict[str, Any]:
    """Trains ``cfg`` into ``workdir``, resuming from its latest checkpoint. Returns a summary.

    ``changed``: the config keys set on the command line (for the config errors' wording). A run
    refused for its config or data leaves no empty directory behind."""
    mesh_shape, data_info = check_config(cfg, changed, workdir)
    trackers.check_installed(cfg.train.loggers)  # a chosen W&B/MLflow that is missing: before compiling
    cfg = resolved_config(cfg)
    existed = os.path.isdir(workdir)
    paths.make_dir(workdir, "--workdir")
    try:
        return _train(cfg, workdir, mesh_shape, data_info)
    except ConfigError:
        _remove_if_empty(os.path.join(workdir, "checkpoints"))
        if not existed:
            _remove_if_empty(workdir)
        raise


def _train(cfg, workdir: str, mesh_shape: dict[str, int], data_info: DatasetInfo) -> dict[str, Any]:
    t = cfg.train
    mesh = sharding.make_mesh(mesh_shape)
    run: Run = setup(cfg, mesh)
    is_main = jax.process_index() == 0
    train_sharding, eval_sharding = run.batch_sharding(accum=True), run.batch_sharding(accum=False)
    c = cfg.checkpoint
    checkpointer = Checkpointer(
        os.path.join(workdir, "checkpoints"), max_to_keep=c.max_to_keep, keep_period=c.keep_period
    )
    restored = restore_checked(run, checkpointer, data_info.tokenizer.name, cfg.data.path)
    if restored is None and cfg.checkpoint.init_from:
        check_init_from_tokenizer(cfg, data_info.tokenizer.name)

    # Compile while the data loads (moejax/train/precompile.py): the initialiser (unless resuming),
    # the eval step (for the evaluation at step 0 or the resumed step) and the train step.
    init, train_step, eval_step = make_init(cfg, run), make_train_step(cfg, run), make_eval_step(cfg, run)
    jobs = {} if restored is not None else {"init": lambda: init.lower(t.seed)}
    jobs["eval step"] = lambda: eval_step.lower(
        run.abstract_state["params"], abstract_batch(eval_sharding, t.global_batch_size, None, t.seq_len),
        run.abstract_state["balance"],
    )
    jobs["train step"] = lambda: train_step.lower(
        run.abstract_state, abstract_batch(train_sharding, t.global_batch_size, t.grad_accum_steps, t.seq_len)
    )
    with Precompile(mesh, jobs) as precompile:
        train_data = make_data(  # train iterator, eval batches (this process's rows), domains, tokenizer
            cfg, train_rows=process_rows(train_sharding, t.global_batch_size, t.grad_accum_steps),
            eval_rows=process_rows(eval_sharding, t.global_batch_size, None),
        )
    compile_s = precompile.seconds
    data_iter, eval_batches = train_data.train_iter, train_data.eval_batches
    meta = {
        "config": config_lib.to_dict(cfg), "tokenizer": train_data.tokenizer.name, "code_version": code_version(),
        "l3_allocation": run.l3_meta(),  # {"sha256", "method"} of the L3 row allocation, or None
    }
    state, data_state = (restored.state, restored.data) if restored is not None else (fresh_state(cfg, run, init), None)
    domain_tokens = np.zeros(len(train_data.domains), np.int64)  # tokens trained on, per domain, cumulative
    if data_state is not None:
        data_iter.set_state(data_state["iterator"])
        domain_tokens[:] = data_state["tokens_per_domain"]
    check_same_on_every_process({"config": meta["config"], "code version": meta["code_version"],
                                 "data-iterator state": data_iter.get_state()})
    step = int(state["step"])
    resumed = data_state is not None
    if is_main:
        paths.write_file(os.path.join(workdir, "config.json"), lambda f: json.dump(meta["config"], f, indent=2))

    counts = param_counts(cfg.model)
    flops_tok = flops_per_token(cfg.model, t.seq_len)
    peak = t.peak_flops_per_device * jax.device_count()
    tokens_per_step = t.global_batch_size * t.seq_len
    if is_main:
        truncate_metrics(workdir, step)  # records past the checkpoint are redone after a resume
    # The writers of train.loggers; a W&B/MLflow run starts here, or continues on a resume.
    writers = (trackers.open_writers(trackers.chosen(t.loggers), trackers.settings_from_config(cfg, workdir))
               if is_main else [])
    logger = MetricsLogger(workdir, total_steps=t.steps, start_step=step, enabled=is_main, writers=writers)
    if is_main:
        log.info(
            f"moejax: {counts['total'] / 1e6:.2f}M params ({counts['active'] / 1e6:.2f}M active), "
            f"mesh {mesh_shape}, {jax.device_count()} {jax.default_backend()} device(s), "
            f"{'resuming from step ' + str(step) if resumed else 'fresh start'}"
            + ("" if jax.default_backend() != "cpu" or allocator.active() == "mimalloc" else
               "; system allocator: CPU steps 1.2-1.3x slower than with ./launch.sh's mimalloc "
               "(moejax/allocator.py; measured in experiments/benchmarks/LOG.md)")
        )

    summary: dict[str, Any] = {"start_step": step}
    bad_streak = 0
    skipped_steps = data_state.get("skipped_steps", 0) if data_state else 0
    stopped_by: BaseException | None = None  # what ended the run early, for the trackers' run status

    def save() -> None:
        data = {"iterator": data_iter.get_state(), "tokens_per_domain": domain_tokens.tolist(),
                "skipped_steps": skipped_steps}
        checkpointer.save(step, state, data, meta)

    try:
        with jax.set_mesh(mesh), PreemptionGuard(c.grace_seconds) as preemption:
            if step < t.steps and is_main:  # from here a SIGTERM stops the run after its next step
                log.info(f"moejax: training (the steps compiled in {compile_s:.1f} s, while the data loaded)")
            if step == 0:
                first_eval = evaluate(eval_step, state, eval_batches, eval_sharding, t.global_batch_size)
                logger.log(0, first_eval)
                summary["initial_eval_loss"] = first_eval["eval_loss"]
            interval_start, interval_steps = time.perf_counter(), 0
            stage = stage_index(train_data.schedule, step)
            if len(train_data.schedule) > 1 and is_main:
                log.info(_stage_line(train_data.schedule, stage, step))
            while step < t.steps:
                stage_now = stage_index(train_data.schedule, step)  # the stage of the batch drawn next
                stage_switched, stage = stage_now != stage, stage_now
                batch = next(data_iter)
                domain_tokens += np.bincount(data_iter.global_domains, minlength=len(train_data.domains)) * t.seq_len
                state, metrics = train_step(
                    state, to_global(batch, train_sharding, t.grad_accum_steps, t.global_batch_size)
                )
                step += 1
                interval_steps += 1
                if step == summary["start_step"] + 1:  # the first step: first-run costs (and any compile not done ahead)
                    jax.block_until_ready(state)
                    summary["compile_and_first_step_s"] = time.perf_counter() - interval_start
                    interval_start, interval_steps = time.perf_counter(), 0
                    if is_main:
                        log.info(f"moejax: first step took {summary['compile_and_first_step_s']:.1f} s")
                # A skipped (non-finite) step left the state unchanged; too many in a row end the run.
                if bool(metrics["skipped"]):
                    bad_streak, skipped_steps = bad_streak + 1, skipped_steps + 1
                else:
                    bad_streak = 0
                diverged = bad_streak >= t.max_bad_steps
                logger.advance()
                if step == summary["start_step"] + 1 and is_main:
                    _restart_eta(logger.bar, step)  # the rate and ETA from here on are of steps alone
                record = {}
                if stage_switched and is_main:
                    log.info(_stage_line(train_data.schedule, stage, step - 1))
                if step % t.log_every == 0 or step == t.steps or diverged or stage_switched:
                    step_time = (  # right after the first step, its time (with compilation) is all there is
                        (time.perf_counter() - interval_start) / interval_steps if interval_steps
                        else summary["compile_and_first_step_s"]
                    )
                    record = step_record(jax.device_get(metrics), step_time, tokens_per_step, flops_tok, peak)
                    record.update({f"tokens/{d}": int(n) for d, n in zip(train_data.domains, domain_tokens)})
                    record.update({f"epochs/{d}": e for d, e in data_iter.epochs().items()})
                    record["skipped_steps"] = skipped_steps
                    if len(train_data.schedule) > 1:  # which data.schedule stage this step trained on
                        record["stage"] = stage
                    logger.advance(0, loss=record["loss"])
                if step % t.eval_every == 0 or step == t.steps:
                    record.update(evaluate(eval_step, state, eval_batches, eval_sharding, t.global_batch_size))
                if record:  # evaluation and logging are not training time: restart the clock after them
                    logger.log(step, record)
                    summary.update(record)
                    interval_start, interval_steps = time.perf_counter(), 0
                if diverged:
                    raise Diverged(_diverged_message(bad_streak, step, checkpointer.latest_step()))
                # A signal may reach some hosts only, or at other steps: all stop at the same step.
                preempted = any_process(preemption.requested)
                # No checkpoint during a streak of bad steps: the newest stays one from before it.
                if bad_streak == 0 and (step % c.every_steps == 0 or step == t.steps or preempted):
                    save()
                if preempted:
                    checkpointer.wait()
                    raise Preempted(preemption.signum or signal.SIGTERM, step)
    except BaseException as error:
        stopped_by = error
        raise
    finally:
        checkpointer.close()
        logger.close(stopped_by)
    summary["final_step"] = step
    summary["resumed_from"] = summary["start_step"] if resumed else None
    if is_main:  # the whole run's first and last evaluation, also when this process resumed it
        summary["first_eval"], summary["last_eval"] = eval_losses_from_metrics(workdir)
    return summary


def eval_losses_from_metrics(workdir: str) -> tuple[tuple[int, float] | None, tuple[int, float] | None]:
    """(step, eval_loss) of the first and of the last evaluation in ``workdir/metrics.jsonl``."""
    first = last = None
    path = os.path.join(workdir, "metrics.jsonl")
    if not os.path.isfile(path):
        return None, None
    with open(path) as f:
        for line in f:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record.get("eval_loss"), (int, float)):
                last = (int(record["step"]), float(record["eval_loss"]))
                first = first or last
    return first, last


def _diverged_message(bad_streak: int, step: int, latest: int | None) -> str:
    """Why the run stopped, and what a rerun will do with the checkpoints there are."""
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
