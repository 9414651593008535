"""MoE routing under merging: routing breakdown, and HARC-style calibration of the merged router.

Merging MoE models linearly can send tokens to the wrong experts (*routing breakdown*, MergeMix,
arXiv 2601.17858; HARC, Huang et al., arXiv 2606.03391). Only the papers' abstracts were
reachable, so what is measured and solved here is chosen and stated exactly below.

Router inputs
    The hidden states entering each MoE layer's router (the output of the block's ``mlp_norm``),
    in float32, as the model's own forward returns them with its routing when called
    ``with_routing=True`` (``router_input_lbtd`` beside ``routing``): :func:`_probe_forward` is
    that forward plus the per-row log-likelihoods, so what is measured here is what the model
    computes.

Breakdown (:func:`breakdown`)
    For domain k, on the real tokens (``segment_ids > 0``) of its held-out batches, each model with
    its own hidden states: per MoE layer the fraction of tokens whose top-k expert *set* under the
    merged model differs from the set under expert k's own model. Averaged over domains per layer
    (``breakdown_l``) and over layers too (``breakdown``). The loss it costs, per domain:
    ``loss_cost = loss(merged) - loss(merged with expert k's router leaves swapped in)`` (nats per
    scored target, ``loss_mask``), i.e. what the merged router loses on domain k against the router
    domain k's expert trained, with everything else merged. Positive = the merged router costs
    loss; it can be negative (expert k's router sees the merged model's, not its own, hidden
    states). The expert's own loss (``loss_expert``) is reported for reference.

HARC-style calibration (:func:`harc_router`)
    Per MoE layer l, in depth order, with X_k [N_k, d] the router inputs of the *current* merged
    model (layers before l already calibrated, so layer l is fitted to the hidden states it will
    really see) on domain k's calibration tokens and Z_k [N_k, E] the router logits expert k
    produces on those tokens with its own model (its own hidden states and router)::

        W_l = argmin_W  sum_k (alpha_k / N_k) ||X_k W - Z~_k||_F^2 + damping ||W - W_merged||_F^2

    i.e. the normal equations ``(sum_k a_k X_k^T X_k + damping I) W = sum_k a_k X_k^T Z~_k +
    damping W_merged`` with ``a_k = alpha_k / N_k``, solved by conjugate gradients
    (``jax.scipy.sparse.linalg.cg``) matrix-free: the operator ``V -> sum_k a_k X_k^T (X_k V) +
    damping V`` is applied to the whole [d, E] block (the system is the same for every column)
    without forming X^T X. Each domain's term is a per-token mean (the 1/N_k) so alpha weighs
    domains, not token counts, and ``damping`` has one meaning whatever the calibration size.

    Why this form: the loss is quadratic in W, so its Hessian (with respect to vec W) is exactly
    ``(sum_k a_k X_k^T X_k) (x) I_E`` -- the Gauss-Newton curvature of logit matching, which the
    closed form uses in full (a plain gradient step would ignore it). It is also the Gauss-Newton
    Hessian of the KL between the expert's and the merged routing softmax at uniform routing,
    whose output Hessian ``diag(p) - p p^T`` is then the centring projector ``C = I - 11^T/E``
    (up to 1/E): hence the centring. The damping term is a trust region around the merged router
    (and makes the system positive definite when X_k has fewer tokens than d or is rank
    deficient).

    Cost: one forward of each expert per calibration batch (the targets, computed once), then per
    MoE layer one forward of the current merge per calibration batch (its X after the layers
    already calibrated) and a CG solve of d x E unknowns.

    Centring (softmax scores only): softmax routing and top-k are invariant to adding a constant
    to a token's logits, so only the centred logits ``Z C`` should be matched. The per-token mean
    of the target is replaced by the merged router's own per-token mean: ``Z~_k = Z_k C + X_k
    W_merged (11^T/E)``. The mean direction then has zero residual and the solution keeps
    ``W_merged``'s mean column exactly, while the centred part fits ``Z_k C``. Sigmoid scores are
    not shift-invariant: their logits are matched as they are.

    Only the router weights ``w_de`` change; selection biases (``select_bias_e``) and the
    balancing state are kept. The returned params have the input's pytree structure, dtypes and
    shardings (each new leaf is put on its old leaf's sharding), so compiled evaluators reuse.

    Default ``damping = 0.1``: the router inputs are RMS-normalised, so the per-token curvature
    ``sum_k a_k X_k^T X_k`` has eigenvalues of order 1 and 0.1 is a mild pull towards the merged
    router. On the MergeMix test fixture (d = 32, E = 4, top-2; alpha = (1/2, 1/2)) breakdown on
    one held-out batch per domain was 0.062 for the linear router merge, 0.877 with the base's
    router kept; HARC from the linear merge gave 0.059 with 4 training-split calibration batches
    per domain (2048 tokens) and damping 0.1, but 0.067-0.079 with one batch (512 tokens) at
    damping <= 0.1: with few calibration tokens the fit chases noise, so use several batches (or
    a larger damping). Differences of a few thousandths there are within the sampling noise of
    1024 compared tokens; the large, certain effects are the constructed ones (base router kept:
    0.88 -> 0.05; one expert with the base's router put in: 0.85 -> 0.0).

Treatments of a merge set (:func:`treatment_params`, :func:`compare_treatments`)
    ``linear`` (the paper: every parameter merged), ``base`` (the base's router kept) and ``harc``
    (the linear merge, routers calibrated with alpha weighting the domains). Calibration batches
    come from the *training* split (:func:`calibration_batches`), never from the held-out batches
    the evaluator scores.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from moejax.errors import ConfigError
from moejax.model.transformer import is_moe_layer, layer_runs
from moejax.train.state import to_global

Batch = Mapping[str, np.ndarray]


# ----------------------------------------------------------------------------------------------
# The probe forward: router inputs, routing and per-row log-likelihoods in one jitted pass.


def _probe_forward(params, balance, batch, *, graphdef, balancer) -> dict[str, jax.Array]:
    """Every MoE layer's router input ``h_lbtd``, router logits ``logits_lbte`` and top-k
    ``idx_lbtk`` (stacked over MoE layers in depth order), and per-row target log-likelihood
    sums ``logprob_b`` over ``loss_mask``: the model's forward ``with_routing``."""
    model = nnx.merge(graphdef, params)
    logits_btv, aux = model(
        batch["inputs"], batch["positions"], batch["segment_ids"],
        balancer=balancer if balance else None, balance_state=balance, with_routing=True,
    )
    logprob_bt = -optax.softmax_cross_entropy_with_integer_labels(logits_btv, batch["targets"])
    return {
        "h_lbtd": aux["router_input_lbtd"], "logits_lbte": aux["routing"].logits_bte,
        "idx_lbtk": aux["routing"].idx_btk,
        "logprob_b": jnp.sum(logprob_bt * batch["loss_mask"], axis=-1),
        "tokens_b": jnp.sum(batch["loss_mask"], axis=-1),
    }


