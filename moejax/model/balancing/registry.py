"""Objective names -> classes (one line each), and the config spec -> :class:`Balancer`."""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any

from moejax.errors import ConfigError
from moejax.model.balancing.balancer import Balancer
from moejax.model.balancing.base import BalancingError, Objective, RoutingSetup
from moejax.model.balancing.dpsl import DirichletPriorShaping
from moejax.model.balancing.global_batch import GlobalBatchLoss
from moejax.model.balancing.loss_free import LossFreeBias
from moejax.model.balancing.none import NoBalancing
from moejax.model.balancing.phi import PhiBalancing
from moejax.model.balancing.seq_aux import SequenceAuxLoss
from moejax.model.balancing.switch import SwitchLoss
from moejax.model.balancing.z_loss import RouterZLoss

OBJECTIVES: dict[str, type[Objective]] = {
    cls.name: cls
    for cls in (
        NoBalancing,
        SwitchLoss,
        GlobalBatchLoss,
        SequenceAuxLoss,
        RouterZLoss,
        LossFreeBias,
        PhiBalancing,
        DirichletPriorShaping,
    )
}

Spec = tuple[tuple[str, dict[str, Any]], ...]
EXAMPLE = "(('phi', {'alpha': 0.01}), ('z_loss', {'weight': 0.001}))"


def _is_mapping(x: Any) -> bool:
    return hasattr(x, "items") and hasattr(x, "keys")


def _entry(entry: Any) -> tuple[str, dict[str, Any]]:
    if isinstance(entry, str):
        return entry, {}
    if isinstance(entry, (tuple, list)) and len(entry) in (1, 2) and isinstance(entry[0], str):
        if len(entry) == 1:
            return entry[0], {}
        if _is_mapping(entry[1]):
            return entry[0], dict(entry[1].items())
    raise BalancingError(
        f"entry {entry!r} is not a (name, {{hyperparameter: value}}) pair; write the list as e.g. {EXAMPLE}."
    )


def parse_spec(spec: Any) -> Spec:
    """Normalises a balancing spec to a tuple of (name, hyperparameters) pairs.

    Accepted: a sequence of entries, each ``(name, {hyperparameters})``, ``(name,)`` or ``name``;
    a single ``(name, {hyperparameters})`` pair or a single name. ``()`` means no objective.
    """
    if isinstance(spec, str) or (
        isinstance(spec, (tuple, list)) and len(spec) == 2 and isinstance(spec[0], str) and _is_mapping(spec[1])
    ):
        spec = (spec,)
    if not isinstance(spec, (tuple, list)):
        raise BalancingError(f"expected a list of (name, {{hyperparameter: value}}) pairs such as {EXAMPLE}, got {spec!r}.")
    return tuple(_entry(entry) for entry in spec)


def _build_one(name: str, hparams: dict[str, Any], setup: RoutingSetup) -> Objective:
    if name not in OBJECTIVES:
        near = difflib.get_close_matches(name, list(OBJECTIVES), n=1)
        hint = f" Did you mean {near[0]!r}?" if near else ""
        raise BalancingError(f"unknown balancing objective {name!r}.{hint} Valid objectives: {', '.join(OBJECTIVES)}.")
    cls = OBJECTIVES[name]
    fields = {f.name: f for f in cls.hparams()}
    for key in hparams:
        if key not in fields:
            near = difflib.get_close_matches(key, list(fields), n=1)
            hint = f" Did you mean {near[0]!r}?" if near else ""
            known = ", ".join(fields) if fields else "none"
            raise BalancingError(
                f"balancing objective {name!r} has no hyperparameter {key!r}.{hint} Its hyperparameters: {known}."
            )
    for key, field in fields.items():
        if key not in hparams and field.default is dataclasses.MISSING:
            raise BalancingError(
                f"balancing objective {name!r} needs hyperparameter {key!r} ({field.metadata['doc']}; "
                f"allowed: {field.metadata['check'].allowed}), e.g. ({name!r}, {{{key!r}: ...}})."
            )
    return cls(setup=setup, **hparams)


def build_balancer(spec: Any, setup: RoutingSetup) -> Balancer:
    """The :class:`Balancer` of a spec; raises :class:`BalancingError` on any problem."""
    entries = parse_spec(spec)
    names = [name for name, _ in entries]
    for name in set(names):
        if names.count(name) > 1:
            raise BalancingError(
                f"balancing objective {name!r} is listed {names.count(name)} times; list it once "
                "with all its hyperparameters."
            )
    if "none" in names and len(names) > 1:
        raise BalancingError(
            f"'none' cannot be combined with other objectives ({', '.join(n for n in names if n != 'none')}); "
            "drop 'none', or list only ('none',)."
        )
    objectives = tuple(_build_one(name, hparams, setup) for name, hparams in entries)
    return Balancer(tuple(o for o in objectives if not isinstance(o, NoBalancing)))


def balancer_from_config(cfg) -> Balancer:
    """The run's Balancer from ``cfg.model.moe.balancing`` and the model/train shapes."""
    return build_balancer(cfg.model.moe.balancing, RoutingSetup.from_config(cfg))


def check_config(cfg) -> None:
    """Builds the balancing objectives once: names, hyperparameters and fit to the model/backend.
    Raises ``ConfigError`` naming ``model.moe.balancing``; part of :func:`moejax.checks.validate`."""
    try:
        balancer_from_config(cfg)
    except BalancingError as e:
        raise ConfigError(f"config key 'model.moe.balancing': {e}") from None
