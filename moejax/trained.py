"""A trained checkpoint as a Python object: ``moejax.load(workdir, step=None)``.

    import moejax
    model = moejax.load("runs/tiny_moe")             # the latest checkpoint; step=N for another
    model.tokenizer.encode("def f(x):")               # the run's own tokenizer
    model.logits(ids)                                 # [T, V] next-token logits (or [B, T, V] for a batch)
    model.loss(["some text", "more text"])            # mean nats per token of each text
    model.generate("Q: What is 2 + 3?\\nA:", max_new_tokens=8)
    model.config.model.num_layers, model.step

The run is opened as ``python -m moejax.eval`` opens it (:func:`moejax.eval.restore.open_run`: the
config the checkpoint was trained with, the dataset's tokenizer, the model on the local devices)
and only the parameters and the balancing state are read. Scoring uses the evaluation's jitted
forward (:class:`moejax.eval.forward.Scorer`), generation the KV-cache
:class:`moejax.eval.generator.Generator`, both built by the opened run (``EvalRun.scorer``,
``EvalRun.generator``) as the evaluation and ``python -m moejax.generate`` build them, so what this object computes is what the evaluation and the
lm-eval adapter (which is built on it) compute. Each new input width compiles once (widths are
rounded up to a power of two, so a handful of compiles serve every input).

Errors (a workdir without checkpoints, a step it lacks, a sequence past the trained context) are
``moejax.errors.ConfigError`` with the fix.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from moejax.errors import ConfigError
from moejax.eval.forward import Scorer
from moejax.eval.generator import Generator, length_bucket
from moejax.eval.harness import pack_rows
from moejax.eval.restore import Checkpoint, EvalRun, open_run
from moejax.train.state import to_global


def load(workdir: str | os.PathLike[str], step: int | None = None, *, batch_size: int = 8) -> TrainedModel:
    """The checkpoint of ``workdir`` at ``step`` (default: the latest) as a :class:`TrainedModel`.

    ``batch_size``: rows per forward when scoring many sequences (rounded up to the number of
    devices a batch is split over)."""
    from absl import logging as absl_logging

    from moejax import paths

    absl_logging.set_verbosity(absl_logging.ERROR)  # orbax's notes on the items a params-only read skips
    erun = open_run(paths.user_path(os.fspath(workdir)))
    return TrainedModel(erun, erun.load(step), batch_size=batch_size)


class TrainedModel:
    """One checkpoint of a training run, ready to score and to generate (see the module docstring)."""

    def __init__(self, erun: EvalRun, checkpoint: Checkpoint, *, batch_size: int = 8):
        self.erun = erun
        self.checkpoint = checkpoint
        shards = erun.batch_shards
        self.batch_size = -(-max(1, batch_size) // shards) * shards
        self._scorer: Scorer | None = None
        self._generators: dict[int, Generator] = {}

    # -- what the run is ---------------------------------------------------------------------------

    @property
    def tokenizer(self):
        """The run's tokenizer (``encode``, ``decode``, ``eos_id``, ``vocab_size``, ``name``)."""
        return self.erun.tokenizer

    @property
    def config(self):
        """The config the checkpoint was trained with (an ``ml_collections.ConfigDict``)."""
        return self.erun.cfg

    @property
    def step(self) -> int:
        return self.checkpoint.step

    @property
    def workdir(self) -> str:
        return self.erun.workdir

    @property
    def max_len(self) -> int:
        """The context the model was trained on (``train.seq_len``)."""
        return int(self.erun.cfg.train.seq_len)

    def __repr__(self) -> str:
        return f"TrainedModel({self.workdir!r}, step={self.step}, tokenizer={self.tokenizer.name!r})"

    # -- the shared machinery (the evaluation's forward, the KV-cache generator) ------------------

    @property
    def scorer(self) -> Scorer:
        """The jitted scoring forward: per-row summed log-probabilities of the scored targets."""
        if self._scorer is None:
            self._scorer = self.erun.scorer()
        return self._scorer

    def generator(self, max_len: int | None = None) -> Generator:
        """The KV-cache generator over ``max_len`` positions (default: the trained context)."""
        max_len = self.max_len if max_len is None else max_len
        if max_len not in self._generators:
            self._generators[max_len] = self.erun.generator(max_len)
        return self._generators[max_len]

    # -- the API -------------------------------------------------------------------------------

    def encode(self, text_or_ids: str | Sequence[int] | np.ndarray) -> np.ndarray:
        """Token ids of a text (the run's tokenizer, no special tokens added), or ids as given."""
        if isinstance(text_or_ids, str):
            return np.asarray(self.tokenizer.encode(text_or_ids), np.int32)
        return np.asarray(text_or_ids, np.int32).reshape(-1)

    def logits(self, token_ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """Next-token logits, float32: ``[T, V]`` for one sequence of T ids, ``[B, T, V]`` for a
        batch (a 2-D array or a list of equally long sequences). Row t predicts token t + 1.
        Sequences longer than the trained context are refused. V is ``model.vocab_size`` (rows past
        the tokenizer's vocabulary are embedding padding)."""
        ids = np.asarray(token_ids, np.int32)
        single = ids.ndim == 1
        ids_bt = ids[None] if single else ids
        if ids_bt.ndim != 2 or ids_bt.shape[1] == 0:
            raise ConfigError(f"logits: token_ids has shape {ids.shape}; allowed: [T] or [B, T] ids with T >= 1.")
        self._check_length(ids_bt.shape[1], "logits")
        width = length_bucket(ids_bt.shape[1], self.max_len)
        out = []
        for start in range(0, len(ids_bt), self.batch_size):
            chunk = ids_bt[start : start + self.batch_size]
            batch = pack_rows([(np.append(row, 0), 0) for row in chunk], width, self.batch_size)
            logits_btv = self._logits_fn(self.checkpoint.params, self.checkpoint.balance, batch)
            out.append(logits_btv[: len(chunk), : ids_bt.shape[1]])
        logits = np.concatenate(out)
        return logits[0] if single else logits

    def loss(self, texts: str | Sequence[int] | np.ndarray | Sequence[str | Sequence[int] | np.ndarray]):
        """Mean negative log-likelihood in nats per token of a text or id sequence (a float), or of
        each of a list of them (a list). Each is read as training reads a document: after EOS (the
        previous document's end) and followed by EOS, in windows of the trained context, every
        token predicted once."""
        one = isinstance(texts, str) or (not isinstance(texts, (list, tuple))) or (
            len(texts) > 0 and isinstance(texts[0], (int, np.integer)))
        items = [texts] if one else list(texts)
        eos = self.tokenizer.eos_id
        rows, owner = [], []
        for index, item in enumerate(items):
            ids = np.concatenate([[eos], self.encode(item), [eos]]).astype(np.int32)
            for start in range(0, len(ids) - 1, self.max_len):  # window w predicts ids[start+1 : start+L+1]
                window = ids[start : start + self.max_len + 1]
                rows.append((window, len(window) - 1))
                owner.append(index)
        logprob = self._score_rows(rows)
        tokens = np.array([n for _, n in rows], float)
        owner_r = np.asarray(owner)
        losses = [float(-logprob[owner_r == i].sum() / tokens[owner_r == i].sum()) for i in range(len(items))]
        return losses[0] if one else losses

    def generate(self, prompt: str | Sequence[str], *, max_new_tokens: int = 64, temperature: float = 0.0,
                 top_p: float = 1.0, seed: int = 0, stop_at_eos: bool = True):
        """The continuation of ``prompt`` (a string, or a list of strings: a list of continuations):
        greedy at temperature 0, else sampled from the top-p nucleus, seeded. Stops at EOS (unless
        ``stop_at_eos=False``) or after ``max_new_tokens``; the prompt plus the new tokens must fit the
        trained context."""
        prompts = [prompt] if isinstance(prompt, str) else list(prompt)
        ids = [self.encode(p) if len(p) else np.array([self.tokenizer.eos_id], np.int32) for p in prompts]
        if max_new_tokens < 1:
            raise ConfigError(f"generate: max_new_tokens={max_new_tokens}; allowed: at least 1.")
        self._check_length(max(len(p) for p in ids) + max_new_tokens, "generate (prompt + max_new_tokens)")
        max_len = length_bucket(max(len(p) for p in ids), 1 << 30) + max_new_tokens
        rows = self.generator(max_len).generate(
            self.checkpoint.params, self.checkpoint.balance, ids, max_new_tokens=max_new_tokens,
            temperature=temperature, top_p=top_p, seed=seed,
            stop_ids=(self.tokenizer.eos_id,) if stop_at_eos else (),
        )
        texts = [self.tokenizer.decode(row) for row in rows]
        return texts[0] if isinstance(prompt, str) else texts

    # -- helpers -------------------------------------------------------------------------------

    def _check_length(self, length: int, what: str) -> None:
        if length > self.max_len:
            raise ConfigError(f"{what}: {length} positions, past the {self.max_len} the model was trained on "
                              "(train.seq_len); shorten the input.")

    def _score_rows(self, rows: list[tuple[np.ndarray, int]]) -> np.ndarray:
        """Summed log-probability of each row's scored targets, in batches of one width each."""
        logprob = np.zeros(len(rows))
        by_width: dict[int, list[int]] = {}
        for index in sorted(range(len(rows)), key=lambda i: len(rows[i][0])):
            by_width.setdefault(length_bucket(len(rows[index][0]) - 1, self.max_len), []).append(index)
        for width, group in by_width.items():
            for start in range(0, len(group), self.batch_size):
                chunk = group[start : start + self.batch_size]
                out = self.scorer(self.checkpoint.params, self.checkpoint.balance,
                                  pack_rows([rows[i] for i in chunk], width, self.batch_size))
                logprob[chunk] = out["logprob_b"][: len(chunk)]
        return logprob

    @functools.cached_property
    def _logits_jit(self):
        run = self.erun.run
        sharding = run.batch_sharding(accum=False)
        balancer = run.balancer

        def forward(params, balance, batch):
            model = nnx.merge(run.graphdef, params)
            logits_btv, _ = model(batch["inputs"], batch["positions"], batch["segment_ids"],
                                  balancer=balancer if balance else None, balance_state=balance)
            return logits_btv.astype(np.float32)

        return sharding, jax.jit(forward, in_shardings=(run.state_shardings["params"], NamedSharding(run.mesh, P()),
                                                        sharding), out_shardings=NamedSharding(run.mesh, P()))

    def _logits_fn(self, params, balance, batch: dict[str, Any]) -> np.ndarray:
        sharding, jitted = self._logits_jit
        with jax.set_mesh(self.erun.run.mesh):
            out = jitted(params, balance, to_global(batch, sharding, None))
        return np.asarray(jax.device_get(out))