class _Probe:
    """The jitted probe forward of one run (one compile per batch shape, params as arguments)."""

    def __init__(self, erun):
        run = erun.run
        self.run = run
        self.batch_sharding = run.batch_sharding(accum=False)
        replicated = NamedSharding(run.mesh, P())
        self.jitted = jax.jit(
            functools.partial(_probe_forward, graphdef=run.graphdef, balancer=run.balancer),
            in_shardings=(run.state_shardings["params"], replicated, self.batch_sharding),
            out_shardings=replicated,
        )

    def __call__(self, params, balance, batch: Batch) -> dict[str, np.ndarray]:
        with jax.set_mesh(self.run.mesh):
            out = self.jitted(params, balance or {}, to_global(dict(batch), self.batch_sharding, None))
        return jax.device_get(out)


@functools.lru_cache(maxsize=8)
def _probe(erun) -> _Probe:
    return _Probe(erun)


def moe_layers(erun) -> list[int]:
    """The model's MoE layers (depth indices), in the order of every ``_l`` axis here."""
    cfg = erun.cfg.model
    layers = [layer for layer in range(cfg.num_layers) if is_moe_layer(cfg, layer)]
    if not layers:
        raise ConfigError(f"{erun.workdir}: the model has no MoE layer; routing breakdown needs a router.")
    return layers


