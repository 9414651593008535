"""Config values the program can derive from the run's dataset, filled in before any check.

A value the user would only copy out of an error message is not asked for:

- ``model.vocab_size``: when the command line does not set it and the config's value is smaller
  than the dataset tokenizer's vocabulary, it becomes that vocabulary rounded up to a multiple of
  128 (embedding tables shard and tile better so). A value the command line sets is kept (and
  checked); so is one the config already has that holds the vocabulary, and a warm start's
  (``checkpoint.init_from``: its embedding has the rows it has).
- ``data.mixture``: for a prepared dataset (``data.path`` set) with no mixture on the command
  line, no ``data.mixture_file`` and no ``data.schedule``, when the config's mixture is the
  built-in corpus's default (the experiment file did not choose one), the mixture is the dataset's
  own domains in proportion to their training tokens (``data.default_mixture='tokens'``, the
  default) or equal weights (``'uniform'``).

Each derived value is said in one log line (``moejax: derived ...``) and ends up in the run's
``config.json`` like any other value, so a resume, ``moejax.eval`` and an export read it back.
Layering: above ``moejax.config`` and ``moejax.data`` (it reads the dataset's description),
called by :func:`moejax.checks.check_config` first.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection
from pathlib import Path

from ml_collections import ConfigDict

from moejax import config as config_lib
from moejax.data import layout
from moejax.data.dataset import DatasetInfo, describe_dataset
from moejax.data.from_config import VOCAB_MULTIPLE, round_up

log = logging.getLogger(__name__)

DEFAULT_MIXTURES = ("tokens", "uniform")  # values of data.default_mixture


def _set_on_command_line(changed: Collection[str], key: str) -> bool:
    return any(path == key or path.startswith(key + ".") for path in changed)


def derive_vocab_size(cfg: ConfigDict, info: DatasetInfo, changed: Collection[str] = ()) -> str:
    """Sets ``model.vocab_size`` from the tokenizer when it is not the user's; returns the note ('' if none)."""
    vocab = info.tokenizer.vocab_size
    if (cfg.model.vocab_size >= vocab or _set_on_command_line(changed, "model.vocab_size")
            or cfg.checkpoint.init_from):
        return ""
    derived = round_up(vocab)
    note = (f"moejax: derived model.vocab_size={derived} from the tokenizer of {info.description} "
            f"({info.tokenizer.name}: {vocab} tokens, rounded up to a multiple of {VOCAB_MULTIPLE}; the config "
            f"had {cfg.model.vocab_size}). Set --config.model.vocab_size to choose another.")
    cfg.model.vocab_size = derived
    return note


def domain_tokens(info: DatasetInfo) -> dict[str, int]:
    """Training tokens per domain of a prepared dataset, from its ``dataset.json`` (no tokens read)."""
    with open(Path(info.path) / layout.DATASET_FILE) as f:
        domains = json.load(f)["domains"]
    return {domain: int(domains[domain].get("train_tokens", 0)) for domain in info.domains}


def default_mixture(info: DatasetInfo, kind: str = "tokens") -> dict[str, float]:
    """A prepared dataset's own mixture: its domains by share of training tokens, or uniform."""
    if kind == "uniform":
        return {domain: 1 / len(info.domains) for domain in info.domains}
    tokens = domain_tokens(info)
    total = sum(tokens.values())
    if not total:
        return {domain: 1 / len(info.domains) for domain in info.domains}
    return {domain: round(tokens[domain] / total, 6) for domain in info.domains}


def derive_mixture(cfg: ConfigDict, info: DatasetInfo, changed: Collection[str] = ()) -> str:
    """Sets ``data.mixture`` to the dataset's own when nothing chose one; returns the note ('' if none)."""
    data = cfg.data
    if (not info.path or data.mixture_file or data.schedule or _set_on_command_line(changed, "data.mixture")
            or not hasattr(data.mixture, "items")
            or dict(data.mixture.items()) != dict(config_lib.default_config().data.mixture.items())):
        return ""
    kind = data.get("default_mixture", "tokens")
    mixture = default_mixture(info, kind)
    data.mixture = ConfigDict(mixture)
    how = "equal weights" if kind == "uniform" else "in proportion to their training tokens"
    weights = ", ".join(f"{domain} {weight:.4g}" for domain, weight in mixture.items())
    switch = ("--config.data.default_mixture=tokens weighs them by tokens" if kind == "uniform"
              else "--config.data.default_mixture=uniform gives equal weights")
    return (f"moejax: derived data.mixture from {info.description}: its domains {how}: {weights} "
            f"({switch}; --config.data.mixture.DOMAIN=WEIGHT chooses).")


def derive_from_dataset(cfg: ConfigDict, changed: Collection[str] = (), *, notes: bool = True) -> list[str]:
    """Fills in ``cfg``'s derivable values (module docstring) in place; returns the notes, logged
    at INFO when ``notes``. A dataset that cannot be described derives nothing: the data checks
    that follow report it."""
    kind = cfg.data.get("default_mixture", "tokens")
    if kind not in DEFAULT_MIXTURES:
        return []  # config.check_values names the key and its choices
    try:
        info = describe_dataset(cfg.data.path)
    except Exception:  # noqa: BLE001 - reported, with its fix, by check_data_config
        return []
    derived = [note for note in (derive_vocab_size(cfg, info, changed), derive_mixture(cfg, info, changed)) if note]
    if notes:
        for note in derived:
            log.info(note)
    return derived

