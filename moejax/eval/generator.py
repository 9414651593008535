"""The KV-cache generator: batched greedy, temperature and top-p decoding of a restored run
(used by ``python -m moejax.generate``, the evaluation's exact match, ``moejax.load`` and lm-eval).

How it runs (:class:`Generator`): the prompts of a batch are right-padded to a length bucket (a
power of two, so a handful of compiles serve every prompt) and *prefilled* in one pass that writes
every layer's keys and values into a fixed-size cache [layers, B, max_len, kv_heads, head_dim]
(:mod:`moejax.model.decode`). Then a jitted one-token step runs in a Python loop: it reads the
cache, writes one position per row and picks the next token. The cache and all step inputs keep
their shapes, so the step compiles once and each token costs one small forward over the cache
instead of a forward over the whole sequence. Sampling is seeded: token ``i`` draws with
``fold_in(key(seed), i)``, so the same seed gives the same text.

Temperature 0 is greedy (argmax); otherwise logits are divided by the temperature and sampling is
restricted to the top-p nucleus (the most probable tokens whose mass first reaches ``top_p``).
"""

from __future__ import annotations

from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import tqdm
from flax import nnx

from moejax.model.balancing import Balancer
from moejax.model.decode import KVCache, init_cache, next_token
from moejax.model.transformer import DTYPES
from moejax.train.state import Run


def length_bucket(n: int, cap: int, smallest: int = 16) -> int:
    """The smallest power of two >= n (at least ``smallest``), or ``cap``: few distinct shapes."""
    bucket = smallest
    while bucket < n:
        bucket *= 2
    return min(bucket, cap)