def router_inputs(erun, params, batch: Batch, *, balance: dict | None = None) -> dict[str, np.ndarray]:
    """Per MoE layer, over the batch's real tokens (``segment_ids > 0``, row-major order):
    router inputs ``x_lnd`` (float32), router logits ``logits_lne`` and top-k experts ``idx_lnk``.

    ``params``: any params pytree of ``erun``'s structure (a checkpoint's, a merge's).
    """
    out = _probe(erun)(params, balance, batch)
    real_bt = np.asarray(batch["segment_ids"]) > 0
    return {
        "x_lnd": out["h_lbtd"][:, real_bt], "logits_lne": out["logits_lbte"][:, real_bt],
        "idx_lnk": out["idx_lbtk"][:, real_bt],
    }


# ----------------------------------------------------------------------------------------------
# Router leaves.


def _router_slots(erun) -> list[tuple[int, int]]:
    """(run index under ``params['layers']``, index in the run's stacked leaves) per MoE layer."""
    slots = []
    for run_index, (is_moe, count) in enumerate(layer_runs(erun.cfg.model)):
        if is_moe:
            slots += [(run_index, j) for j in range(count)]
    return slots


def router_weights(erun, params) -> list[np.ndarray]:
    """The router weights ``w_de`` [d, E] of every MoE layer, in depth order (host copies)."""
    return [
        np.asarray(jax.device_get(params["layers"][run]["mlp"]["router"]["w_de"][j]))
        for run, j in _router_slots(erun)
    ]


def with_router_weights(erun, params, w_lde: Sequence[Any]) -> Any:
    """``params`` with every MoE layer's router ``w_de`` replaced (same structure, dtype and
    sharding per leaf; nothing else copied or changed)."""
    slots = _router_slots(erun)
    if len(w_lde) != len(slots):
        raise ValueError(f"w_lde has {len(w_lde)} router matrices; the model has {len(slots)} MoE layers.")
    new_runs = {}
    for run in sorted({r for r, _ in slots}):
        old = params["layers"][run]["mlp"]["router"]["w_de"]
        stacked = np.array(jax.device_get(old))
        for layer, (r, j) in enumerate(slots):
            if r == run:
                w = np.asarray(jax.device_get(w_lde[layer]))
                if w.shape != stacked.shape[1:]:
                    raise ValueError(
                        f"router matrix of MoE layer {layer} has shape {w.shape}; want {stacked.shape[1:]}."
                    )
                stacked[j] = w
        new_runs[run] = jax.device_put(stacked.astype(old.dtype), old.sharding)
    return _replace_router_leaves(params, new_runs)


def with_routers_of(erun, params, source_params) -> Any:
    """``params`` with the router leaves (``w_de`` and ``select_bias_e`` if any) of
    ``source_params`` (e.g. one expert's router swapped into a merge)."""
    out = dict(params)
    out["layers"] = dict(params["layers"])
    for run in sorted({r for r, _ in _router_slots(erun)}):
        layer = dict(out["layers"][run])
        mlp = dict(layer["mlp"])
        mlp["router"] = jax.tree.map(
            lambda new, old: jax.device_put(new, old.sharding),
            source_params["layers"][run]["mlp"]["router"], params["layers"][run]["mlp"]["router"],
        )
        layer["mlp"] = mlp
        out["layers"][run] = layer
    return out


def _replace_router_leaves(params, w_by_run: dict[int, jax.Array]) -> Any:
    out = dict(params)
    out["layers"] = dict(params["layers"])
    for run, w in w_by_run.items():
        layer = dict(out["layers"][run])
        mlp = dict(layer["mlp"])
        mlp["router"] = dict(mlp["router"], w_de=w)
        layer["mlp"] = mlp
        out["layers"][run] = layer
    return out


# ----------------------------------------------------------------------------------------------
# Breakdown.


