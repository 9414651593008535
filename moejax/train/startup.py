"""A run's set-up: mesh and model, the checkpoint to resume, compilation while the data loads, the
state, and the metric writers; :func:`start` returns them as one :class:`Training` that the loop
and its hooks share.

Multi-host: every process runs this in lockstep (docs/multihost.md). A process loads only the batch
rows its devices hold (``process_rows``) and builds global arrays from them (``to_global``);
process 0 alone writes ``config.json``, ``metrics.jsonl`` and the trackers.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import os
import time
import warnings
from typing import Any

import jax
import numpy as np
from ml_collections import ConfigDict

from moejax import allocator, code_version, paths, sharding
from moejax import config as config_lib
from moejax.data.dataset import DatasetInfo
from moejax.data.from_config import TrainData, check_data_config, make_data
from moejax.data.mixture import MixtureWarning, resolved_data_values
from moejax.data.tokenizer import check_tokenizer_matches
from moejax.model.transformer import flops_per_token, param_counts
from moejax.train import trackers
from moejax.train.checkpoint import (Checkpointer, Restored, SaveFailed, check_same_on_every_process,
                                     init_from_meta, load_params)
from moejax.train.metrics import MetricsLogger, truncate_metrics
from moejax.train.precompile import Precompile
from moejax.train.preemption import PreemptionGuard
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


@dataclasses.dataclass
class Clock:
    """Training time since the last restart: evaluation, logging and checkpoints are left out."""

    start: float = dataclasses.field(default_factory=time.perf_counter)
    steps: int = 0

    def restart(self) -> None:
        self.start, self.steps = time.perf_counter(), 0

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def step_time(self) -> float:
        return (time.perf_counter() - self.start) / self.steps


@dataclasses.dataclass(eq=False)
class Training:
    """Everything a run's loop and hooks share; the mutable fields change as it trains."""

    cfg: Any
    workdir: str
    mesh: Any
    run: Run
    is_main: bool
    checkpointer: Checkpointer
    train_step: Any
    eval_step: Any
    train_sharding: Any
    eval_sharding: Any
    data: TrainData  # train iterator, eval batches (this process's rows), domains, schedule, tokenizer
    meta: dict[str, Any]  # the checkpoints' "meta" item
    logger: MetricsLogger
    compile_s: float
    state: dict[str, Any]
    step: int
    resumed: bool
    domain_tokens: np.ndarray  # tokens trained on, per domain, cumulative
    skipped_steps: int  # non-finite steps skipped over the whole run
    summary: dict[str, Any]
    bad_streak: int = 0  # consecutive skipped steps up to now
    stage: int = 0  # the data.schedule stage of the batch trained last
    clock: Clock = dataclasses.field(default_factory=Clock)
    preemption: PreemptionGuard | None = None  # set while the loop runs

    @property
    def start_step(self) -> int:
        return self.summary["start_step"]

    def next_batch(self) -> dict[str, jax.Array]:
        """The next global training batch; counts its tokens per domain."""
        t = self.cfg.train
        batch = next(self.data.train_iter)
        self.domain_tokens += np.bincount(self.data.train_iter.global_domains,
                                          minlength=len(self.data.domains)) * t.seq_len
        return to_global(batch, self.train_sharding, t.grad_accum_steps, t.global_batch_size)

    def save(self) -> None:
        """Starts saving a checkpoint of the current step (state, data position, metadata)."""
        data = {"iterator": self.data.train_iter.get_state(), "tokens_per_domain": self.domain_tokens.tolist(),
                "skipped_steps": self.skipped_steps}
        self.checkpointer.save(self.step, self.state, data, self.meta)

    def close(self, error: BaseException | None) -> None:
        """Waits for the last save and closes the writers; ``error``: what stopped the run, if anything."""
        try:
            self.checkpointer.close()
        except SaveFailed:
            if error is None:  # the final save failed; else what stopped the run says more
                raise
        finally:
            self.logger.close(error)


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


