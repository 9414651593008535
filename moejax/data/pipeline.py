"""Grain pipeline: a dataset's domains -> weighted mixture (by stage) -> global or per-process batches.

Each domain with a positive weight in the current stage is its own grain dataset of *window
picks*::

    MapDataset.range(num_windows)   # window indices into the domain's train shards
      .shuffle(seed)                # a fresh order every epoch (``repeat`` reseeds)
      .repeat()                     # endless
      [offset:]                     # continue where earlier stages left this domain
      .map(pick)                    # -> {"domain": int32, "window": int64}
      .to_iter_dataset()

The stage's domains are combined with ``grain.IterDataset.mix`` keyed by domain name (each
component keeps its own position, and the iterator state names them), then batched into the
*global* batch of picks. ``MixtureIterator`` packs only this process's rows of it (see
``packing``): ``rows`` names them (the training loop derives them from the batch sharding, see
``moejax.train.state.process_rows``), or ``process_index``/``process_count`` take the i-th of P
equal blocks ``[i * B / P, (i + 1) * B / P)``. Every process draws the same global batch of
picks whatever rows it packs, so the iterator state (below) is the same on every process.

Stages (``mixture.Schedule``): at a stage's start step the iterator builds that stage's mixture,
starting every domain at the number of its windows drawn so far, so a domain's data is read as
one continuous shuffled stream across stages, never restarting. The state
(``get_state``/``set_state``) is JSON: the step, the stage, per-domain counts and the grain
state of the current stage, plus what it was made with, so resuming with other data shapes is
refused instead of silently giving other batches.

Batches are dicts of numpy arrays with the fields of ``packing.FIELDS``; ``domain`` indexes the
dataset's domain list (``dataset.domains``).
"""

from __future__ import annotations

import hashlib
import numbers
import os
import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

import grain
import numpy as np

from moejax.data.dataset import TokenDataset, describe_dataset, open_dataset
from moejax.data.mixture import Schedule, Stage, make_schedule, stage_index
from moejax.data.packing import Example, ShardedPacker, padding_example, stack_examples
from moejax.data.pools import pool_windows
from moejax.errors import DataError

STATE_VERSION: Final = 2
# Picks are tiny and packing happens in the calling thread: no prefetch threads contending for
# the GIL (grain's advice for in-memory data).
_READ_OPTIONS: Final = grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)


class DataStateWarning(UserWarning):
    """A restored iterator state was saved with different data content."""


class _Pick:
    """Window index -> ``{"domain", "window"}`` for one domain (a picklable grain map)."""

    def __init__(self, domain_index: int):
        self.domain = np.int32(domain_index)

    def __call__(self, window: int) -> dict[str, np.ndarray]:
        return {"domain": self.domain, "window": np.int64(window)}


class _PoolPick(_Pick):
    """Index into a domain's pool -> ``{"domain", "window"}`` (``pools.pool_windows``)."""

    def __init__(self, domain_index: int, windows: np.ndarray):
        super().__init__(domain_index)
        self.windows = windows

    def __call__(self, index: int) -> dict[str, np.ndarray]:
        return {"domain": self.domain, "window": np.int64(self.windows[index])}