def _aligned(experts, batches, what: str) -> tuple[list[str], list, list]:
    """(names, expert params, batch lists) from two mappings with the same keys or two sequences of
    the same length."""
    if isinstance(experts, Mapping) != isinstance(batches, Mapping):
        raise TypeError(f"expert_params and {what} must both be mappings (domain -> ...) or both sequences.")
    if isinstance(experts, Mapping):
        if set(experts) != set(batches):
            raise ValueError(f"expert_params domains {sorted(experts)} differ from {what} domains {sorted(batches)}.")
        names = list(experts)
        experts, batches = [experts[n] for n in names], [batches[n] for n in names]
    else:
        experts, batches = list(experts), list(batches)
        if len(experts) != len(batches):
            raise ValueError(f"{len(experts)} expert params but {len(batches)} {what} lists: one per expert.")
        names = [str(i) for i in range(len(experts))]
    if not experts:
        raise ValueError("no experts given.")
    for name, domain_batches in zip(names, batches):
        if isinstance(domain_batches, Mapping) or not len(domain_batches):
            raise ValueError(f"{what}[{name!r}] must be a non-empty list of batches (moejax batch dicts).")
    return names, experts, batches


def _unpack(x, balance=None):
    """(params, balance) of a params pytree or of a Checkpoint-like object (``.params`` and
    ``.balance``, e.g. ``MergeSet.expert(k)``); an explicit ``balance`` wins."""
    if hasattr(x, "params") and hasattr(x, "balance"):
        return x.params, (x.balance if balance is None else balance)
    return x, balance


def _balances(expert_balances, names: list[str]) -> list:
    if expert_balances is None:
        return [None] * len(names)
    if isinstance(expert_balances, Mapping):
        return [expert_balances.get(n) for n in names]
    expert_balances = list(expert_balances)
    if len(expert_balances) != len(names):
        raise ValueError(f"{len(expert_balances)} expert balances for {len(names)} experts.")
    return expert_balances


def _loss(out_list: list[dict]) -> float:
    nats = -sum(float(o["logprob_b"].sum()) for o in out_list)
    return nats / max(sum(float(o["tokens_b"].sum()) for o in out_list), 1.0)


def _set_differs_lbt(idx_a_lbtk: np.ndarray, idx_b_lbtk: np.ndarray) -> np.ndarray:
    """True where the two top-k selections are different *sets* (order ignored)."""
    return np.any(np.sort(idx_a_lbtk, axis=-1) != np.sort(idx_b_lbtk, axis=-1), axis=-1)


def breakdown(
    erun, merged_params, expert_params, batches_per_domain, *,
    merged_balance: dict | None = None, expert_balances=None,
) -> dict[str, Any]:
    """Routing breakdown of ``merged_params`` against each domain's expert (see the module doc).

    ``expert_params``: {domain: params or Checkpoint} and ``batches_per_domain``: {domain: [batch, ...]} (the
    domain's held-out batches; or two sequences aligned by position). ``merged_balance`` /
    ``expert_balances`` ({domain: balance} or a sequence): balancing states whose selection bias
    moves the top-k (default: a Checkpoint's own ``balance``, else none, as for the default
    balancing objectives). ``merged_params`` may be a Checkpoint too.

    Returns ``layers`` (MoE layer depth indices), ``breakdown_l`` and ``breakdown`` (means over
    domains), ``loss_cost`` (mean over domains) and ``per_domain[d]`` with ``breakdown_l``,
    ``breakdown``, ``tokens`` (real tokens compared), ``loss_merged``, ``loss_expert_router``,
    ``loss_cost`` and ``loss_expert``.
    """
    names, experts, batches = _aligned(expert_params, batches_per_domain, "batches_per_domain")
    experts, balances = map(list, zip(*(_unpack(e, b) for e, b in zip(experts, _balances(expert_balances, names)))))
    merged_params, merged_balance = _unpack(merged_params, merged_balance)
    layers, probe = moe_layers(erun), _probe(erun)
    per_domain = {}
    for name, expert, balance, domain_batches in zip(names, experts, balances, batches):
        swapped = with_routers_of(erun, merged_params, expert)
        differs, tokens, outs = np.zeros(len(layers)), 0, {"merged": [], "swapped": [], "expert": []}
        for batch in domain_batches:
            merged_out = probe(merged_params, merged_balance, batch)
            expert_out = probe(expert, balance, batch)
            outs["merged"].append(merged_out)
            outs["expert"].append(expert_out)
            outs["swapped"].append(probe(swapped, merged_balance, batch))
            real_bt = np.asarray(batch["segment_ids"]) > 0
            diff_lbt = _set_differs_lbt(merged_out["idx_lbtk"], expert_out["idx_lbtk"])
            differs += diff_lbt[:, real_bt].sum(axis=1)
            tokens += int(real_bt.sum())
        breakdown_l = differs / max(tokens, 1)
        loss_merged, loss_swapped = _loss(outs["merged"]), _loss(outs["swapped"])
        per_domain[name] = {
            "breakdown_l": breakdown_l.tolist(), "breakdown": float(breakdown_l.mean()), "tokens": tokens,
            "loss_merged": loss_merged, "loss_expert_router": loss_swapped,
            "loss_cost": loss_merged - loss_swapped, "loss_expert": _loss(outs["expert"]),
        }
    breakdown_l = np.mean([d["breakdown_l"] for d in per_domain.values()], axis=0)
    return {
        "layers": layers, "breakdown_l": breakdown_l.tolist(), "breakdown": float(breakdown_l.mean()),
        "loss_cost": float(np.mean([d["loss_cost"] for d in per_domain.values()])), "per_domain": per_domain,
    }


