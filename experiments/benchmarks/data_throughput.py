"""Data-pipeline throughput: tokens/s delivered by ``make_train_iterator``.

    python experiments/benchmarks/data_throughput.py [--out results/data_throughput.json]

Uses the uniform mixture over all built-in domains (global batch 16, seq 256 by default). The
corpus cache is loaded (or built, on first use) before timing; the first ``--warmup`` batches
are not timed. Then ``--rounds`` rounds of ``--batches`` batches are timed and the median
round is reported. The JSON also records how long loading the corpus and making the iterator
took.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

from moejax.data.corpus import DOMAINS, default_cache_dir, load_tokenized_corpus
from moejax.data.pipeline import make_train_iterator


def measure(
    *, seq_len: int, batch_size: int, warmup: int, batches: int, rounds: int, cache_dir: str
) -> dict:
    """Time the pipeline; returns the figures written to the JSON file."""
    mixture = {domain: 1.0 for domain in DOMAINS}
    start = time.perf_counter()
    load_tokenized_corpus(0, cache_dir)
    corpus_s = time.perf_counter() - start

    start = time.perf_counter()
    iterator = make_train_iterator(
        mixture, seq_len=seq_len, global_batch_size=batch_size, seed=0, cache_dir=cache_dir
    )
    make_s = time.perf_counter() - start

    for _ in range(warmup):
        next(iterator)
    round_tokens_per_s = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(batches):
            next(iterator)
        round_tokens_per_s.append(batches * batch_size * seq_len / (time.perf_counter() - start))
    return {
        "tokens_per_s": statistics.median(round_tokens_per_s),
        "round_tokens_per_s": round_tokens_per_s,
        "seq_len": seq_len,
        "global_batch_size": batch_size,
        "mixture": mixture,
        "warmup_batches": warmup,
        "batches_per_round": batches,
        "corpus_load_or_build_s": corpus_s,
        "make_iterator_s": make_s,
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", default="results/data_throughput.json")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--batches", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cache-dir", default=None, help="default: $MOEJAX_CACHE or ~/.cache/moejax")
    args = parser.parse_args(argv)

    result = measure(
        seq_len=args.seq_len,
        batch_size=args.batch_size,
        warmup=args.warmup,
        batches=args.batches,
        rounds=args.rounds,
        cache_dir=args.cache_dir or default_cache_dir(),
    )
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2)
    print(
        f"data pipeline: {result['tokens_per_s']:,.0f} tokens/s "
        f"(global batch {args.batch_size}, seq {args.seq_len}); wrote {args.out}"
    )


if __name__ == "__main__":
    main()