class MixtureIterator:
    """Endless batches mixing a dataset's domains by a schedule of weights; resumable.

    A batch holds the packed rows ``rows`` (increasing global row indices) of the global batch,
    or, without ``rows``, the block ``process_index`` of ``process_count`` equal blocks.

    ``get_state()`` is JSON-serialisable and does not depend on the rows packed (every process
    draws the whole global batch of picks), so one process's state serves all of them:
    ``set_state(state)`` on an iterator made with the same arguments (any rows or process split)
    continues with exactly the batches the original would have produced.
    """

    def __init__(
        self,
        dataset: TokenDataset,
        schedule: Schedule,
        *,
        seq_len: int,
        global_batch_size: int,
        seed: int,
        process_index: int = 0,
        process_count: int = 1,
        rows: Sequence[int] | None = None,
        unique_tokens: Mapping[str, int] | None = None,
    ):
        """``unique_tokens``: {domain: tokens} of data-constrained domains (``pools``): such a
        domain draws from its pool of ``tokens // seq_len`` windows, repeated epoch after epoch."""
        _check_positive_int("seq_len", seq_len)
        _check_positive_int("global_batch_size", global_batch_size)
        _check_seed(seed)
        self.dataset = dataset
        self.schedule = schedule
        self.seq_len, self.global_batch_size, self.seed = seq_len, global_batch_size, int(seed)
        self.rows = _rows_to_pack(global_batch_size, process_index, process_count, rows)
        # Domain ids of every row of the last *global* batch (all processes' rows, the same on
        # every process): per-domain token counts that need no communication.
        self.global_domains = np.zeros(0, np.int32)
        used = [d for d in dataset.domains if any(d in stage.weights for stage in schedule)]
        self._packers = {
            d: split_packer(dataset, d, "train", seq_len,
                       fix="give it more text, use a shorter train.seq_len, or weight it 0.")
            for d in used
        }
        self._pools = {d: pool_windows(self._packers[d].num_windows, n, seq_len, d)
                       for d, n in sorted((unique_tokens or {}).items()) if d in self._packers}
        self._made_with = {
            "data": dataset.content_hash,
            "domains": list(dataset.domains),
            "seq_len": seq_len,
            "global_batch_size": global_batch_size,
            "seed": self.seed,
        }
        if self._pools:  # recorded only when set: states of runs without pools stay as they were
            self._made_with["unique_tokens"] = {d: int(unique_tokens[d]) for d in self._pools}  # type: ignore[index]
        self._step = 0
        self._consumed = dict.fromkeys(used, 0)
        self._start_stage(0, self._consumed)

    def __iter__(self) -> MixtureIterator:
        return self

    def __next__(self) -> Example:
        picks = next(self._picks)
        self.global_domains = picks["domain"]
        domains, counts = np.unique(picks["domain"], return_counts=True)
        for d, n in zip(domains.tolist(), counts.tolist()):
            self._consumed[self.dataset.domains[d]] += n
        self._step += 1
        index = stage_index(self.schedule, self._step)
        if index != self._stage:  # The next batch is the first of a new stage.
            self._start_stage(index, self._consumed)
        return stack_examples([
            self._packers[self.dataset.domains[d]](w)
            for d, w in zip(picks["domain"][self.rows].tolist(), picks["window"][self.rows].tolist())
        ])

    @property
    def step(self) -> int:
        """Batches drawn so far."""
        return self._step

    def epochs(self) -> dict[str, float]:
        """Epochs drawn so far of every trained domain: windows drawn / windows of its pool (its
        whole train split when it has no pool)."""
        return {d: self._consumed[d] / self._windows(d) for d in self._consumed}

    def _windows(self, domain: str) -> int:
        pool = self._pools.get(domain)
        return len(pool) if pool is not None else self._packers[domain].num_windows

    def get_state(self) -> dict[str, Any]:
        """The position, as JSON-serialisable data."""
        stage = self.schedule[self._stage]
        return {
            "version": STATE_VERSION,
            "made_with": self._made_with,
            "step": self._step,
            "stage": self._stage,
            "stage_start": stage.start_step,
            "stage_weights": dict(stage.weights),
            "stage_offsets": dict(self._stage_offsets),
            "consumed": dict(self._consumed),
            "grain": self._picks.get_state(),
        }

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Continue from a state returned by ``get_state`` (possibly after a JSON round trip)."""
        if not isinstance(state, Mapping) or state.get("version") != STATE_VERSION:
            raise DataError(
                "the saved data-iterator state comes from another moejax data pipeline version "
                f"(state version {state.get('version') if isinstance(state, Mapping) else None!r}, "
                f"expected {STATE_VERSION}); resume with the code that wrote it or start a fresh workdir."
            )
        saved = state["made_with"]
        for key in ("domains", "seq_len", "global_batch_size", "seed", "unique_tokens"):
            if saved.get(key) != self._made_with.get(key):
                raise DataError(
                    f"the saved data-iterator state was made with {key}={saved.get(key)!r}, this run "
                    f"has {self._made_with.get(key)!r}; batches could not continue exactly. Resume "
                    "with the same data and train.seq_len/global_batch_size/seed, or start a fresh workdir."
                )
        if saved["data"] != self._made_with["data"]:
            warnings.warn(
                f"{self.dataset.info.description} differs from the data the saved iterator state "
                "was made with (content hash); continuing from the same position, but batches "
                "differ from an uninterrupted run.", DataStateWarning, stacklevel=2)
        step = int(state["step"])
        index = stage_index(self.schedule, step)
        if self.schedule[index] != Stage(state["stage_start"], state["stage_weights"]):
            raise DataError(
                f"the data schedule changed at or before step {step}: the saved state is in the "
                f"stage from step {state['stage_start']} with weights {state['stage_weights']}, "
                f"this run's stage there starts at step {self.schedule[index].start_step} with "
                f"weights {dict(self.schedule[index].weights)}. Only stages after the resume step "
                "may change."
            )
        # Domains new to later stages start at 0; domains no longer used are dropped.
        self._consumed = {d: int(state["consumed"].get(d, 0)) for d in self._consumed}
        self._start_stage(index, {**self._consumed, **state["stage_offsets"]})
        self._picks.set_state(state["grain"])
        self._step = step

    def _start_stage(self, index: int, offsets: Mapping[str, int]) -> None:
        """Build stage ``index``'s mixture; each domain starts ``offsets[domain]`` windows in."""
        stage = self.schedule[index]
        components = {
            domain: (
                grain.MapDataset.range(self._windows(domain))
                .shuffle(seed=shuffle_seed(self.seed, domain))
                .repeat()[int(offsets[domain]):]
                .map(_Pick(self.dataset.domains.index(domain)) if domain not in self._pools
                     else _PoolPick(self.dataset.domains.index(domain), self._pools[domain]))
                .to_iter_dataset(_READ_OPTIONS)
            )
            for domain in stage.weights
        }
        mixed = grain.IterDataset.mix(components, dict(stage.weights))
        self._picks = iter(mixed.batch(self.global_batch_size, drop_remainder=True))
        self._stage = index
        self._stage_offsets = {d: int(offsets[d]) for d in stage.weights}


