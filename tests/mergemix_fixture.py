"""A tiny base run and two domain experts trained from it: the shared fixture of the MergeMix tests.

Built once per test run (``run_once``): ``<dir>/base`` (a 4-expert MoE, 6 steps on the uniform
mixture, checkpoints 3 and 6) and ``<dir>/experts/<domain>`` for ``code`` and ``math`` (each
initialised from the base's step 6 and trained 4 more steps on 100% of its domain, checkpoints 2
and 4). Tests only read it; copy it to change it.
"""

from __future__ import annotations

import os

import pytest

EXPERT_DOMAINS = ("code", "math")
BASE_STEP = 6
EXPERT_STEPS = (2, 4)


def tiny_config():
    from moejax.config import default_config

    cfg = default_config()
    t, m = cfg.train, cfg.model
    t.steps, t.global_batch_size, t.seq_len, t.log_every, t.eval_every, t.eval_batches = BASE_STEP, 8, 64, 1, 100, 1
    cfg.checkpoint.every_steps, cfg.optim.warmup_steps = 3, 1
    m.d_model, m.num_layers, m.mlp_dim, m.num_heads, m.num_kv_heads, m.head_dim = 32, 2, 64, 2, 1, 16
    m.moe.num_experts, m.moe.expert_dim, m.moe.shared_expert_dim, m.moe.tile_size = 4, 16, 16, 8
    return cfg


def build_mergemix_runs(path: str) -> None:
    from moejax.train.loop import train

    base = os.path.join(path, "base")
    train(tiny_config(), base)
    for domain in EXPERT_DOMAINS:
        cfg = tiny_config()
        cfg.train.steps, cfg.checkpoint.every_steps = EXPERT_STEPS[-1], EXPERT_STEPS[0]
        cfg.checkpoint.init_from, cfg.checkpoint.init_step = base, BASE_STEP
        cfg.data.mixture = {d: (1.0 if d == domain else 0.0) for d in cfg.data.mixture}
        train(cfg, os.path.join(path, "experts", domain))


@pytest.fixture(scope="module")
def mergemix_runs(run_once) -> str:
    """The directory holding ``base/`` and ``experts/<domain>/`` (see the module docstring)."""
    return run_once("mergemix_runs", build_mergemix_runs)


EXPERT_TOKENS = 4 * 8 * 64  # 4 steps of the tiny base (global batch 8 x seq_len 64)
TRAINED_DOMAINS = ("code", "math")
EXPERT_EVAL_ARGS = ("--tasks", "--loss-batches", "1")  # held-out losses only (the runner evaluates every checkpoint)


def build_mergemix_experts(path: str, base: str) -> None:
    from data_mixture.mergemix import experts

    plan = experts.plan_experts(base, domains=TRAINED_DOMAINS, expert_tokens=EXPERT_TOKENS, fractions=(0.5, 1.0))
    experts.train_experts(plan, path, eval_args=list(EXPERT_EVAL_ARGS), progress=False)


@pytest.fixture(scope="module")
def mergemix_experts(run_once, mergemix_runs) -> str:
    """An experts directory trained by ``data_mixture.mergemix.experts.train_experts`` from the tiny
    base (``code`` and ``math``, 4 steps each, checkpoints 2 and 4, losses-only evaluations); built
    once per test run. Copy it (``shutil.copytree``) before running anything that writes into it."""
    base = os.path.join(mergemix_runs, "base")
    return run_once("mergemix_experts", lambda path: build_mergemix_experts(path, base))
