"""Grain pipeline: built-in corpus -> per-domain windows -> weighted mixture -> global batches.

Each domain with a positive weight becomes its own grain dataset::

    MapDataset.range(num_windows)   # window indices into the domain's train stream
      .shuffle(seed)                # a fresh order every epoch (``repeat`` reseeds)
      .repeat()                     # infinite
      .map(WindowPacker(...))       # index -> packed example (see ``packing``)
      .to_iter_dataset()

The domains are combined with ``grain.IterDataset.mix`` keyed by domain name, so each component
keeps its own position and a checkpointed iterator state names its components; then the mixture
is batched. Grain interleaves components deterministically in proportion to the weights, so every
batch's domain counts track the weights closely.

Weights are normalised to sum to 1; domains with weight 0 are left out. Batches are dicts of
numpy arrays with the fields of ``packing.FIELDS`` and a leading batch axis. This first version
is single-process: the iterator yields the *global* batch.

Windows come from the built-in corpus built with ``CORPUS_SEED``; the ``seed`` argument of
``make_train_iterator`` only orders them, so train and eval always use the same split.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Iterable, Mapping
from typing import Final

import grain
import numpy as np

from moejax.data.corpus import DOMAINS, TokenizedCorpus, check_domain, load_tokenized_corpus
from moejax.data.packing import Example, WindowPacker, padding_example, stack_examples
from moejax.data.tokenizer import get_tokenizer

CORPUS_SEED: Final = 0
# The corpus is memory-mapped and packing is cheap numpy: reading in the calling thread is
# faster than prefetch threads contending for the GIL (grain's advice for in-memory data).
_READ_OPTIONS: Final = grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)


def normalize_mixture(mixture: Mapping[str, float]) -> dict[str, float]:
    """Validate ``mixture`` and return its positive weights, scaled to sum to 1, in DOMAINS order.

    Keys must be domain names; weights must be finite, non-negative real numbers, not all zero.
    """
    if not isinstance(mixture, Mapping) or not mixture:
        raise ValueError(f"mixture must be a non-empty mapping domain -> weight, got {mixture!r}")
    for domain, weight in mixture.items():
        if domain not in DOMAINS:
            raise ValueError(f"unknown mixture domain {domain!r}; allowed domains: {DOMAINS}")
        if (
            isinstance(weight, bool)
            or not isinstance(weight, numbers.Real)
            or not math.isfinite(weight)
            or weight < 0
        ):
            raise ValueError(
                f"mixture weight for {domain!r} must be a finite number >= 0, got {weight!r}"
            )
    total = math.fsum(float(w) for w in mixture.values())
    if total <= 0:
        raise ValueError(f"mixture weights must not all be zero, got {dict(mixture)}")
    return {d: float(mixture[d]) / total for d in DOMAINS if mixture.get(d, 0) > 0}


def make_train_iterator(
    mixture: Mapping[str, float],
    *,
    seq_len: int,
    global_batch_size: int,
    seed: int,
    cache_dir: str | os.PathLike[str] | None = None,
) -> grain.DatasetIterator:
    """An endless iterator of training batches drawn from the domains in ``mixture``.

    ``it.get_state()`` is JSON-serialisable; ``it.set_state(state)`` on an iterator made with the
    same arguments continues with exactly the batches the original would have produced.
    """
    weights = normalize_mixture(mixture)
    _check_positive_int("seq_len", seq_len)
    _check_positive_int("global_batch_size", global_batch_size)
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not 0 <= seed < 2**32:
        raise ValueError(f"seed must be an int in [0, 2**32), got {seed!r}")
    corpus = load_tokenized_corpus(CORPUS_SEED, cache_dir)
    components = {
        domain: _domain_dataset(corpus, domain, seq_len, _shuffle_seed(int(seed), domain))
        for domain in weights
    }
    mixed = grain.IterDataset.mix(components, weights)
    return iter(mixed.batch(global_batch_size, drop_remainder=True))


def make_eval_batches(
    domains: Iterable[str],
    *,
    seq_len: int,
    batch_size: int,
    batches_per_domain: int,
    cache_dir: str | os.PathLike[str] | None = None,
) -> dict[str, list[Example]]:
    """Fixed held-out batches per domain: consecutive windows of the heldout split, unshuffled.

    A domain gets ``batches_per_domain`` batches, or fewer if its held-out split is smaller (at
    least one; if it holds fewer than ``batch_size`` windows, the batch is filled up with padding
    examples whose loss mask is zero, so batch shapes never change).
    """
    domains = list(domains)
    if not domains:
        raise ValueError("domains must name at least one domain")
    for domain in domains:
        check_domain(domain)
    _check_positive_int("seq_len", seq_len)
    _check_positive_int("batch_size", batch_size)
    _check_positive_int("batches_per_domain", batches_per_domain)
    corpus = load_tokenized_corpus(CORPUS_SEED, cache_dir)
    pad_id = get_tokenizer(corpus.manifest["tokenizer"]).pad_id
    batches = {}
    for domain in domains:
        packer = WindowPacker(corpus.stream(domain, "heldout"), seq_len, DOMAINS.index(domain))
        if packer.num_windows == 0:
            raise ValueError(
                f"held-out split of domain {domain!r} has no window of {seq_len + 1} tokens"
            )
        num_batches = min(batches_per_domain, max(1, packer.num_windows // batch_size))
        examples = [
            packer(i) if i < packer.num_windows else padding_example(seq_len, packer.domain, pad_id)
            for i in range(num_batches * batch_size)
        ]
        batches[domain] = [
            stack_examples(examples[b * batch_size : (b + 1) * batch_size])
            for b in range(num_batches)
        ]
    return batches


def _domain_dataset(
    corpus: TokenizedCorpus, domain: str, seq_len: int, seed: int
) -> grain.IterDataset:
    """Endless, per-epoch reshuffled packed examples from one domain's train windows."""
    packer = WindowPacker(corpus.stream(domain, "train"), seq_len, DOMAINS.index(domain))
    if packer.num_windows == 0:
        raise ValueError(f"train split of domain {domain!r} has no window of {seq_len + 1} tokens")
    return (
        grain.MapDataset.range(packer.num_windows)
        .shuffle(seed=seed)
        .repeat()
        .map(packer)
        .to_iter_dataset(_READ_OPTIONS)
    )


def _shuffle_seed(seed: int, domain: str) -> int:
    """A 32-bit shuffle seed for one domain, derived from the run seed."""
    return int(np.random.SeedSequence([seed, DOMAINS.index(domain)]).generate_state(1)[0])


def _check_positive_int(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
