"""AdamW with warmup + cosine, warmup-stable-decay or constant lr, global-norm clipping, masked weight decay."""

from __future__ import annotations

import jax
import optax
from flax import nnx

from moejax.config import effective_warmup_steps


def lr_schedule(cfg_optim, total_steps: int) -> optax.Schedule:
    """Linear warmup to ``lr``, then cosine decay (or stable, then a linear decay) to min_lr_ratio*lr,
    or (``constant``) ``lr`` to the end of the run: no decay, so a run stopped at any step is as
    far along its schedule as at any other (MergeMix's domain experts, whose checkpoints at several
    budgets are all used; ``min_lr_ratio`` and ``decay_fraction`` are not read).

    The warmup is ``optim.warmup_steps``, shortened to half the run when it is longer
    (:func:`moejax.config.effective_warmup_steps`).
    """
    o = cfg_optim
    peak, floor = o.lr, o.lr * o.min_lr_ratio
    warmup_steps = effective_warmup_steps(o.warmup_steps, total_steps)
    warmup = optax.linear_schedule(0.0, peak, warmup_steps)
    rest = max(total_steps - warmup_steps, 1)
    if o.schedule == "cosine":
        after = optax.cosine_decay_schedule(peak, rest, alpha=o.min_lr_ratio)
    elif o.schedule == "constant":
        after = optax.constant_schedule(peak)
    else:  # wsd
        decay = max(int(round(rest * o.decay_fraction)), 1)
        after = optax.join_schedules(
            [optax.constant_schedule(peak), optax.linear_schedule(peak, floor, decay)], [rest - decay]
        )
    return optax.join_schedules([warmup, after], [warmup_steps])


def decay_mask(abstract_params: nnx.State) -> dict:
    """Weight decay only on matrices: norms, biases and router biases (vectors per layer) are left alone.

    Decided from each parameter's logical axes, not its rank: a stack of per-layer norm scales
    ("layers", "norm") is 2-D but still a vector per layer. A parameter created with the metadata
    ``decay=False`` (the attention biases, laid out [heads, head_dim]) is never decayed. Returns a
    pure dict of booleans.
    """

    def is_matrix(variable: nnx.Variable) -> bool:
        metadata = variable.get_metadata()
        axes = metadata.get("axes") or ()
        return metadata.get("decay", True) and len([a for a in axes if a != "layers"]) >= 2

    mask = jax.tree.map(is_matrix, abstract_params, is_leaf=lambda v: isinstance(v, nnx.Variable))
    return nnx.to_pure_dict(mask)


def make_optimizer(
    cfg_optim, total_steps: int, mask: dict
) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """AdamW per the config; ``mask`` (from :func:`decay_mask`) says which leaves decay."""
    o = cfg_optim
    schedule = lr_schedule(o, total_steps)
    chain = [optax.clip_by_global_norm(o.clip_norm)] if o.clip_norm > 0 else []
    chain.append(
        optax.adamw(schedule, b1=o.b1, b2=o.b2, eps=o.eps, weight_decay=o.weight_decay, mask=mask)
    )
    return optax.chain(*chain), schedule
