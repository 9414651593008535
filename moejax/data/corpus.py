"""The built-in multi-domain corpus: generated offline, deterministically, from a seed.

Four domains (``DOMAINS``), each a list of text documents split into ``train`` and
``heldout``:

- ``code``: the interpreter's standard-library source (see ``stdlib_text``).
- ``prose``: the Python documentation shipped as ``pydoc_data.topics``, plus stdlib docstrings
  and comment blocks, in paragraph-sized documents.
- ``math``: generated arithmetic and algebra problems with worked answers.
- ``knowledge``: generated facts about a fixed fictional world, restated across documents.

Splits are assigned per *source key* (a stdlib file, a pydoc topic, or a generated document's
index) by hashing ``(version, seed, key)``: about ``HELDOUT_FRACTION`` of the keys are held out.
Because a stdlib file's code and prose share its key, a held-out file's docstrings never reach
the code training split by way of its source.

``build_corpus`` returns the text and a manifest: per domain and split, the document count, the
UTF-8 byte count and a sha256 content hash (``content_hash``). The stdlib differs a little between
interpreter versions; comparing manifests tells runs apart.

``load_tokenized_corpus`` caches the tokenised corpus on disk as ``.npy`` files plus a
``manifest.json`` under ``<cache_dir>/builtin-v1-seed<seed>/``. The directory is written under a
temporary name and renamed into place, so it either exists complete or not at all. Arrays are
memory-mapped on load, which takes milliseconds. The cache is keyed by version and seed only:
a cache copied to a machine with another interpreter is used as is, and its manifest (with the
Python version that built it) says what it holds. The manifest records every file's sha256, and a
load checks the files against it (once per process; about 0.1 s for the 86 MB): a damaged cache
(a file changed, cut short or missing, or one made before the checksums were recorded) is rebuilt
from its seed with one notice, as the data is the same, so no run trains or evaluates on scribbled
bytes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import platform
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import numpy as np

from moejax.data import stdlib_text
from moejax.data.streams import TokenStream, tokenize_documents
from moejax.data.synthetic_knowledge import knowledge_documents
from moejax.data.synthetic_math import math_documents
from moejax.data.tokenizer import get_tokenizer

DOMAINS: Final = ("code", "prose", "math", "knowledge")
SPLITS: Final = ("train", "heldout")
CORPUS_VERSION: Final = "builtin-v1"
HELDOUT_FRACTION: Final = 0.03
# Characters generated for each synthetic domain: a little over 3 MB stays in train.
SYNTHETIC_TARGET_CHARS: Final = 3_600_000
TOKENIZER_NAME: Final = "byte"
MANIFEST_FILE: Final = "manifest.json"
CACHE_ENV_VAR: Final = "MOEJAX_CACHE"
FILES_KEY: Final = "files"  # manifest: {file name: sha256} of every array file of the cache

log = logging.getLogger(__name__)
_VERIFIED: set[tuple[str, int, int]] = set()  # (path, size, mtime_ns) of cache files hashed this process


@dataclasses.dataclass(frozen=True)
class Corpus:
    """The built-in corpus as text: ``documents[domain][split]`` is a list of documents."""

    seed: int
    documents: Mapping[str, Mapping[str, list[str]]]
    manifest: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class TokenizedCorpus:
    """The built-in corpus as token streams, keyed by ``(domain, split)``, plus its manifest."""

    manifest: dict[str, Any]
    streams: Mapping[tuple[str, str], TokenStream]

    def stream(self, domain: str, split: str) -> TokenStream:
        """The token stream of one domain split."""
        check_domain(domain)
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; allowed splits: {SPLITS}")
        return self.streams[(domain, split)]

    def documents(self, domain: str, split: str) -> list[str]:
        """The text of one domain split's documents, decoded from the byte tokens."""
        stream = self.stream(domain, split)
        if not stream.num_documents:
            return []
        ends = np.append(stream.doc_starts[1:], stream.num_tokens) - 1  # Each EOS.
        data = np.asarray(stream.tokens).astype(np.uint8).tobytes()  # EOS (257) wraps; cut below.
        return [data[s:e].decode("utf-8") for s, e in zip(stream.doc_starts.tolist(), ends.tolist())]


def check_domain(domain: str) -> None:
    """Raise a ValueError naming ``domain`` unless it is one of ``DOMAINS``."""
    if domain not in DOMAINS:
        raise ValueError(f"unknown domain {domain!r}; allowed domains: {DOMAINS}")


