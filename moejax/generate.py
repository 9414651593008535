"""Text generation from a checkpoint, with a key/value cache: greedy, temperature and top-p sampling.

    python -m moejax.generate --workdir runs/tiny_moe --prompt "Q: What is 12 + 30?
    A:" [--prompt ...] [--max-new-tokens 64 --temperature 0.8 --top-p 0.9 --seed 0 --step N]

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

import argparse
import sys
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import tqdm
from flax import nnx

from moejax.log import add_verbosity_flags
from moejax.model.balancing import Balancer
from moejax.model.decode import KVCache, init_cache, next_token
from moejax.model.transformer import DTYPES
from moejax.runner import run
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
    ):
        """New tokens per prompt (int32 arrays, ending at the first stop id, which is dropped).

        Generation stops early once every row has hit a stop id or satisfies ``done(new_ids)``.
        With ``return_logits`` also the logits [steps, B, V] each token was chosen from.
        Prompts are cut from the left so that prompt + new tokens fit the cache.
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
        out_sb, logits_sbv = [np.asarray(token_b)], [logits_bv]
        finished_b = np.zeros(len(prompts), bool)
        bar = tqdm.tqdm(total=max_new_tokens, unit="tok", disable=not progress, leave=False)
        bar.update(1)
        for i in range(1, max_new_tokens):
            finished_b |= self._finished(np.stack(out_sb, 1), stop_ids, done)
            if finished_b.all():
                break
            token_b, logits_bv, cache = self._step(
                params, balance, cache, token_b, jnp.asarray(lengths_b + i - 1), jax.random.fold_in(key, i),
                temperature_, top_p_,
            )
            out_sb.append(np.asarray(token_b))
            logits_sbv.append(logits_bv)
            bar.update(1)
        bar.close()
        new_bs = np.stack(out_sb, 1)
        rows = [_cut(row, stop_ids) for row in new_bs]
        return (rows, np.stack([np.asarray(x) for x in logits_sbv])) if return_logits else rows

    @staticmethod
    def _finished(new_bs: np.ndarray, stop_ids, done) -> np.ndarray:
        stopped_b = np.isin(new_bs, list(stop_ids)).any(axis=1)
        if done is not None:
            stopped_b |= np.array([done(_cut(row, stop_ids)) for row in new_bs])
        return stopped_b


def _cut(row: np.ndarray, stop_ids: Sequence[int]) -> np.ndarray:
    hits = np.flatnonzero(np.isin(row, list(stop_ids)))
    return row[: hits[0]] if hits.size else row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m moejax.generate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", required=True, help="training run directory (holds checkpoints/)")
    parser.add_argument("--prompt", action="append", required=True, help="prompt text; repeat for a batch")
    parser.add_argument("--step", type=int, default=None, help="checkpoint step (default: latest)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    parser.add_argument("--top-p", type=float, default=1.0, help="nucleus mass in (0, 1]")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--beyond-context", action="store_true",
                        help="generate past the context the model was trained on (train.seq_len); refused "
                             "by default, as positions past it were never trained")
    add_verbosity_flags(parser)
    args = parser.parse_args(argv)
    if args.temperature < 0 or not 0 < args.top_p <= 1:
        parser.error("--temperature must be >= 0 and --top-p in (0, 1]")
    if not all(args.prompt) or args.max_new_tokens < 1:
        parser.error("every --prompt needs some text, and --max-new-tokens must be positive")

    from moejax import paths
    from moejax.eval.restore import open_run

    def generate() -> None:
        erun = open_run(paths.user_path(args.workdir))
        ckpt = erun.load(args.step)
        prompts = [erun.tokenizer.encode(p) for p in args.prompt]
        if not args.beyond_context:
            check_context(prompts, args.max_new_tokens, erun.cfg.train.seq_len)
        _generate(erun, ckpt, args, prompts)

    return run(generate, prog="moejax.generate", verbosity=args.verbosity, quiet_absl=True,
               interrupted="interrupted; nothing is saved by generation. Rerun the command.")


def check_context(prompts: Sequence[np.ndarray], max_new_tokens: int, seq_len: int) -> None:
    """Refuses prompts plus new tokens longer than the trained context, naming the fix."""
    longest = max(len(p) for p in prompts)
    if longest + max_new_tokens <= seq_len:
        return
    from moejax.errors import ConfigError

    room = seq_len - longest
    fix = (f"use --max-new-tokens {room} or fewer" if room > 0 else "shorten the prompt")
    raise ConfigError(
        f"--max-new-tokens {max_new_tokens} with a prompt of {longest} tokens needs {longest + max_new_tokens} "
        f"positions, past the {seq_len} the model was trained on (train.seq_len): the text past them is "
        f"untrained. {fix[0].upper() + fix[1:]}, or pass --beyond-context to generate anyway.")


def _generate(erun, ckpt, args, prompts: list) -> None:
    """Samples from ``ckpt`` and prints each prompt with its continuation."""
    tokenizer = erun.tokenizer
    max_len = length_bucket(max(len(p) for p in prompts), 1 << 30) + args.max_new_tokens
    generator = Generator(erun.run, erun.cfg, max_len=max_len, balancer=erun.run.balancer,
                          num_tokens=tokenizer.vocab_size)
    rows = generator.generate(
        ckpt.params, ckpt.balance, prompts, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
        top_p=args.top_p, seed=args.seed, stop_ids=(tokenizer.eos_id,), progress=sys.stderr.isatty(),
    )
    for prompt, row in zip(args.prompt, rows):
        print(f"--- step {ckpt.step}, {len(row)} new tokens\n{prompt}{tokenizer.decode(row)}")


if __name__ == "__main__":
    main()
