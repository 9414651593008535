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
        check_memory(erun.cfg, prompts, args.max_new_tokens, available_bytes(jax.devices()[0]))
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


# Of the memory a device reports free, generation may plan to use this share (the rest: the
# compiled steps' temporaries, the runtime, other processes).
MEMORY_SHARE = 0.8


def cache_len(prompts: Sequence[np.ndarray], max_new_tokens: int) -> int:
    """Positions per row of the key/value cache: the prompt's length bucket plus the new tokens."""
    return length_bucket(max(len(p) for p in prompts), 1 << 30) + max_new_tokens


def memory_bytes(cfg, batch: int, max_len: int, max_new_tokens: int) -> int:
    """What generation allocates beyond the parameters: the key/value cache (keys and values of
    every layer, ``max_len`` positions per row, in the compute dtype) and the new ids (int32)."""
    m = cfg.model
    itemsize = np.dtype(DTYPES[cfg.train.compute_dtype]).itemsize
    return 2 * m.num_layers * batch * max_len * m.num_kv_heads * m.head_dim * itemsize + 4 * batch * max_new_tokens


def available_bytes(device) -> int | None:
    """Free memory of ``device``: the accelerator's own (its memory_stats), the host's for a CPU
    (MemAvailable); None when it cannot be told."""
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    if stats and stats.get("bytes_limit"):
        return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def check_memory(cfg, prompts: Sequence[np.ndarray], max_new_tokens: int, available: int | None) -> None:
    """Refuses ``--max-new-tokens`` whose cache would not fit ``MEMORY_SHARE`` of ``available``
    bytes, before anything is allocated, naming the most that fits."""
    if available is None:
        return
    need = memory_bytes(cfg, len(prompts), cache_len(prompts, max_new_tokens), max_new_tokens)
    budget = int(available * MEMORY_SHARE)
    if need <= budget:
        return
    from moejax.errors import ConfigError

    per_token = memory_bytes(cfg, len(prompts), 1, 1)
    fits = max(0, (budget - memory_bytes(cfg, len(prompts), cache_len(prompts, 0), 0)) // per_token)
    raise ConfigError(
        f"--max-new-tokens {max_new_tokens:,} needs about {need / 2**30:.1f} GiB (the key/value cache of "
        f"{cache_len(prompts, max_new_tokens):,} positions for {len(prompts)} prompt(s)), more than the "
        f"{budget / 2**30:.1f} GiB generation may use ({MEMORY_SHARE:.0%} of the {available / 2**30:.1f} GiB free "
        f"on {jax.devices()[0].platform}). Use --max-new-tokens {fits:,} or fewer"
        + (", or fewer prompts." if len(prompts) > 1 else "."))


class TextStream:
    """Prints one row's new tokens as they are chosen. Ids are decoded in short windows that end
    after whitespace, so a character split over several byte tokens is printed once complete and
    decoding stays cheap however long the text grows."""

    def __init__(self, tokenizer, stop_ids: Sequence[int], write: Callable[[str], object] | None = None):
        self.tokenizer, self.stop_ids = tokenizer, set(stop_ids)
        self.write = write or (lambda text: (sys.stdout.write(text), sys.stdout.flush()))
        self.ids: list[int] = []
        self.printed = 0
        self.stopped = False

    def __call__(self, token_b: np.ndarray) -> None:
        token = int(token_b[0])
        if self.stopped or token in self.stop_ids:
            self.stopped = True
            return
        self.ids.append(token)
        text = self.tokenizer.decode(np.asarray(self.ids, np.int32))
        if text.endswith("\ufffd") and len(self.ids) < 8:
            return  # the rest of a character is still to come
        self.write(text[self.printed:])
        if text[-1:].isspace() or len(self.ids) >= 64:
            self.ids, self.printed = [], 0
        else:
            self.printed = len(text)


def _generate(erun, ckpt, args, prompts: list) -> None:
    """Samples from ``ckpt`` and prints each prompt with its continuation (one prompt: streamed as
    the tokens are chosen)."""
    tokenizer = erun.tokenizer
    generator = Generator(erun.run, erun.cfg, max_len=cache_len(prompts, args.max_new_tokens),
                          balancer=erun.run.balancer, num_tokens=tokenizer.vocab_size)
    stream = TextStream(tokenizer, (tokenizer.eos_id,)) if len(prompts) == 1 else None
    if stream is not None:
        print(f"--- step {ckpt.step}\n{args.prompt[0]}", end="", flush=True)
    rows = generator.generate(
        ckpt.params, ckpt.balance, prompts, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
        top_p=args.top_p, seed=args.seed, stop_ids=(tokenizer.eos_id,), progress=sys.stderr.isatty() and stream is None,
        on_token=stream,
    )
    if stream is not None:
        print(f"\n--- {len(rows[0])} new tokens")
        return
    for prompt, row in zip(args.prompt, rows):
        print(f"--- step {ckpt.step}, {len(row)} new tokens\n{prompt}{tokenizer.decode(row)}")


if __name__ == "__main__":
    main()
