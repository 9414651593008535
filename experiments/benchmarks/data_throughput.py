"""Data throughput: how fast ``prepare`` tokenizes, and the tokens/s the pipeline delivers.

    python experiments/benchmarks/data_throughput.py [--out results/data_throughput.json]
        [--dataset DIR] [--tokenizer byte|bpe] [--workers N] [--skip-prepare]

Two pipelines are timed with the uniform mixture over their domains (global batch 16, seq 256
by default): the built-in corpus, and a prepared dataset. Unless ``--dataset`` names one, the
prepared dataset is made here: the built-in corpus's train split is written as text files (one
per document, once, under the cache dir) and ``prepare`` tokenizes them into a fresh directory
with ``--tokenizer``; its input MB/s (and the BPE training time) is reported.

For each pipeline, the dataset is opened and the iterator made before timing, the first
``--warmup`` batches are timed apart (``first_batch_s``, ``warmup_s``: where the first read of
each shard is checked against its manifest's checksum, ``moejax.data.shard_check``), then
``--rounds`` rounds of ``--batches`` batches are timed and the median round is reported.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from experiments.benchmarks.timing import write_json
from moejax.data.corpus import DOMAINS, default_cache_dir
from moejax.data.dataset import open_dataset
from moejax.data.export import export_corpus
from moejax.data.pipeline import make_train_iterator
from moejax.data.prepare import MB, prepare_dataset


def measure_pipeline(
    path: str, *, seq_len: int, batch_size: int, warmup: int, batches: int, rounds: int,
    cache_dir: str,
) -> dict:
    """Time the pipeline over the dataset at ``path`` ("" = built-in corpus)."""
    start = time.perf_counter()
    dataset = open_dataset(path, cache_dir)
    open_s = time.perf_counter() - start
    mixture = {domain: 1.0 / len(dataset.domains) for domain in dataset.domains}
    start = time.perf_counter()
    iterator = make_train_iterator(mixture, seq_len=seq_len, global_batch_size=batch_size, seed=0,
                                   dataset=dataset)
    make_s = time.perf_counter() - start
    start = time.perf_counter()
    first_batch_s = 0.0
    for i in range(warmup):
        next(iterator)
        if i == 0:
            first_batch_s = time.perf_counter() - start
    warmup_s = time.perf_counter() - start
    round_tokens_per_s = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(batches):
            next(iterator)
        round_tokens_per_s.append(batches * batch_size * seq_len / (time.perf_counter() - start))
    return {
        "dataset": path or "built-in corpus",
        "tokenizer": dataset.tokenizer.name,
        "tokens_per_s": statistics.median(round_tokens_per_s),
        "round_tokens_per_s": round_tokens_per_s,
        "mixture": mixture,
        "open_or_build_s": open_s,
        "make_iterator_s": make_s,
        "first_batch_s": first_batch_s,
        "warmup_s": warmup_s,
    }


def prepare_builtin_text(cache_dir: str, out: str, tokenizer: str, workers: int | None) -> dict:
    """Export the built-in corpus as text files (cached) and time ``prepare`` on them."""
    text_dir = Path(cache_dir) / "builtin-text-train"
    if not (text_dir / ".complete").is_file():
        shutil.rmtree(text_dir, ignore_errors=True)
        export_corpus(text_dir, fmt="txt", split="train")
        (text_dir / ".complete").touch()
    shutil.rmtree(out, ignore_errors=True)
    summary = prepare_dataset([f"{d}={text_dir / d}" for d in DOMAINS], out, tokenizer=tokenizer,
                              workers=workers, progress=False)
    return {
        "source": f"{text_dir} (built-in corpus train split, one .txt file per document)",
        "files": sum(1 for _ in text_dir.rglob("*.txt")),
        "input_mb": summary["input_bytes"] / MB,
        "seconds": summary["seconds"],
        "mb_per_s": summary["input_bytes"] / MB / summary["seconds"],
        "bpe_train_s": summary["bpe_train_s"],
        "tokenizer": summary["tokenizer"],
        "tokens": sum(s["tokens"] for splits in summary["domains"].values() for s in splits.values()),
        "workers": summary["workers"],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", default="results/data_throughput.json")
    parser.add_argument("--dataset", default="", help="a prepared dataset to time (default: make one)")
    parser.add_argument("--tokenizer", choices=("byte", "bpe"), default="byte")
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--batches", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cache-dir", default=None, help="default: $MOEJAX_CACHE or ~/.cache/moejax")
    args = parser.parse_args(argv)
    cache_dir = args.cache_dir or default_cache_dir()
    timing = dict(seq_len=args.seq_len, batch_size=args.batch_size, warmup=args.warmup,
                  batches=args.batches, rounds=args.rounds, cache_dir=cache_dir)

    result = {"seq_len": args.seq_len, "global_batch_size": args.batch_size,
              "warmup_batches": args.warmup, "batches_per_round": args.batches,
              "cpu_count": os.cpu_count(), "python": platform.python_version()}
    result["builtin"] = measure_pipeline("", **timing)
    print(f"built-in corpus:  {result['builtin']['tokens_per_s']:>12,.0f} tokens/s; open "
          f"{result['builtin']['open_or_build_s']:.2f} s, first {args.warmup} batches {result['builtin']['warmup_s']:.2f} s")
    with tempfile.TemporaryDirectory(prefix="moejax-bench-") as tmp:
        dataset = args.dataset
        if not dataset:
            dataset = os.path.join(tmp, f"prepared-{args.tokenizer}")
            result["prepare"] = prepare_builtin_text(cache_dir, dataset, args.tokenizer, args.workers)
            p = result["prepare"]
            print(f"prepare ({p['tokenizer']}, workers: {p['workers']}): {p['input_mb']:.1f} MB of "
                  f"{p['files']:,} files in {p['seconds']:.1f} s = {p['mb_per_s']:.1f} MB/s"
                  + (f" (BPE training {p['bpe_train_s']:.1f} s)" if p["bpe_train_s"] else ""))
        result["prepared"] = measure_pipeline(dataset, **timing)
    print(f"prepared dataset: {result['prepared']['tokens_per_s']:>12,.0f} tokens/s "
          f"({result['prepared']['tokenizer']}); open {result['prepared']['open_or_build_s']:.2f} s, first "
          f"{args.warmup} batches {result['prepared']['warmup_s']:.2f} s")
    write_json(args.out, result)


if __name__ == "__main__":
    main()