# ----------------------------------------------------------------------------------------------
# HARC-style calibration.


def _check_alpha(alpha, n: int) -> np.ndarray:
    a = np.asarray(alpha, dtype=np.float64).reshape(-1)
    if a.shape != (n,):
        raise ValueError(f"alpha has {a.size} entries; want one per expert ({n}).")
    for i, v in enumerate(a):
        if not np.isfinite(v) or v < 0:
            raise ValueError(f"alpha[{i}] = {v}: alpha entries must be finite and >= 0.")
    if a.sum() <= 0:
        raise ValueError("alpha is all zeros: at least one expert must have weight > 0.")
    return a


def centred_targets(x_nd, z_ne, w0_de) -> jax.Array:
    """``Z C + X W0 (11^T/E)``: the target logits centred per token, with the merged router's own
    per-token mean put back (softmax routing ignores the mean; see the module doc)."""
    z_ne = jnp.asarray(z_ne, jnp.float32)
    mean0_n1 = jnp.mean(jnp.asarray(x_nd, jnp.float32) @ jnp.asarray(w0_de, jnp.float32), axis=-1, keepdims=True)
    return z_ne - jnp.mean(z_ne, axis=-1, keepdims=True) + mean0_n1


@functools.partial(jax.jit, static_argnames=("maxiter",))
def cg_router_solve(xs_nd, zs_ne, weights_k, damping, w0_de, *, tol=1e-6, maxiter=None):
    """``W`` solving ``(sum_k w_k X_k^T X_k + damping I) W = sum_k w_k X_k^T Z_k + damping W0``
    by conjugate gradients, matrix-free (X^T X never formed), started at W0.

    ``xs_nd``, ``zs_ne``: tuples of [N_k, d] and [N_k, E] arrays (N_k may differ); ``weights_k``:
    [K]. Returns W [d, E] (float32) and the relative residual of the normal equations.
    """
    xs = [jnp.asarray(x, jnp.float32) for x in xs_nd]
    w0_de = jnp.asarray(w0_de, jnp.float32)

    def matvec(v_de):
        return sum(weights_k[i] * (x.T @ (x @ v_de)) for i, x in enumerate(xs)) + damping * v_de

    b_de = sum(weights_k[i] * (x.T @ jnp.asarray(z, jnp.float32)) for i, (x, z) in enumerate(zip(xs, zs_ne)))
    b_de = b_de + damping * w0_de
    w_de, _ = jax.scipy.sparse.linalg.cg(matvec, b_de, x0=w0_de, tol=tol, atol=0.0, maxiter=maxiter)
    residual = jnp.linalg.norm(matvec(w_de) - b_de) / jnp.maximum(jnp.linalg.norm(b_de), 1e-30)
    return w_de, residual


def _weighted_fit(xs, zs, a_k, w_de, centre: bool) -> float:
    """sum_k a_k ||X_k W - Z_k||^2 (centred per token for softmax): the data term, per token."""
    total = 0.0
    for x, z, a in zip(xs, zs, a_k):
        r = np.asarray(x, np.float64) @ np.asarray(w_de, np.float64) - np.asarray(z, np.float64)
        if centre:
            r = r - r.mean(axis=-1, keepdims=True)
        total += a * float(np.sum(r * r))
    return total


