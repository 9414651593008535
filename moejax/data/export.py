"""Write the built-in corpus out as ordinary files: a ready-made input for ``prepare``.

    python -m moejax.data.export --out corpus_text [--format txt|jsonl] [--split train|heldout|all]

``txt`` writes one file per document, ``DIR/<domain>/<NNNNNN>.txt``; ``jsonl`` writes one file
per domain, ``DIR/<domain>.jsonl``, with a ``text`` field per line. Useful to try
``python -m moejax.data.prepare`` (e.g. with ``--tokenizer bpe``) without data of your own, and
to measure how fast it runs.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from moejax import paths
from moejax.data.corpus import DOMAINS, build_domain
from moejax.log import add_verbosity_flags
from moejax.runner import run

FORMATS = ("txt", "jsonl")


def export_corpus(out_dir: str | os.PathLike[str], *, fmt: str = "txt", split: str = "train",
                  seed: int = 0, domains=DOMAINS) -> dict[str, int]:
    """Write the built-in corpus's ``split`` ("train", "heldout" or "all"); returns documents per domain."""
    if fmt not in FORMATS:
        raise ValueError(f"format {fmt!r}; allowed: {FORMATS}")
    splits = ("train", "heldout") if split == "all" else (split,)
    out = Path(out_dir)
    counts = {}
    for domain in domains:
        built = build_domain(domain, seed)
        documents = [doc for s in splits for doc in built[s]]
        if fmt == "jsonl":
            out.mkdir(parents=True, exist_ok=True)
            with open(out / f"{domain}.jsonl", "w", encoding="utf-8") as f:
                for doc in documents:
                    f.write(json.dumps({"text": doc}) + "\n")
        else:
            (out / domain).mkdir(parents=True, exist_ok=True)
            for i, doc in enumerate(documents):
                (out / domain / f"{i:06d}.txt").write_text(doc, encoding="utf-8")
        counts[domain] = len(documents)
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m moejax.data.export", description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, type=paths.path_type, help="directory to write")
    parser.add_argument("--format", choices=FORMATS, default="txt")
    parser.add_argument("--split", choices=("train", "heldout", "all"), default="train")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--force", action="store_true", help="replace an existing non-empty --out (as a whole)")
    add_verbosity_flags(parser)
    args = parser.parse_args(argv)
    out = args.out

    def export() -> None:
        paths.check_new_output(out, "--out", force=args.force)
        with paths.replace_dir(out) as tmp:  # complete, or not there: never a partial corpus
            counts = export_corpus(tmp, fmt=args.format, split=args.split, seed=args.seed)
        print(f"{out}: " + ", ".join(f"{d} {n:,} documents" for d, n in counts.items()))

    return run(export, prog="moejax.data.export", verbosity=args.verbosity,
               interrupted=f"interrupted; nothing was written to {out}. Rerun the command.")


if __name__ == "__main__":
    main()
