"""Pure, jitted train and eval steps with explicit shardings and a donated state."""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from moejax.model.router import z_loss
from moejax.train.state import Run


def forward_loss(graphdef, params, batch: dict[str, jax.Array], logits_z_loss: float):
    """Masked next-token cross-entropy plus balancing and logit z-losses.

    Returns (total loss, (cross-entropy, MoE aux dict)).
    """
    model = nnx.merge(graphdef, params)
    logits_btv, aux = model(batch["inputs"], batch["positions"], batch["segment_ids"])
    ce_bt = optax.softmax_cross_entropy_with_integer_labels(logits_btv, batch["targets"])
    mask_bt = batch["loss_mask"]
    ce = jnp.sum(ce_bt * mask_bt) / jnp.maximum(jnp.sum(mask_bt), 1.0)
    loss = ce + aux["balance_loss"]
    if logits_z_loss:
        loss = loss + logits_z_loss * z_loss(logits_btv)
    return loss, (ce, aux)


def make_train_step(cfg, run: Run) -> Callable:
    """(state, batch with leaves [A, B/A, ...]) -> (state, metrics); gradients averaged over A."""
    z_weight = cfg.model.logits_z_loss

    def train_step(state, batch):
        params = state["params"]
        grad_fn = jax.value_and_grad(forward_loss, argnums=1, has_aux=True)

        def grads_and_stats(micro_batch):
            (loss, (ce, aux)), grads = grad_fn(run.graphdef, params, micro_batch, z_weight)
            return grads, {"loss": ce, "total_loss": loss, **aux}

        def accumulate(acc, micro_batch):
            return jax.tree.map(jnp.add, acc, grads_and_stats(micro_batch)), None

        first = jax.tree.map(lambda x: x[0], batch)
        zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), jax.eval_shape(grads_and_stats, first))
        (grads, stats), _ = jax.lax.scan(accumulate, zeros, batch)
        num_micro = jax.tree.leaves(batch)[0].shape[0]
        grads, stats = jax.tree.map(lambda x: x / num_micro, (grads, stats))

        grad_norm = optax.tree.norm(grads)
        updates, opt_state = run.optimizer.update(grads, state["opt_state"], params)
        # A non-finite loss or gradient skips the update: parameters and optimizer state stay.
        finite = jnp.isfinite(stats["total_loss"]) & jnp.isfinite(grad_norm)
        keep_if_bad = lambda new, old: jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)
        new_state = {
            "params": keep_if_bad(optax.apply_updates(params, updates), params),
            "opt_state": keep_if_bad(opt_state, state["opt_state"]),
            "step": state["step"] + 1,
        }
        metrics = {**stats, "grad_norm": grad_norm, "lr": run.schedule(state["step"]), "skipped": ~finite}
        return new_state, metrics

    return jax.jit(
        train_step,
        in_shardings=(run.state_shardings, run.batch_sharding(accum=True)),
        out_shardings=(run.state_shardings, None),
        donate_argnums=0,
    )


def make_eval_step(cfg, run: Run) -> Callable:
    """(params, batch [B, ...]) -> (sum of masked cross-entropy, number of target tokens)."""

    def eval_step(params, batch):
        model = nnx.merge(run.graphdef, params)
        logits_btv, _ = model(batch["inputs"], batch["positions"], batch["segment_ids"])
        ce_bt = optax.softmax_cross_entropy_with_integer_labels(logits_btv, batch["targets"])
        return jnp.sum(ce_bt * batch["loss_mask"]), jnp.sum(batch["loss_mask"])

    return jax.jit(
        eval_step,
        in_shardings=(run.state_shardings["params"], run.batch_sharding(accum=False)),
        out_shardings=None,
    )