def is_heldout(seed: int, key: str) -> bool:
    """Whether documents from source ``key`` belong to the held-out split for ``seed``."""
    digest = hashlib.sha256(f"{CORPUS_VERSION}/{seed}/{key}".encode()).digest()
    return int.from_bytes(digest[:8], "little") < HELDOUT_FRACTION * 2**64


def content_hash(documents: Sequence[str]) -> str:
    """sha256 over the documents' UTF-8 bytes, each prefixed by its length (8 bytes, LE)."""
    h = hashlib.sha256()
    for document in documents:
        data = document.encode("utf-8")
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()


def build_domain(domain: str, seed: int = 0) -> dict[str, list[str]]:
    """One domain's documents for ``seed``, as ``{"train": [...], "heldout": [...]}``."""
    check_domain(domain)
    _check_seed(seed)
    splits: dict[str, list[str]] = {split: [] for split in SPLITS}
    for key, text in _keyed_documents(domain, seed):
        splits["heldout" if is_heldout(seed, key) else "train"].append(text)
    return splits


def build_corpus(seed: int = 0) -> Corpus:
    """Build all four domains for ``seed`` (a few seconds; nothing is downloaded)."""
    documents = {domain: build_domain(domain, seed) for domain in DOMAINS}
    manifest = {
        "version": CORPUS_VERSION,
        "seed": int(seed),
        "heldout_fraction": HELDOUT_FRACTION,
        "python": platform.python_version(),
        "domains": {
            domain: {
                split: {
                    "documents": len(docs),
                    "bytes": sum(len(d.encode("utf-8")) for d in docs),
                    "sha256": content_hash(docs),
                }
                for split, docs in splits.items()
            }
            for domain, splits in documents.items()
        },
    }
    return Corpus(seed=seed, documents=documents, manifest=manifest)


def default_cache_dir() -> str:
    """``$MOEJAX_CACHE`` if set, else ``~/.cache/moejax``."""
    return os.environ.get(CACHE_ENV_VAR) or os.path.expanduser("~/.cache/moejax")


def load_tokenized_corpus(
    seed: int = 0, cache_dir: str | os.PathLike[str] | None = None
) -> TokenizedCorpus:
    """The byte-tokenised corpus for ``seed``, built and cached on first use."""
    _check_seed(seed)
    directory = Path(cache_dir or default_cache_dir()) / f"{CORPUS_VERSION}-seed{seed}"
    if not (directory / MANIFEST_FILE).is_file():
        _write_cache(build_corpus(seed), directory)
    problem = _cache_problem(directory, seed)
    if problem:
        if problem.startswith("its manifest records no checksums"):
            log.info(f"moejax: the built-in corpus cache {directory} was made by an older moejax without "
                     "checksums; rebuilding it with them (the same data).")
        else:
            log.warning(f"moejax: warning: the built-in corpus cache {directory} is damaged: {problem} It is "
                        "rebuilt from its seed now (the same data; a few seconds).")
        _replace_cache(build_corpus(seed), directory)
        problem = _cache_problem(directory, seed)
        if problem:
            from moejax.errors import DataError

            raise DataError(f"the built-in corpus cache {directory} is damaged even after it was rebuilt: "
                            f"{problem} Check that disk, or point data.cache_dir (or ${CACHE_ENV_VAR}) at "
                            "another directory.")
    return _read_cache(directory, seed)


def _cache_problem(directory: Path, seed: int) -> str | None:
    """What is wrong with the cache in ``directory`` (a sentence), or None when every file matches
    the size and sha256 its manifest records."""
    try:
        with open(directory / MANIFEST_FILE, encoding="utf-8") as f:
            manifest = json.load(f)
    except (OSError, ValueError) as e:
        return f"its {MANIFEST_FILE} does not read ({e})."
    expected = {"version": CORPUS_VERSION, "seed": seed, "tokenizer": TOKENIZER_NAME}
    found = {key: manifest.get(key) if isinstance(manifest, dict) else None for key in expected}
    if found != expected:
        return f"its manifest says {found}, expected {expected}."
    files = manifest.get(FILES_KEY)
    if not isinstance(files, dict):
        return "its manifest records no checksums."
    for domain in DOMAINS:
        for split in SPLITS:
            for field in ("tokens", "doc_starts"):
                path = _array_path(directory, domain, split, field)
                if path.name not in files:
                    return f"its manifest has no checksum for {path}."
                problem = _file_problem(path, files[path.name])
                if problem:
                    return problem
    return None


