"""Pluggable load-balancing objectives for the MoE router.

An objective is one file: a frozen dataclass deriving from :class:`Objective`, whose fields are
its validated hyperparameters, with pure functions for one MoE layer:

===================================  ======================================================
``init_state()``                     float32 state (e.g. an EMA or a bias), ``{}`` if none
``selection_bias(state)``            float32 [E] added to router scores for top-k only, or None
``loss(routing, state)``             weighted auxiliary loss of one micro-batch
``update(state, stats)``             new state, once per optimizer step (global-batch stats)
``metrics(state)``                   scalars to log
===================================  ======================================================

Adding one is that file plus a line in :data:`OBJECTIVES` (``registry.py``). Objectives compose:
the config lists them with hyperparameters, and :class:`Balancer` sums their losses and biases::

    c.model.moe.balancing = (("phi", {"alpha": 1e-2, "eta": 0.65}), ("z_loss", {"weight": 1e-3}))
    --config.model.moe.balancing="(('loss_free', {'u': 1e-3}), ('seq_aux', {'weight': 1e-4}))"

Objectives: ``none``, ``switch``, ``global_batch``, ``seq_aux``, ``z_loss``, ``loss_free``,
``phi``, ``dpsl`` (formulas and sources in each module; guide in ``docs/balancing.md``).

State lives in the train state as ``state["balance"]``: objective name -> leaves [L, E] over the
L MoE layers, replicated on every device, updated by the train step after the optimizer update
(and skipped with it on a non-finite step), checkpointed with the rest of the state.
"""

from moejax.model.balancing.balancer import Balancer, BalanceState
from moejax.model.balancing.base import BalancingError, Objective, RoutingSetup, StepStats
from moejax.model.balancing.registry import OBJECTIVES, balancer_from_config, build_balancer, check_config, parse_spec

__all__ = [
    "OBJECTIVES",
    "Balancer",
    "BalanceState",
    "BalancingError",
    "Objective",
    "RoutingSetup",
    "StepStats",
    "balancer_from_config",
    "build_balancer",
    "check_config",
    "parse_spec",
]
