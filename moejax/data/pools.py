"""Data-constrained domains: a fixed pool of unique training tokens per domain, repeated as needed.

A domain's *pool* is the part of its train split a run may read: ``U`` unique tokens, i.e.
``U // seq_len`` training windows of the domain (a window of ``seq_len + 1`` tokens trains
``seq_len`` tokens). Upweighting the domain then repeats the pool: the mixture draws its windows
in a fresh shuffled order every epoch (``pipeline.MixtureIterator``), and the pipeline counts the
epochs per domain (``MixtureIterator.epochs``, logged as ``epochs/<domain>`` in metrics.jsonl).

Where a pool comes from, the later winning:

* a prepared dataset: ``python -m moejax.data.prepare ... --unique-tokens DOMAIN=N`` records it
  in ``dataset.json`` (``domains.<domain>.unique_tokens``);
* the run's config: ``data.unique_tokens = "DOMAIN=N,DOMAIN=N"`` (``--config.data.unique_tokens=
  code=2000000``), for the built-in corpus too (``data_mixture plan`` writes it per proxy run).

Which windows form the pool is fixed by the domain's *name* alone (:func:`pool_windows`: a
permutation seeded by the name, its first ``U // seq_len`` entries, sorted), not by the run's
seed: runs with different seeds or mixtures repeat the same unique tokens, and a smaller pool
is a subset of a larger one (nested), so a proxy that subsamples the pool sees a part of the
target's data.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from moejax.errors import DataError

POOL_SEED = 0x706F6F6C  # "pool": the pool's windows do not depend on train.seed


def parse_unique_tokens(text: str, what: str = "config key 'data.unique_tokens'") -> dict[str, int]:
    """``"code=2000000,math=5e5"`` -> {"code": 2000000, "math": 500000}; "" -> {}. DataError naming
    ``what`` otherwise."""
    out: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in str(text or "").split(","))):
        name, sep, value = part.partition("=")
        try:
            number = float(value)
            if not sep or not name.strip() or not math.isfinite(number) or number < 1 or number != int(number):
                raise ValueError
        except ValueError:
            raise DataError(f"{what} has {part!r}; allowed: DOMAIN=TOKENS with a whole number of tokens >= 1, "
                            f"comma-separated, e.g. code=2000000,math=500000 (\"\" for no pools).") from None
        out[name.strip()] = int(number)
    return out


def dataset_pools(dataset: Any, config_text: str = "") -> dict[str, int]:
    """{domain: unique tokens} of a ``TokenDataset`` (its ``dataset.json`` pools) overridden by the
    config's ``data.unique_tokens``; checked against the dataset's domains and train tokens."""
    pools: dict[str, int] = {}
    for domain, entry in (dataset.manifest.get("domains") or {}).items():
        if isinstance(entry, Mapping) and entry.get("unique_tokens"):
            pools[domain] = int(entry["unique_tokens"])
    pools.update(parse_unique_tokens(config_text))
    for domain, tokens in pools.items():
        dataset.info.check_domain(domain, "config key 'data.unique_tokens'")
        have = sum(int(s.num_tokens) for s in dataset.streams(domain, "train"))
        if tokens > have:
            raise DataError(f"config key 'data.unique_tokens' gives domain {domain!r} a pool of {tokens:,} unique tokens, "
                            f"but its train split in {dataset.info.description} holds {have:,}; allowed: at most {have:,}.")
    return pools


def pool_windows(num_windows: int, unique_tokens: int, seq_len: int, domain: str) -> np.ndarray:
    """Sorted indices of the ``unique_tokens // seq_len`` training windows (at least 1, at most
    ``num_windows``) that form ``domain``'s pool (see the module docstring)."""
    k = max(1, min(int(num_windows), int(unique_tokens) // int(seq_len)))
    name = int.from_bytes(hashlib.sha256(domain.encode()).digest()[:8], "little")
    order = np.random.default_rng(np.random.SeedSequence([POOL_SEED, name])).permutation(int(num_windows))
    return np.sort(order[:k]).astype(np.int64)