def _file_problem(path: Path, sha256: str) -> str | None:
    try:
        stat = os.stat(path)
        key = (str(path), stat.st_size, stat.st_mtime_ns)
        if key in _VERIFIED:
            return None
        if _sha256(path) != sha256:
            return f"file {path} does not match the sha256 recorded in its manifest."
    except OSError as e:
        return f"file {path} does not read ({e.strerror or e})."
    _VERIFIED.add(key)
    return None


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def _replace_cache(corpus: Corpus, directory: Path) -> None:
    """Moves the damaged cache aside (a process still reading it keeps its files), writes a fresh
    one in its place, then deletes the old one."""
    aside = Path(tempfile.mkdtemp(prefix=f".{directory.name}.damaged.", dir=directory.parent))
    try:
        try:
            os.rename(directory, aside / directory.name)
        except FileNotFoundError:
            pass  # another process moved it first
        _write_cache(corpus, directory)
    finally:
        shutil.rmtree(aside, ignore_errors=True)


def _keyed_documents(domain: str, seed: int) -> list[tuple[str, str]]:
    """``(source key, text)`` pairs of one domain, before splitting."""
    if domain == "code":
        return stdlib_text.code_documents(stdlib_text.read_stdlib_files())
    if domain == "prose":
        return stdlib_text.prose_documents(stdlib_text.read_stdlib_files())
    generate = {"math": math_documents, "knowledge": knowledge_documents}[domain]
    texts = generate(seed, SYNTHETIC_TARGET_CHARS)
    return [(f"{domain}/{i}", text) for i, text in enumerate(texts)]


def _check_seed(seed: int) -> None:
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")


def _array_path(directory: Path, domain: str, split: str, field: str) -> Path:
    return directory / f"{domain}.{split}.{field}.npy"


def _write_cache(corpus: Corpus, directory: Path) -> None:
    """Tokenise ``corpus`` into ``directory`` atomically: write a temp dir, then rename it."""
    tokenizer = get_tokenizer(TOKENIZER_NAME)
    manifest = json.loads(json.dumps(corpus.manifest))
    manifest["tokenizer"] = tokenizer.name
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    try:
        for domain, splits in corpus.documents.items():
            for split, documents in splits.items():
                stream = tokenize_documents(documents, tokenizer)
                _save_array(_array_path(tmp, domain, split, "tokens"), stream.tokens)
                _save_array(_array_path(tmp, domain, split, "doc_starts"), stream.doc_starts)
                manifest["domains"][domain][split]["tokens"] = stream.num_tokens
        manifest[FILES_KEY] = {path.name: _sha256(path) for path in sorted(tmp.glob("*.npy"))}
        with open(tmp / MANIFEST_FILE, "w", encoding="utf-8") as f:
            json.dump(manifest, f, indent=2, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.rename(tmp, directory)
        except OSError:
            if not (directory / MANIFEST_FILE).is_file():
                raise
            # Another process finished the same cache first; its copy is identical.
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _save_array(path: Path, array: np.ndarray) -> None:
    with open(path, "wb") as f:
        np.save(f, array, allow_pickle=False)
        f.flush()
        os.fsync(f.fileno())


def _read_cache(directory: Path, seed: int) -> TokenizedCorpus:
    """Memory-map a cache written by ``_write_cache``, checking it against its manifest."""
    with open(directory / MANIFEST_FILE, encoding="utf-8") as f:
        manifest = json.load(f)
    expected = {"version": CORPUS_VERSION, "seed": seed, "tokenizer": TOKENIZER_NAME}
    found = {key: manifest.get(key) for key in expected}
    if found != expected:
        raise ValueError(f"cache {directory} holds {found}, expected {expected}; delete it")
    streams = {}
    for domain in DOMAINS:
        for split in SPLITS:
            tokens, doc_starts = (
                np.load(_array_path(directory, domain, split, f), mmap_mode="r", allow_pickle=False)
                for f in ("tokens", "doc_starts")
            )
            entry = manifest["domains"][domain][split]
            if (
                tokens.dtype != np.int32
                or doc_starts.dtype != np.int32
                or tokens.shape != (entry["tokens"],)
                or doc_starts.shape != (entry["documents"],)
            ):
                raise ValueError(
                    f"cache {directory} disagrees with its manifest on {domain}/{split}; delete it"
                )
            streams[(domain, split)] = TokenStream(tokens=tokens, doc_starts=doc_starts)
    return TokenizedCorpus(manifest=manifest, streams=streams)
