"""The training loop: validate, build mesh and state, resume, train, evaluate, log, checkpoint."""

from __future__ import annotations

import json
import os
import time
from typing import Any

import jax
import numpy as np

from moejax import config as config_lib
from moejax import sharding
from moejax.data.corpus import DOMAINS
from moejax.data.pipeline import make_eval_batches, make_train_iterator
from moejax.data.tokenizer import ByteTokenizer
from moejax.model.transformer import flops_per_token, param_counts
from moejax.train.checkpoint import Checkpointer
from moejax.train.metrics import MetricsLogger, routing_summary
from moejax.train.state import Run, init_state, setup, to_global
from moejax.train.step import make_eval_step, make_train_step

TOKENIZER = ByteTokenizer()


def check_config(cfg) -> dict[str, int]:
    """Everything that can be checked before compiling; returns the resolved mesh shape."""
    mesh_shape = config_lib.validate(cfg, jax.device_count())
    if cfg.model.vocab_size < TOKENIZER.vocab_size:
        raise config_lib.ConfigError(
            f"config key 'model.vocab_size' has value {cfg.model.vocab_size}; allowed: at least the "
            f"tokenizer's vocabulary ({TOKENIZER.name}: {TOKENIZER.vocab_size})."
        )
    unknown = [d for d in cfg.data.mixture if d not in DOMAINS]
    if unknown:
        raise config_lib.ConfigError(
            f"config key 'data.mixture.{unknown[0]}' names no domain of the built-in corpus; "
            f"allowed domains: {', '.join(DOMAINS)}."
        )
    return mesh_shape


def evaluate(eval_step, params, eval_batches: dict[str, list], sharding_) -> dict[str, float]:
    """Held-out cross-entropy per domain, and ``eval_loss`` = their unweighted mean."""
    out = {}
    for domain, batches in eval_batches.items():
        total = count = 0.0
        for batch in batches:
            ce_sum, n = eval_step(params, to_global(batch, sharding_, None))
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
    if "load_le" in metrics:
        record["expert_load"] = metrics["load_le"]
        record["drop_rate"] = metrics["drop_rate_l"]
        record.update(routing_summary(np.asarray(metrics["load_le"])))
    return record


def train(cfg, workdir: str) -> dict[str, Any]:
    """Trains ``cfg`` into ``workdir``, resuming from its latest checkpoint. Returns a summary."""
    mesh_shape = check_config(cfg)
    os.makedirs(workdir, exist_ok=True)
    t = cfg.train
    mesh = sharding.make_mesh(mesh_shape)
    run: Run = setup(cfg, mesh)
    is_main = jax.process_index() == 0

    mixture = {k: float(v) for k, v in cfg.data.mixture.items()}
    cache_dir = cfg.data.cache_dir or None
    data_iter = make_train_iterator(
        mixture, seq_len=t.seq_len, global_batch_size=t.global_batch_size, seed=t.seed, cache_dir=cache_dir
    )
    eval_batches = make_eval_batches(
        DOMAINS, seq_len=t.seq_len, batch_size=t.global_batch_size,
        batches_per_domain=t.eval_batches, cache_dir=cache_dir,
    )

    checkpointer = Checkpointer(os.path.join(workdir, "checkpoints"), max_to_keep=cfg.checkpoint.max_to_keep)
    meta = {"config": config_lib.to_dict(cfg), "tokenizer": TOKENIZER.name}
    latest = checkpointer.latest_step()
    domain_tokens = np.zeros(len(DOMAINS), np.int64)  # tokens trained on, per domain, cumulative
    if latest is not None:
        state, data_state, _ = checkpointer.restore(latest, run.abstract_state)
        data_iter.set_state(data_state["iterator"])
        domain_tokens[:] = data_state["tokens_per_domain"]
    else:
        state = init_state(cfg, run)
    step = int(state["step"])
    if is_main:
        with open(os.path.join(workdir, "config.json"), "w") as f:
            json.dump(meta["config"], f, indent=2)

    counts = param_counts(cfg.model)
    flops_tok = flops_per_token(cfg.model, t.seq_len)
    peak = t.peak_flops_per_device * jax.device_count()
    tokens_per_step = t.global_batch_size * t.seq_len
    logger = MetricsLogger(workdir, total_steps=t.steps, start_step=step, enabled=is_main)
    if is_main:
        logger.bar.write(
            f"moejax: {counts['total'] / 1e6:.2f}M params ({counts['active'] / 1e6:.2f}M active), "
            f"mesh {mesh_shape}, {jax.device_count()} {jax.default_backend()} device(s), "
            f"{'resuming from step ' + str(step) if latest is not None else 'fresh start'}"
        )

    train_step = make_train_step(cfg, run)
    eval_step = make_eval_step(cfg, run)
    train_sharding, eval_sharding = run.batch_sharding(accum=True), run.batch_sharding(accum=False)
    summary: dict[str, Any] = {"start_step": step}
    with jax.set_mesh(mesh):
        if step == 0:
            first_eval = evaluate(eval_step, state["params"], eval_batches, eval_sharding)
            logger.log(0, first_eval)
            summary["initial_eval_loss"] = first_eval["eval_loss"]
        interval_start, interval_steps = time.perf_counter(), 0
        while step < t.steps:
            batch = next(data_iter)
            domain_tokens += np.bincount(batch["domain"], minlength=len(DOMAINS)) * t.seq_len
            state, metrics = train_step(state, to_global(batch, train_sharding, t.grad_accum_steps))
            step += 1
            interval_steps += 1
            if step == summary["start_step"] + 1:  # the first step includes compilation
                jax.block_until_ready(state)
                summary["compile_and_first_step_s"] = time.perf_counter() - interval_start
                interval_start, interval_steps = time.perf_counter(), 0
            logger.advance()
            record = {}
            if step % t.log_every == 0 or step == t.steps:
                step_time = (  # right after the first step, its time (with compilation) is all there is
                    (time.perf_counter() - interval_start) / interval_steps if interval_steps
                    else summary["compile_and_first_step_s"]
                )
                record = step_record(jax.device_get(metrics), step_time, tokens_per_step, flops_tok, peak)
                record.update({f"tokens/{d}": int(n) for d, n in zip(DOMAINS, domain_tokens)})
                logger.advance(0, loss=record["loss"])
            if step % t.eval_every == 0 or step == t.steps:
                record.update(evaluate(eval_step, state["params"], eval_batches, eval_sharding))
            if record:  # evaluation and logging are not training time: restart the clock after them
                logger.log(step, record)
                summary.update(record)
                interval_start, interval_steps = time.perf_counter(), 0
            if step % cfg.checkpoint.every_steps == 0 or step == t.steps:
                data_state = {"iterator": data_iter.get_state(), "tokens_per_domain": domain_tokens.tolist()}
                checkpointer.save(step, state, data_state, meta)
    checkpointer.close()
    logger.close()
    summary["final_step"] = step
    return summary
