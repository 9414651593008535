"""AdamW with warmup + cosine or warmup-stable-decay, global-norm clipping, masked weight decay."""

from __future__ import annotations

import jax
import optax


def lr_schedule(cfg_optim, total_steps: int) -> optax.Schedule:
    """Linear warmup to ``lr``, then cosine decay (or stable, then a linear decay) to min_lr_ratio*lr."""
    o = cfg_optim
    peak, floor = o.lr, o.lr * o.min_lr_ratio
    warmup = optax.linear_schedule(0.0, peak, o.warmup_steps)
    rest = max(total_steps - o.warmup_steps, 1)
    if o.schedule == "cosine":
        after = optax.cosine_decay_schedule(peak, rest, alpha=o.min_lr_ratio)
    else:  # wsd
        decay = max(int(round(rest * o.decay_fraction)), 1)
        after = optax.join_schedules(
            [optax.constant_schedule(peak), optax.linear_schedule(peak, floor, decay)], [rest - decay]
        )
    return optax.join_schedules([warmup, after], [o.warmup_steps])


def decay_mask(params):
    """Weight decay only on matrices: norms, biases and router biases (all 1-D) are left alone."""
    return jax.tree.map(lambda p: p.ndim >= 2, params)


def make_optimizer(cfg_optim, total_steps: int) -> tuple[optax.GradientTransformation, optax.Schedule]:
    o = cfg_optim
    schedule = lr_schedule(o, total_steps)
    chain = [optax.clip_by_global_norm(o.clip_norm)] if o.clip_norm > 0 else []
    chain.append(
        optax.adamw(schedule, b1=o.b1, b2=o.b2, eps=o.eps, weight_decay=o.weight_decay, mask=decay_mask)
    )
    return optax.chain(*chain), schedule