def start(cfg, workdir: str, mesh_shape: dict[str, int], data_info: DatasetInfo) -> Training:
    """Builds the run: reads the checkpoint to resume (before compiling), compiles the steps while the
    data loads (moejax/train/precompile.py), and restores or initialises the state."""
    t, c = cfg.train, cfg.checkpoint
    mesh = sharding.make_mesh(mesh_shape)
    run: Run = setup(cfg, mesh)
    is_main = jax.process_index() == 0
    train_sharding, eval_sharding = run.batch_sharding(accum=True), run.batch_sharding(accum=False)
    checkpointer = Checkpointer(os.path.join(workdir, "checkpoints"), max_to_keep=c.max_to_keep,
                                keep_period=c.keep_period, owner=True)
    restored = restore_checked(run, checkpointer, data_info.tokenizer.name, cfg.data.path)
    if restored is None and c.init_from:
        check_init_from_tokenizer(cfg, data_info.tokenizer.name)

    # The initialiser (unless resuming), the eval step (for the evaluation at step 0 or the resumed
    # step) and the train step compile in the background while the data loads.
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
        data = make_data(cfg, train_rows=process_rows(train_sharding, t.global_batch_size, t.grad_accum_steps),
                         eval_rows=process_rows(eval_sharding, t.global_batch_size, None))
    meta = {
        "config": config_lib.to_dict(cfg), "tokenizer": data.tokenizer.name, "code_version": code_version(),
        "l3_allocation": run.l3_meta(),  # {"sha256", "method"} of the L3 row allocation, or None
    }
    state, data_state = (restored.state, restored.data) if restored is not None else (fresh_state(cfg, run, init), None)
    domain_tokens = np.zeros(len(data.domains), np.int64)
    if data_state is not None:
        data.train_iter.set_state(data_state["iterator"])
        domain_tokens[:] = data_state["tokens_per_domain"]
    check_same_on_every_process({"config": meta["config"], "code version": meta["code_version"],
                                 "data-iterator state": data.train_iter.get_state()})
    step = int(state["step"])
    if is_main:
        paths.write_file(os.path.join(workdir, "config.json"), lambda f: json.dump(meta["config"], f, indent=2))
        # Records of the steps this run (re)does go: after a resume those past its checkpoint, on a
        # fresh start every one (an earlier attempt's step-0 evaluation included).
        truncate_metrics(workdir, step if restored is not None else -1)
    # The writers of train.loggers; a W&B/MLflow run starts here, or continues on a resume.
    writers = (trackers.open_writers(trackers.chosen(t.loggers), trackers.settings_from_config(cfg, workdir))
               if is_main else [])
    logger = MetricsLogger(workdir, total_steps=t.steps, start_step=step, enabled=is_main, writers=writers)
    if is_main:
        _log_start(cfg, mesh_shape, step, data_state is not None)
    return Training(
        cfg=cfg, workdir=workdir, mesh=mesh, run=run, is_main=is_main, checkpointer=checkpointer,
        train_step=train_step, eval_step=eval_step, train_sharding=train_sharding, eval_sharding=eval_sharding,
        data=data, meta=meta, logger=logger, compile_s=precompile.seconds, state=state, step=step,
        resumed=data_state is not None, domain_tokens=domain_tokens,
        skipped_steps=data_state.get("skipped_steps", 0) if data_state else 0, summary={"start_step": step},
    )


def _log_start(cfg, mesh_shape: dict[str, int], step: int, resumed: bool) -> None:
    counts = param_counts(cfg.model)
    log.info(
        f"moejax: {counts['total'] / 1e6:.2f}M params ({counts['active'] / 1e6:.2f}M active), "
        f"mesh {mesh_shape}, {jax.device_count()} {jax.default_backend()} device(s), "
        f"{'resuming from step ' + str(step) if resumed else 'fresh start'}"
        + ("" if jax.default_backend() != "cpu" or allocator.active() == "mimalloc" else
           "; system allocator: CPU steps are slower than with ./launch.sh's mimalloc "
           "(moejax/allocator.py; measured in experiments/benchmarks/LOG.md)")
    )


def flops_and_peak(cfg) -> tuple[float, float]:
    """(model FLOPs per token, the devices' peak FLOP/s or 0) for the MFU of a logged step."""
    return flops_per_token(cfg.model, cfg.train.seq_len), cfg.train.peak_flops_per_device * jax.device_count()
