"""The on-disk cache of the built-in benchmarks: built on first use, read back as :class:`Benchmarks`.

``<cache_dir>/<version>-seed<seed>/`` holds one ``<task>.jsonl`` per task and a ``manifest.json``
(per task: kind, item count, file and sha256; the corpus hashes the items derive from; the Python
version; one combined ``sha256``). The directory is written under a temporary name and renamed
into place, so it exists complete or not at all.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import platform
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from moejax.data.corpus import DOMAINS, TokenizedCorpus, default_cache_dir, load_tokenized_corpus
from moejax.eval.benchmarks import v1
from moejax.eval.benchmarks.registry import get_version


@dataclasses.dataclass(frozen=True)
class Benchmarks:
    """The built-in benchmarks: ``items[domain]`` is a list of dicts; files live in ``directory``."""

    manifest: dict[str, Any]
    items: dict[str, list[dict[str, Any]]]  # task name (v1: the domain) -> items
    directory: Path

    def path(self, task: str) -> Path:
        """The JSONL file of one task (v1: of one domain)."""
        return self.directory / f"{task}.jsonl"


def load_benchmarks(seed: int = 0, cache_dir: str | os.PathLike[str] | None = None,
                    version: str = v1.VERSION) -> Benchmarks:
    """The benchmarks of ``version`` for ``seed``, built (seconds with a cached corpus) on first use."""
    spec = get_version(version)
    directory = Path(cache_dir or default_cache_dir()) / f"{version}-seed{seed}"
    if not (directory / "manifest.json").is_file():
        corpus = load_tokenized_corpus(seed, cache_dir)
        _write(directory, spec.build(corpus, seed), corpus, seed, version=version, kinds=spec.kinds)
    with open(directory / "manifest.json", encoding="utf-8") as f:
        manifest = json.load(f)
    items = {}
    for task in spec.kinds:
        with open(directory / f"{task}.jsonl", encoding="utf-8") as f:
            items[task] = [json.loads(line) for line in f]
    return Benchmarks(manifest, items, directory)


def _write(directory: Path, items: dict[str, list[dict[str, Any]]], corpus: TokenizedCorpus,
           seed: int, *, version: str, kinds: Mapping[str, str]) -> None:
    """Write the JSONL files and the manifest into ``directory`` atomically (temp dir + rename)."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    try:
        domains = {}
        for domain, domain_items in items.items():
            data = "".join(json.dumps(item, sort_keys=True) + "\n" for item in domain_items).encode()
            (tmp / f"{domain}.jsonl").write_bytes(data)
            domains[domain] = {"kind": kinds[domain], "items": len(domain_items),
                               "file": f"{domain}.jsonl", "sha256": hashlib.sha256(data).hexdigest()}
        manifest = {
            "version": version,
            "seed": seed,
            "python": platform.python_version(),
            "corpus": {d: {s: corpus.manifest["domains"][d][s]["sha256"] for s in ("train", "heldout")}
                       for d in DOMAINS},
            "domains": domains,
            "sha256": hashlib.sha256("".join(d["sha256"] for d in domains.values()).encode()).hexdigest(),
        }
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))
        try:
            os.rename(tmp, directory)
        except OSError:
            if not (directory / "manifest.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