def make_train_iterator(
    weights: Mapping[str, float] | Schedule,
    *,
    seq_len: int,
    global_batch_size: int,
    seed: int,
    dataset: TokenDataset | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    process_index: int = 0,
    process_count: int = 1,
    rows: Sequence[int] | None = None,
    unique_tokens: Mapping[str, int] | None = None,
) -> MixtureIterator:
    """An endless iterator of training batches mixing ``dataset``'s domains by ``weights``
    (``unique_tokens``: pools of data-constrained domains, see ``pools``).

    ``weights`` is a mapping domain -> weight (one stage) or a ``Schedule``. Without ``dataset``
    the built-in corpus (cached in ``cache_dir``) is used. With ``process_count > 1`` every
    process gets its block of rows of the global batch; ``rows`` names the rows explicitly.
    """
    info = dataset.info if dataset is not None else describe_dataset("")
    if isinstance(weights, Mapping):
        schedule = make_schedule([(0, weights)], info.domains, source="mixture",
                                 dataset=info.description)
    else:
        schedule = tuple(weights)
        for stage in schedule:
            for domain in stage.weights:
                info.check_domain(domain, f"the schedule stage at step {stage.start_step}")
    _check_positive_int("seq_len", seq_len)
    _check_positive_int("global_batch_size", global_batch_size)
    _check_seed(seed)
    dataset = dataset if dataset is not None else open_dataset("", cache_dir)
    return MixtureIterator(dataset, schedule, seq_len=seq_len, global_batch_size=global_batch_size,
                           seed=seed, process_index=process_index, process_count=process_count, rows=rows,
                           unique_tokens=unique_tokens)


EVAL_WINDOWS = ("sampled", "first")  # train.eval_windows
EVAL_WINDOW_SEED = 0  # sampled evaluation windows: the same for every run and seed (a fixed seed and the domain's name)


def make_eval_batches(
    domains: Iterable[str],
    *,
    seq_len: int,
    batch_size: int,
    batches_per_domain: int,
    dataset: TokenDataset | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    rows: Sequence[int] | None = None,
    windows: str = "sampled",
) -> dict[str, list[Example]]:
    """Fixed held-out batches per domain, the same for every run, seed and process count.

    ``windows`` (``train.eval_windows``): ``"sampled"``, windows drawn without replacement across
    the domain's whole held-out split (:func:`eval_window_indices`), so a few batches estimate the
    loss of all of it; ``"first"``, its first consecutive windows (the behaviour before the key).
    A domain gets ``batches_per_domain`` batches, or fewer if its held-out split is smaller (at
    least one; if it holds fewer than ``batch_size`` windows, the batch is filled up with padding
    examples whose loss mask is zero, so batch shapes never change). With ``rows`` (increasing
    indices into a batch) only those rows of every batch are packed: one process's share.
    """
    domains = list(domains)
    if not domains:
        raise DataError("domains must name at least one domain")
    if windows not in EVAL_WINDOWS:
        raise DataError(f"train.eval_windows {windows!r}; allowed: {' | '.join(EVAL_WINDOWS)}")
    info = dataset.info if dataset is not None else describe_dataset("")
    for domain in domains:
        info.check_domain(domain, "the evaluation")
    _check_positive_int("seq_len", seq_len)
    _check_positive_int("batch_size", batch_size)
    _check_positive_int("batches_per_domain", batches_per_domain)
    rows = _rows_to_pack(batch_size, 0, 1, rows)
    dataset = dataset if dataset is not None else open_dataset("", cache_dir)
    pad_id = dataset.tokenizer.pad_id
    batches = {}
    for domain in domains:
        packer = split_packer(
            dataset, domain, "heldout", seq_len,
            fix="use a shorter train.seq_len or prepare it with a larger --heldout-fraction.",
        )
        batches[domain] = fixed_batches(packer, batch_size, batches_per_domain, rows, pad_id, windows, domain)
    return batches


