"""Text generation from a checkpoint, with a key/value cache: greedy, temperature and top-p sampling.

    python -m moejax.generate --workdir runs/tiny_moe --prompt "Q: What is 12 + 30?
    A:" [--prompt ...] [--max-new-tokens 64 --temperature 0.8 --top-p 0.9 --seed 0 --step N]

The run is opened with :func:`moejax.load` (the checkpoint the evaluation reads: the newest
that reads, a damaged newer one reported in one notice); the text comes from its KV-cache
:class:`moejax.eval.generator.Generator` (how it decodes: that module). Greedy at temperature 0,
else sampled from the top-p nucleus, seeded.
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable, Sequence

import jax
import numpy as np

from moejax import paths
from moejax.errors import ConfigError
from moejax.eval.generator import length_bucket
from moejax.log import add_verbosity_flags
from moejax.model.transformer import DTYPES
from moejax.runner import run

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m moejax.generate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", required=True, type=paths.path_type, help="training run directory (holds checkpoints/)")
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

    from moejax.trained import load

    def generate() -> None:
        check_prompts(args.prompt)
        model = load(args.workdir, args.step)
        prompts = [model.tokenizer.encode(p) for p in args.prompt]
        if not args.beyond_context:
            check_context(prompts, args.max_new_tokens, model.max_len)
        check_memory(model.config, prompts, args.max_new_tokens, available_bytes(jax.devices()[0]))
        _generate(model, args, prompts)

    return run(generate, prog="moejax.generate", verbosity=args.verbosity, quiet_absl=True,
               interrupted="interrupted; nothing is saved by generation. Rerun the command.")


def check_prompts(prompts: Sequence[str]) -> None:
    """Refuses a prompt that is not valid UTF-8 text (the shell passed bytes of another encoding,
    which Python keeps as surrogates), naming the prompt, the byte and its position."""
    for number, prompt in enumerate(prompts, 1):
        try:
            prompt.encode("utf-8")
        except UnicodeEncodeError as e:
            byte = prompt.encode("utf-8", "surrogateescape")[len(prompt[:e.start].encode("utf-8"))]
            raise ConfigError(
                f"--prompt {number}: byte {byte:#04x} at position {e.start} is not valid UTF-8 (text in another "
                "encoding, such as Latin-1): the tokenizers read UTF-8. Convert the text first (for example "
                "iconv -f latin1 -t utf-8), or set the terminal to UTF-8.") from None


def check_context(prompts: Sequence[np.ndarray], max_new_tokens: int, seq_len: int) -> None:
    """Refuses prompts plus new tokens longer than the trained context, naming the fix."""
    longest = max(len(p) for p in prompts)
    if longest + max_new_tokens <= seq_len:
        return
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


def _generate(model, args, prompts: list) -> None:
    """Samples from ``model`` (a :class:`moejax.trained.TrainedModel`) and prints each prompt with
    its continuation (one prompt: streamed as the tokens are chosen)."""
    tokenizer, ckpt = model.tokenizer, model.checkpoint
    generator = model.generator(cache_len(prompts, args.max_new_tokens))
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