class Generator:
    """Batched generation over one fixed-size cache of ``max_len`` positions per row.

    ``balancer`` (static) with the ``balance`` state passed to :meth:`generate` routes as training
    did (e.g. the loss-free selection bias) or with extra selection biases (expert pruning).
    ``num_tokens``: the tokenizer's vocabulary; ids past it (embedding rows no token uses, as when
    ``model.vocab_size`` is rounded up) are never chosen, so every new id decodes.
    """

    def __init__(self, run: Run, cfg, *, max_len: int, balancer: Balancer | None = None,
                 num_tokens: int | None = None):
        self.max_len = max_len
        self._num_tokens = num_tokens
        self._graphdef = run.graphdef
        self._balancer = balancer
        self._model_cfg = cfg.model
        self._dtype = DTYPES[cfg.train.compute_dtype]
        self._prefill = jax.jit(self._prefill_fn)
        self._step = jax.jit(self._step_fn, donate_argnums=2)

    def _forward(self, params, balance, tokens_bt, cache, index_b):
        return nnx.merge(self._graphdef, params).decode(
            tokens_bt, cache, index_b, balancer=self._balancer if balance else None, balance_state=balance
        )

    def _prefill_fn(self, params, balance, tokens_bp, lengths_b, key, temperature, top_p):
        cache = init_cache(self._model_cfg, tokens_bp.shape[0], self.max_len, self._dtype)
        logits_bpv, cache = self._forward(params, balance, tokens_bp, cache, jnp.zeros_like(lengths_b))
        last_bv = self._allowed(jnp.take_along_axis(logits_bpv, (lengths_b - 1)[:, None, None], axis=1)[:, 0])
        return next_token(last_bv, key, temperature, top_p), last_bv, cache

    def _step_fn(self, params, balance, cache: KVCache, token_b, index_b, key, temperature, top_p):
        logits_b1v, cache = self._forward(params, balance, token_b[:, None], cache, index_b)
        logits_bv = self._allowed(logits_b1v[:, 0])
        return next_token(logits_bv, key, temperature, top_p), logits_bv, cache

    def trace(self, params, balance, batch: int, prompt_len: int) -> dict:
        """The prefill and the one-token step, traced (not run) for ``batch`` rows of prompts of
        ``prompt_len`` tokens: ``{"prefill": Traced, "decode": Traced}``. ``params`` and ``balance``
        may be ``jax.ShapeDtypeStruct`` trees (with shardings); lower the results with
        ``.lower(lowering_platforms=(...))`` to check another platform's lowering
        (experiments/tools/lower_check.py)."""
        i32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.int32)
        key = jax.eval_shape(lambda: jax.random.key(0))
        scalar = jax.ShapeDtypeStruct((), jnp.float32)
        cache = jax.eval_shape(lambda: init_cache(self._model_cfg, batch, self.max_len, self._dtype))
        return {
            "prefill": self._prefill.trace(params, balance, i32(batch, prompt_len), i32(batch), key, scalar, scalar),
            "decode": self._step.trace(params, balance, cache, i32(batch), i32(batch), key, scalar, scalar),
        }

    def _allowed(self, logits_bv):
        """Logits with the ids past the tokenizer's vocabulary at -inf."""
        if self._num_tokens is None or self._num_tokens >= logits_bv.shape[-1]:
            return logits_bv
        return jnp.where(jnp.arange(logits_bv.shape[-1]) < self._num_tokens, logits_bv, -jnp.inf)

    def generate(
        self,
        params,
        balance: dict,
        prompts: Sequence[np.ndarray],
        *,
        max_new_tokens: int,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int = 0,
        stop_ids: Sequence[int] = (),
        done: Callable[[np.ndarray], bool] | None = None,
        return_logits: bool = False,
        progress: bool = False,
        on_token: Callable[[np.ndarray], None] | None = None,
    ):
        """New tokens per prompt (int32 arrays, ending at the first stop id, which is dropped).

        Generation stops early once every row has hit a stop id or satisfies ``done(new_ids)``.
        With ``return_logits`` also the logits [steps, B, V] each token was chosen from (kept only
        then). ``on_token(token_b)`` is called with every new token of every row as it is chosen
        (to stream the text). Prompts are cut from the left so that prompt + new tokens fit the cache.
        """
        if not 0 < max_new_tokens < self.max_len:
            raise ValueError(f"max_new_tokens must be in [1, {self.max_len - 1}] (cache length {self.max_len})")
        room = self.max_len - max_new_tokens
        prompts = [np.asarray(p, np.int32)[-room:] for p in prompts]
        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        lengths_b = np.array([len(p) for p in prompts], np.int32)
        width = length_bucket(int(lengths_b.max()), room)
        tokens_bp = np.zeros((len(prompts), width), np.int32)
        for row, p in enumerate(prompts):
            tokens_bp[row, : len(p)] = p
        key = jax.random.key(seed)
        temperature_, top_p_ = jnp.float32(temperature), jnp.float32(top_p)
        token_b, logits_bv, cache = self._prefill(
            params, balance, tokens_bp, lengths_b, jax.random.fold_in(key, 0), temperature_, top_p_
        )
        new_bs = np.zeros((len(prompts), max_new_tokens), np.int32)  # host memory: no growth per token
        new_bs[:, 0] = np.asarray(token_b)
        logits_sbv = [logits_bv] if return_logits else []
        if on_token is not None:
            on_token(new_bs[:, 0])
        stop_list = list(stop_ids)
        finished_b = np.zeros(len(prompts), bool)
        bar = tqdm.tqdm(total=max_new_tokens, unit="tok", disable=not progress, leave=False)
        bar.update(1)
        count = 1
        for i in range(1, max_new_tokens):
            finished_b |= np.isin(new_bs[:, i - 1], stop_list)
            if done is not None:
                finished_b |= np.array([done(_cut(row, stop_ids)) for row in new_bs[:, :i]])
            if finished_b.all():
                break
            token_b, logits_bv, cache = self._step(
                params, balance, cache, token_b, jnp.asarray(lengths_b + i - 1), jax.random.fold_in(key, i),
                temperature_, top_p_,
            )
            new_bs[:, i] = np.asarray(token_b)
            count = i + 1
            if return_logits:
                logits_sbv.append(logits_bv)
            if on_token is not None:
                on_token(new_bs[:, i])
            bar.update(1)
        bar.close()
        new_bs = new_bs[:, :count]
        rows = [_cut(row, stop_ids) for row in new_bs]
        return (rows, np.stack([np.asarray(x) for x in logits_sbv])) if return_logits else rows


def _cut(row: np.ndarray, stop_ids: Sequence[int]) -> np.ndarray:
    hits = np.flatnonzero(np.isin(row, list(stop_ids)))
    return row[: hits[0]] if hits.size else row