def eval_window_indices(num_windows: int, count: int, domain: str, windows: str = "sampled") -> np.ndarray:
    """The ``count`` held-out windows (of ``num_windows``) an evaluation reads: the first ``count``
    (``"first"``), or the first ``count`` of one fixed permutation of all of them, drawn by a
    generator seeded with ``EVAL_WINDOW_SEED`` and the domain's name (``"sampled"``; all of them when
    ``count >= num_windows``). Either way a smaller ``count`` reads a prefix of a larger one, so the
    first k batches of an evaluation of more batches are exactly an evaluation of k batches."""
    if windows == "first" or count >= num_windows:
        return np.arange(min(count, num_windows))
    rng = np.random.default_rng(shuffle_seed(EVAL_WINDOW_SEED, domain))
    return rng.permutation(num_windows)[:count]


def fixed_batches(packer: ShardedPacker, batch_size: int, batches: int, rows: np.ndarray, pad_id: int,
                  windows: str = "first", name: str = "") -> list[Example]:
    """``batches`` batches (fewer if the windows run out, at least one, padded) of the held-out
    windows :func:`eval_window_indices` picks from ``packer`` (the domain ``name``'s), rows ``rows``
    of each: what :func:`make_eval_batches` gives a domain."""
    num_batches = min(batches, max(1, packer.num_windows // batch_size))
    picked = eval_window_indices(packer.num_windows, num_batches * batch_size, name, windows)
    return [
        stack_examples([
            packer(int(picked[i])) if i < len(picked) else padding_example(packer.seq_len, packer.domain, pad_id)
            for i in (b * batch_size + rows).tolist()
        ])
        for b in range(num_batches)
    ]


def shuffle_seed(seed: int, domain: str) -> int:
    """A 32-bit shuffle seed for one domain, from the run seed and the domain *name* (stable when
    a dataset gains domains)."""
    name = int.from_bytes(hashlib.sha256(domain.encode()).digest()[:8], "little")
    return int(np.random.SeedSequence([seed, name]).generate_state(1)[0])


def split_packer(dataset: TokenDataset, domain: str, split: str, seq_len: int, *, fix: str) -> ShardedPacker:
    """Windows of one domain split; an error naming the split and ``fix`` if it has none."""
    packer = ShardedPacker(dataset.streams(domain, split), seq_len, dataset.domains.index(domain))
    if packer.num_windows == 0:
        name = "held-out" if split == "heldout" else split
        raise DataError(
            f"{name} split of domain {domain!r} in {dataset.info.description} has no window of "
            f"{seq_len + 1} tokens ({packer.num_tokens} tokens in {len(packer.packers)} shard(s)); {fix}"
        )
    return packer


def _rows_to_pack(
    batch_size: int, process_index: int, process_count: int, rows: Sequence[int] | None
) -> np.ndarray:
    """The batch rows one process packs: ``rows`` checked, or block ``process_index`` of
    ``process_count``; an error naming the bad value otherwise."""
    _check_positive_int("process_count", process_count)
    if isinstance(process_index, bool) or not isinstance(process_index, numbers.Integral) \
            or not 0 <= process_index < process_count:
        raise DataError(f"process_index must be an int in [0, {process_count}), got {process_index!r}")
    if rows is None:
        if batch_size % process_count:
            raise DataError(f"global_batch_size {batch_size} is not divisible by "
                            f"process_count {process_count}; every process takes an equal slice.")
        size = batch_size // process_count
        return np.arange(process_index * size, (process_index + 1) * size)
    if process_count != 1:
        raise DataError("pass either rows or process_index/process_count, not both")
    picked = np.asarray(rows)
    if picked.ndim != 1 or picked.size == 0 or picked.dtype.kind not in "iu" \
            or np.any(np.diff(picked) <= 0) or picked[0] < 0 or picked[-1] >= batch_size:
        raise DataError(f"rows must be increasing row indices in [0, {batch_size}) (the batch size), "
                        f"at least one; got {rows!r}")
    return picked.astype(np.int64)


def _check_positive_int(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise DataError(f"{name} must be a positive int, got {value!r}")


def _check_seed(seed: int) -> None:
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not 0 <= seed < 2**32:
        raise DataError(f"seed must be an int in [0, 2**32), got {seed!r}")
