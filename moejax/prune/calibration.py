"""Calibration tokens for pruning: every MoE layer's input, routing and expert weights, and each
token's loss, from one forward pass of the unpruned model.

The tokens are *training-split* windows of the run's own dataset, drawn with the run's mixture
from a data order that is not the run's (seed ``train.seed + 1``): pruning is fitted on text
like the training text, and the held-out split that evaluation scores stays unseen. Each MoE
layer is then fitted on its own input as the unpruned model computes it (layer-local
reconstruction: pruning one layer does not change the inputs another layer is fitted on).

Dimension letters: l MoE layers, t calibration tokens (flattened over rows), d model dim,
e experts, f expert ffn dim, k experts per token.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax  # type: ignore[import-untyped]
from flax import nnx

from moejax.data.pipeline import make_train_iterator
from moejax.errors import ConfigError
from moejax.eval.restore import Checkpoint, EvalRun
from moejax.model.transformer import is_moe_layer, layer_runs
from moejax.train.state import to_global

# The names of a routed expert's weights and the router's, in an MoE block's parameters.
EXPERT_WEIGHTS = ("w_gate_edf", "w_up_edf", "w_down_efd")


@dataclasses.dataclass(frozen=True)
class LayerData:
    """One MoE layer on the calibration tokens (numpy, float32 unless said)."""

    layer: int  # decoder layer index
    x_td: np.ndarray  # the router's (and experts') input: the block's normed hidden state
    idx_tk: np.ndarray  # int32 experts each token chose (as trained: balancing bias included)
    weight_tk: np.ndarray  # their combine weights (renormalised, scaled)
    probs_te: np.ndarray  # the routing distribution over all experts
    w_gate_edf: np.ndarray
    w_up_edf: np.ndarray
    w_down_efd: np.ndarray

    @property
    def num_experts(self) -> int:
        return self.w_gate_edf.shape[0]


@dataclasses.dataclass(frozen=True)
class Calibration:
    """Every MoE layer's :class:`LayerData` in depth order and each token's loss (nats)."""

    layers: tuple[LayerData, ...]
    loss_t: np.ndarray  # next-token cross-entropy of each calibration token under the unpruned model
    top_k: int
    renormalize: bool
    routed_scaling: float
    score_func: str

    @property
    def num_tokens(self) -> int:
        return int(self.loss_t.shape[0])


def moe_layer_params(params: Any, model_cfg) -> list[dict[str, np.ndarray]]:
    """Per MoE layer (depth order): its routed experts' weights and router weights, as numpy.

    Keys: the :data:`EXPERT_WEIGHTS`, ``w_de`` (router) and, with ``router_bias``, ``select_bias_e``.
    """
    out: list[dict[str, np.ndarray]] = []
    for run, (is_moe, count) in enumerate(layer_runs(model_cfg)):
        if not is_moe:
            continue
        mlp = params["layers"][run]["mlp"]
        arrays = {name: np.asarray(jax.device_get(_value(mlp[name]))) for name in EXPERT_WEIGHTS}
        arrays["w_de"] = np.asarray(jax.device_get(_value(mlp["router"]["w_de"])))
        if "select_bias_e" in mlp["router"]:
            arrays["select_bias_e"] = np.asarray(jax.device_get(_value(mlp["router"]["select_bias_e"])))
        out.extend({name: a[i] for name, a in arrays.items()} for i in range(count))
    return out


def _value(leaf):
    return leaf.value if hasattr(leaf, "value") else leaf["value"] if isinstance(leaf, dict) else leaf


def collect(erun: EvalRun, ckpt: Checkpoint, *, tokens: int, min_tokens: int = 0, seed_offset: int = 1) -> Calibration:
    """About ``tokens`` calibration tokens (whole batches of the run's shape, real tokens only).

    ``min_tokens``: what the pruning objective needs; fewer real tokens is a ``ConfigError``.
    ``seed_offset``: the data order is ``train.seed + seed_offset`` (another offset draws another
    sample, e.g. to measure reconstruction error on tokens pruning did not see).
    """
    cfg = erun.cfg
    moe = cfg.model.moe
    if not any(is_moe_layer(cfg.model, layer) for layer in range(cfg.model.num_layers)):
        raise ConfigError(f"{erun.workdir}: the model has no MoE layer, so there are no experts to prune.")
    if tokens < max(min_tokens, 1):
        raise ConfigError(f"--calib-tokens {tokens} is too small: the objective needs at least "
                          f"{min_tokens} calibration tokens here.")
    batch_rows, seq = cfg.train.global_batch_size, cfg.train.seq_len
    batches = max(1, -(-tokens // (batch_rows * seq)))
    data = make_train_iterator(
        dict(cfg.data.mixture), seq_len=seq, global_batch_size=batch_rows, seed=cfg.train.seed + seed_offset,
        dataset=erun.dataset,
    )
    forward = _forward(erun.run.graphdef, erun.run.balancer if ckpt.balance else None)
    sharding = erun.run.batch_sharding(accum=False)
    parts: list[dict[str, np.ndarray]] = []
    for _ in range(batches):
        batch = next(data)
        with jax.set_mesh(erun.run.mesh):
            out = jax.device_get(forward(ckpt.params, ckpt.balance, to_global(batch, sharding, None)))
        real = np.asarray(batch["segment_ids"] > 0) & np.asarray(batch["loss_mask"] > 0)
        parts.append({key: value[:, real] if key != "loss" else value[real] for key, value in out.items()})
    stacked = {key: np.concatenate([p[key] for p in parts], axis=1 if key != "loss" else 0) for key in parts[0]}
    stacked = {key: value[..., :tokens, :] if key != "loss" else value[:tokens] for key, value in stacked.items()}
    loss_t = stacked["loss"]
    if loss_t.shape[0] < min_tokens:
        raise ConfigError(f"only {loss_t.shape[0]} real calibration tokens; the objective needs at least "
                          f"{min_tokens}: raise --calib-tokens.")
    weights = moe_layer_params(ckpt.params, cfg.model)
    moe_layers = [layer for layer in range(cfg.model.num_layers) if is_moe_layer(cfg.model, layer)]
    layers = []
    for i, layer in enumerate(moe_layers):
        e = weights[i]["w_gate_edf"].shape[0]
        layers.append(LayerData(
            layer=layer, x_td=stacked["x"][i], idx_tk=stacked["idx"][i].astype(np.int32),
            weight_tk=stacked["weight"][i], probs_te=stacked["probs"][i][:, :e],
            **{name: weights[i][name].astype(np.float32) for name in EXPERT_WEIGHTS},
        ))
    return Calibration(tuple(layers), loss_t, moe.experts_per_token, bool(moe.renormalize),
                       float(moe.routed_scaling), moe.score_func)


@functools.cache
def _forward(graphdef, balancer):
    """jit: params, balance, batch -> per MoE layer router input, routing, and per-token loss."""

    def forward(params, balance, batch):
        model = nnx.merge(graphdef, params)
        logits_btv, aux = model(
            batch["inputs"], batch["positions"], batch["segment_ids"], balancer=balancer,
            balance_state=balance if balance else None, with_routing=True,
        )
        routing = aux["routing"]
        loss_bt = optax.softmax_cross_entropy_with_integer_labels(logits_btv, batch["targets"])
        return {
            "x": aux["router_input_lbtd"], "idx": routing.idx_btk, "weight": routing.weight_btk,
            "probs": routing.probs_bte, "loss": loss_bt.astype(jnp.float32),
        }

    return jax.jit(forward)
