"""Pure, jitted train and eval steps with explicit shardings and a donated state."""

from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from moejax.model.balancing import Balancer, StepStats
from moejax.model.router import z_loss
from moejax.train.metrics import global_load, update_routing_health
from moejax.train.state import Run


def forward_loss(params, balance, batch: dict[str, jax.Array], *, graphdef, balancer: Balancer,
                 logits_z_loss: float):
    """Masked next-token cross-entropy plus the balancing objectives' losses and the logit z-loss.

    ``balance`` is the balancing state (its selection biases steer the routing). Returns
    (total loss, (cross-entropy, MoE aux dict)).
    """
    model = nnx.merge(graphdef, params)
    logits_btv, aux = model(
        batch["inputs"], batch["positions"], batch["segment_ids"], balancer=balancer, balance_state=balance
    )
    ce_bt = optax.softmax_cross_entropy_with_integer_labels(logits_btv, batch["targets"])
    mask_bt = batch["loss_mask"]
    ce = jnp.sum(ce_bt * mask_bt) / jnp.maximum(jnp.sum(mask_bt), 1.0)
    loss = ce + aux["balance_loss"]
    if logits_z_loss:
        loss = loss + logits_z_loss * z_loss(logits_btv)
    return loss, (ce, aux)


def make_train_step(cfg, run: Run) -> Callable:
    """(state, batch with leaves [A, B/A, ...]) -> (state, metrics); gradients averaged over A.

    After the optimizer update, the balancing state is updated once from the routing statistics
    of the whole step (mean over the A micro-batches of global-batch means), and the running
    loads behind the global routing metrics are advanced; a non-finite step keeps all of it.
    """
    loss_fn = functools.partial(
        forward_loss, graphdef=run.graphdef, balancer=run.balancer, logits_z_loss=cfg.model.logits_z_loss
    )

    def train_step(state, batch):
        params, balance = state["params"], state["balance"]
        grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

        def grads_and_stats(micro_batch):
            (loss, (ce, aux)), grads = grad_fn(params, balance, micro_batch)
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
        step_stats = StepStats(pbar_e=stats["pbar_le"], load_e=stats["load_le"])  # leaves [L, E]
        new_state = {
            "params": keep_if_bad(optax.apply_updates(params, updates), params),
            "opt_state": keep_if_bad(opt_state, state["opt_state"]),
            "step": state["step"] + 1,
            "balance": keep_if_bad(run.balancer.update(balance, step_stats), balance),
            "routing_health": keep_if_bad(
                update_routing_health(state["routing_health"], stats["load_le"]), state["routing_health"]
            ),
        }
        metrics = {
            **stats, "grad_norm": grad_norm, "lr": run.schedule(state["step"]), "skipped": ~finite,
            "load_global_le": global_load(new_state["routing_health"]),
            "balance_metrics": run.balancer.metrics(new_state["balance"]),
        }
        return new_state, metrics

    return jax.jit(
        train_step,
        in_shardings=(run.state_shardings, run.batch_sharding(accum=True)),
        out_shardings=(run.state_shardings, None),
        donate_argnums=0,
    )


def make_eval_step(cfg, run: Run) -> Callable:
    """(params, batch [B, ...], balance=None) -> (sum of masked cross-entropy, target tokens).

    Pass the train state's ``balance`` so that the selection biases (``loss_free``) route as in
    training; without it the model routes with no selection bias.
    """

    def eval_step(params, balance, batch):
        model = nnx.merge(run.graphdef, params)
        balancer = run.balancer if balance else None
        logits_btv, _ = model(
            batch["inputs"], batch["positions"], batch["segment_ids"], balancer=balancer, balance_state=balance
        )
        ce_bt = optax.softmax_cross_entropy_with_integer_labels(logits_btv, batch["targets"])
        return jnp.sum(ce_bt * batch["loss_mask"]), jnp.sum(batch["loss_mask"])

    replicated = NamedSharding(run.mesh, P())
    jitted = jax.jit(
        eval_step,
        in_shardings=(run.state_shardings["params"], replicated, run.batch_sharding(accum=False)),
        out_shardings=None,
    )

    def args(params, batch, balance=None):
        return params, {} if balance is None else balance, batch

    def call(params, batch, balance=None):
        return jitted(*args(params, batch, balance))

    # The same call, lowered: compiled ahead of the first call by moejax.train.precompile; and traced
    # (experiments/tools/lower_check.py lowers the trace for other platforms).
    call.lower = lambda params, batch, balance=None: jitted.lower(*args(params, batch, balance))
    call.trace = lambda params, batch, balance=None: jitted.trace(*args(params, batch, balance))
    return call