def harc_router(
    erun, merged_params, expert_params, alpha, calib_batches, damping: float = 0.1, *,
    merged_balance: dict | None = None, expert_balances=None, tol: float = 1e-6, maxiter: int | None = None,
    return_info: bool = False,
):
    """``merged_params`` with every MoE layer's router calibrated to the experts' routing (HARC
    style; the exact problem is in the module doc), layers solved in depth order.

    ``expert_params``: one params pytree (or Checkpoint) per expert (sequence, aligned with ``alpha`` and
    ``calib_batches``; or a mapping domain -> params with ``calib_batches`` a mapping too, alpha
    then in the mapping's key order or a {domain: weight} dict). ``calib_batches[k]``: a list of
    batches of domain k (use batches that are not the held-out ones breakdown is measured on).
    ``damping`` > 0: weight of ||W - W_merged||^2 against the per-token mean squared logit error.

    With ``return_info`` also returns {"layers": [...], "fit_before", "fit_after" (the data term
    per layer before/after), "residual" (CG's relative residual per layer), "tokens" per expert}.
    """
    names, experts, batches = _aligned(expert_params, calib_batches, "calib_batches")
    if isinstance(alpha, Mapping):
        if set(alpha) != set(names):
            raise ValueError(f"alpha domains {sorted(alpha)} differ from the experts' {names}.")
        alpha = [alpha[n] for n in names]
    alpha_k = _check_alpha(alpha, len(names))
    if not (np.isfinite(damping) and damping > 0):
        raise ValueError(f"damping = {damping}: must be finite and > 0 (it keeps the system positive definite).")
    experts, balances = map(list, zip(*(_unpack(e, b) for e, b in zip(experts, _balances(expert_balances, names)))))
    merged_params, merged_balance = _unpack(merged_params, merged_balance)
    layers = moe_layers(erun)
    centre = erun.cfg.model.moe.score_func == "softmax"

    # Targets: each expert's router logits with its own model, on its calibration tokens.
    z_k_lne = [
        np.concatenate([router_inputs(erun, e, b, balance=bal)["logits_lne"] for b in domain], axis=1)
        for e, bal, domain in zip(experts, balances, batches)
    ]
    tokens_k = [z.shape[1] for z in z_k_lne]
    if min(tokens_k) == 0:
        raise ValueError(f"calibration batches of {names[tokens_k.index(0)]!r} hold no real token.")
    kept = [k for k in range(len(names)) if alpha_k[k] > 0]
    a_k = jnp.asarray([alpha_k[k] / tokens_k[k] for k in kept], jnp.float32)

    params = merged_params
    w_lde = router_weights(erun, params)
    info = {"layers": layers, "fit_before": [], "fit_after": [], "residual": [], "tokens": dict(zip(names, tokens_k))}
    for layer in range(len(layers)):
        # X of the current merge: layers before this one are already calibrated.
        xs = [
            np.concatenate([router_inputs(erun, params, b, balance=merged_balance)["x_lnd"][layer] for b in batches[k]])
            for k in kept
        ]
        w0 = w_lde[layer]
        zs = [z_k_lne[k][layer] for k in kept]
        targets = tuple(centred_targets(x, z, w0) if centre else jnp.asarray(z) for x, z in zip(xs, zs))
        w_new, residual = cg_router_solve(tuple(jnp.asarray(x) for x in xs), targets, a_k, float(damping), w0,
                                          tol=tol, maxiter=maxiter)
        a_host = np.asarray(a_k, np.float64)
        info["fit_before"].append(_weighted_fit(xs, zs, a_host, w0, centre))
        info["fit_after"].append(_weighted_fit(xs, zs, a_host, np.asarray(w_new), centre))
        info["residual"].append(float(residual))
        w_lde[layer] = np.asarray(w_new)
        params = with_router_weights(erun, params, w_lde)
    return (params, info) if return_info else params


# ----------------------------------------------------------------------------------------------
# Calibration data and the router treatments of a MergeSet.


