"""The data of a training run, from its config: the one call the training loop makes.

``check_data_config(cfg)`` runs with the config checks, before anything is built or compiled:
it reads the dataset's description (no tokens), resolves the mixture or schedule against the
dataset's domains, checks ``model.vocab_size`` against the tokenizer and the shard files against
their manifests (``shard_check``: sizes always, checksum and token range of the first shards). ``make_data(cfg)``
then opens the dataset and returns the train iterator, the fixed eval batches, the domain list
(batch ``domain`` ids index it) and the tokenizer, whose id goes into checkpoints.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from moejax.data.layout import TOKENIZER_FILE
from moejax.data.dataset import (DatasetInfo, HeldoutWarning, TokenDataset, describe_dataset, open_dataset,
                                 small_heldout_message)
from moejax.data.mixture import Schedule, schedule_from_config
from moejax.data.packing import Example
from moejax.data.pipeline import MixtureIterator, make_eval_batches
from moejax.data.pools import dataset_pools, parse_unique_tokens
from moejax.data.shard_check import check_shards
from moejax.data.tokenizer import Tokenizer
from moejax.errors import DataError, user_stacklevel


@dataclasses.dataclass(frozen=True)
class TrainData:
    """Everything the loop needs from the data package."""

    train_iter: MixtureIterator  # get_state()/set_state() go into checkpoints
    eval_batches: dict[str, list[Example]]  # every domain of the dataset, held-out split (eval_rows)
    domains: tuple[str, ...]  # batch["domain"] indexes this
    tokenizer: Tokenizer  # tokenizer.name is the id recorded in checkpoints
    schedule: Schedule
    dataset: TokenDataset


def check_data_config(cfg: Any) -> tuple[DatasetInfo, Schedule]:
    """Check ``cfg.data`` against the dataset it names, cheaply; raises ``DataError``."""
    info = describe_dataset(cfg.data.path)
    problems = []  # the mixture's and the vocabulary's, independent: both said at once
    try:
        schedule = schedule_from_config(cfg.data, info.domains, info.description)
    except DataError as e:
        problems.append(str(e))
    try:  # pools of data-constrained domains (moejax.data.pools)
        for domain in parse_unique_tokens(cfg.data.get("unique_tokens", "")):
            info.check_domain(domain, "config key 'data.unique_tokens'")
    except DataError as e:
        problems.append(str(e))
    vocab = info.tokenizer.vocab_size
    if cfg.model.vocab_size < vocab:
        file = f", {Path(info.path) / TOKENIZER_FILE}" if info.path and (Path(info.path) / TOKENIZER_FILE).is_file() else ""
        fix = (f"checkpoint.init_from's embedding has {cfg.model.vocab_size} rows: prepare the data with the "
               "tokenizer that checkpoint was trained with (an imported one is in its tokenizer/ directory)"
               if cfg.checkpoint.init_from else f"Set --config.model.vocab_size={round_up(vocab)}")
        problems.append(
            f"config key 'model.vocab_size' has value {cfg.model.vocab_size}; allowed: at least "
            f"the vocabulary of the tokenizer of {info.description} ({info.tokenizer.name}{file}: "
            f"{vocab} tokens). {fix}."
        )
    if problems:
        raise DataError("\n".join(problems) if len(problems) == 1 else
                        f"{len(problems)} problems: " + " ".join(f"({i}) {p}" for i, p in enumerate(problems, 1)))
    if info.path:
        check_shards(info.path, vocab)  # a truncated or overwritten shard, before anything compiles
    return info, schedule


def make_data(
    cfg: Any, *, train_rows: Sequence[int] | None = None, eval_rows: Sequence[int] | None = None
) -> TrainData:
    """The run's data: train iterator, eval batches, domains, tokenizer.

    ``train_rows``/``eval_rows``: the rows of the global train/eval batch this process packs
    (increasing indices in ``[0, train.global_batch_size)``; default all). On several processes
    each loads only what its devices hold (``moejax.train.state.process_rows``).
    """
    _, schedule = check_data_config(cfg)
    t = cfg.train
    dataset = open_dataset(cfg.data.path, cfg.data.cache_dir or None)
    train_iter = MixtureIterator(
        dataset, schedule, seq_len=t.seq_len, global_batch_size=t.global_batch_size, seed=t.seed,
        rows=train_rows, unique_tokens=dataset_pools(dataset, cfg.data.get("unique_tokens", "")),
    )
    eval_batches = make_eval_batches(
        dataset.domains, seq_len=t.seq_len, batch_size=t.global_batch_size,
        batches_per_domain=t.eval_batches, dataset=dataset, rows=eval_rows, windows=t.get("eval_windows", "first"),
    )
    warn_small_heldout(dataset)
    return TrainData(train_iter, eval_batches, dataset.domains, dataset.tokenizer, schedule, dataset)


def warn_small_heldout(dataset: TokenDataset) -> None:
    """A ``HeldoutWarning`` per domain of a prepared dataset whose held-out split is below the
    documented minimum (``dataset.MIN_HELDOUT_*``), as ``prepare`` warned when it was made."""
    if not dataset.info.path:
        return  # the built-in corpus holds thousands of held-out documents per domain
    for domain in dataset.domains:
        streams = dataset.streams(domain, "heldout")
        manifest = dataset.manifest.get("domain_manifests", {}).get(domain, {})
        splits = manifest.get("splits", {})
        problem = small_heldout_message(
            domain, sum(s.num_documents for s in streams), sum(s.num_tokens for s in streams),
            total_documents=sum(split.get("documents", 0) for split in splits.values()),
            total_tokens=sum(split.get("tokens", 0) for split in splits.values()),
            fraction=manifest.get("heldout_fraction"),
        )
        if problem:
            warnings.warn(f"{dataset.info.description}: {problem}", HeldoutWarning, stacklevel=user_stacklevel())


VOCAB_MULTIPLE = 128  # embedding tables shard and tile better at a multiple of 128


def round_up(n: int, multiple: int = VOCAB_MULTIPLE) -> int:
    """``n`` rounded up to a multiple of ``multiple`` (a vocabulary size for the embedding table)."""
    return -(-n // multiple) * multiple