def calibration_batches(erun, domains: Sequence[str], *, batches_per_domain: int = 1,
                        batch_size: int | None = None) -> dict[str, list[dict[str, np.ndarray]]]:
    """{domain: [batch, ...]} from the *training* split, so calibration never sees the held-out
    tokens the evaluator scores (calibrating on them would flatter the calibrated router's
    held-out loss). Windows evenly spaced over the split (deterministic; the split's first windows
    alone could be one document); batches of ``batch_size`` (default: the run's global batch, a
    shape the compiled functions already know) rows of the run's ``seq_len``, padding rows (no
    real token, zero loss mask) when the split holds fewer windows."""
    from moejax.data.packing import padding_example, stack_examples
    from moejax.data.pipeline import split_packer

    cfg = erun.cfg
    batch_size = cfg.train.global_batch_size if batch_size is None else int(batch_size)
    if batches_per_domain < 1 or batch_size < 1:
        raise ValueError(f"batches_per_domain={batches_per_domain} and batch_size={batch_size} must be >= 1.")
    unknown = [d for d in domains if d not in erun.dataset.domains]
    if unknown:
        raise ValueError(f"domain(s) {unknown} not in the run's dataset; domains: {list(erun.dataset.domains)}.")
    out = {}
    for domain in domains:
        packer = split_packer(erun.dataset, domain, "train", cfg.train.seq_len,
                              fix="prepare the domain with more text.")
        wanted = batches_per_domain * batch_size
        stride = max(1, packer.num_windows // wanted)
        rows = [
            packer(i * stride) if i * stride < packer.num_windows
            else padding_example(cfg.train.seq_len, packer.domain, erun.dataset.tokenizer.pad_id)
            for i in range(wanted)
        ]
        out[domain] = [stack_examples(rows[b * batch_size:(b + 1) * batch_size]) for b in range(batches_per_domain)]
    return out


TREATMENTS = ("linear", "base", "harc")


def treatment_params(merge_set, alpha, treatment: str, *, calib_batches=None, damping: float = 0.1, **harc_kw):
    """The merged params of one router treatment of a :class:`~data_mixture.mergemix.merge.MergeSet`:
    ``linear`` (all parameters merged, the paper), ``base`` (the base's router kept) or ``harc``
    (the linear merge with its routers calibrated by :func:`harc_router` to the experts, alpha
    weighting the domains; ``calib_batches`` {domain: [batch]} required, e.g.
    :func:`calibration_batches`). Same structure and shardings as ``merge_set.merge``."""
    if treatment not in TREATMENTS:
        raise ValueError(f"treatment={treatment!r} is unknown; allowed: {', '.join(TREATMENTS)}.")
    domains = list(merge_set.domains)
    if isinstance(alpha, Mapping):
        if set(alpha) != set(domains):
            raise ValueError(f"alpha domains {sorted(alpha)} differ from the merge set's {domains}.")
        alpha = [alpha[d] for d in domains]
    alpha = np.asarray(alpha, np.float64).reshape(-1)
    if treatment != "harc":
        return merge_set.merge(alpha, router=treatment)
    if calib_batches is None:
        raise ValueError("treatment='harc' needs calib_batches ({domain: [batch, ...]}, see calibration_batches).")
    if not isinstance(calib_batches, Mapping):
        calib_batches = dict(zip(domains, calib_batches))
    missing = [d for d in domains if d not in calib_batches]
    if missing:
        raise ValueError(f"calib_batches has no batches for domain(s) {missing}.")
    experts = {d: merge_set.expert(d) for d in domains}
    return harc_router(
        merge_set.erun, merge_set.merge(alpha, router="linear"), experts, dict(zip(domains, alpha.tolist())),
        {d: calib_batches[d] for d in domains}, damping, merged_balance=merge_set.base.balance, **harc_kw,
    )


def compare_treatments(merge_set, alpha, heldout_batches, *, calib_batches=None, damping: float = 0.1,
                       treatments: Sequence[str] = TREATMENTS) -> dict[str, dict[str, Any]]:
    """{treatment: :func:`breakdown` of its merge against every expert on ``heldout_batches``
    ({domain: [batch]})}; ``harc`` needs ``calib_batches`` (never the held-out ones). The merges
    route with the base's balancing state, as ``MergeEvaluator`` scores them."""
    experts = {d: merge_set.expert(d) for d in merge_set.domains}
    return {
        t: breakdown(
            merge_set.erun, treatment_params(merge_set, alpha, t, calib_batches=calib_batches, damping=damping),
            experts, heldout_batches, merged_balance=merge_set.base.balance,
        )
        for t in treatments
    }
