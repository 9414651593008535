"""Text shipped with the Python interpreter: standard-library source (code) and its English prose.

Nothing is downloaded. Two document sources are read from the interpreter's own files:

- **code**: library ``.py`` files, one document per file, verbatim. Tests (``test/``,
  ``tests/``, ``idle_test/``), ``idlelib``, ``pydoc_data`` (documentation stored as a Python
  dict) and files over ``MAX_CODE_FILE_BYTES`` are left out.
- **prose**: the Python documentation in ``pydoc_data.topics.topics``, plus the docstrings and
  comment blocks (three or more consecutive ``#`` lines, mostly letters) of every stdlib ``.py``
  file, test files included. Long texts are cut into paragraph-sized documents
  (``chunk_paragraphs``).

Blank files are dropped, and exact duplicates (identical modules, licence headers repeated
across files) are kept only the first time.

Every document carries a *source key*: the file's path relative to the stdlib root (or
``pydoc_data.topics/<topic>``). All documents from one source share its key, and the corpus
assigns splits by key, so a library file's docstrings land in the same split as its source
code: a held-out file adds nothing to any training split. (Text that recurs in several files,
such as a one-line docstring, can still be in both splits.)

Another interpreter version ships slightly different files; the corpus manifest records
content hashes so runs on different machines can tell.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import re
import subprocess
import sys
import sysconfig
import warnings
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Final

MAX_CODE_FILE_BYTES: Final = 200_000
MAX_CODE_TOTAL_BYTES: Final = 20_000_000

_SKIPPED_DIRS: Final = frozenset({"site-packages", "__pycache__", "pydoc_data"})
_NON_LIBRARY_DIRS: Final = frozenset({"test", "tests", "idle_test", "idlelib"})
_COMMENT_BLOCK: Final = re.compile(r"(?:^[ \t]*#[^\n]*\n){3,}", re.MULTILINE)
_COMMENT_PREFIX: Final = re.compile(r"^[ \t]*#+[ \t]?", re.MULTILINE)
_PARAGRAPH_BREAK: Final = re.compile(r"\n[ \t]*\n")
_DOCSTRING_OWNERS: Final = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
_NESTED_BODIES: Final = ("body", "orelse", "finalbody", "handlers", "cases")
# Sources per worker process below which all_prose_pieces parses in this process.
_MIN_SOURCES_PER_WORKER: Final = 64

# (source key, text)
Document = tuple[str, str]


@dataclasses.dataclass(frozen=True)
class SourceFile:
    """One stdlib ``.py`` file: its path relative to the stdlib root (posix) and its text."""

    relpath: str
    text: str

    @property
    def is_library_code(self) -> bool:
        """False for tests and idlelib: they feed prose, not the code domain."""
        return not _NON_LIBRARY_DIRS.intersection(self.relpath.split("/")[:-1])


def stdlib_root() -> str:
    """The directory of the running interpreter's standard library."""
    return sysconfig.get_paths()["stdlib"]


def read_stdlib_files(root: str | None = None) -> list[SourceFile]:
    """All ``.py`` files under ``root`` (default: the stdlib), sorted by relative path.

    ``site-packages``, ``__pycache__`` and ``pydoc_data`` are skipped. Files are decoded as
    UTF-8 with undecodable bytes replaced.
    """
    root = root or stdlib_root()
    relpaths = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in _SKIPPED_DIRS]
        rel_dir = os.path.relpath(dirpath, root)
        for name in filenames:
            if name.endswith(".py"):
                relpaths.append(os.path.normpath(os.path.join(rel_dir, name)).replace(os.sep, "/"))
    files = []
    for relpath in sorted(relpaths):
        with open(os.path.join(root, *relpath.split("/")), "rb") as f:
            files.append(SourceFile(relpath, f.read().decode("utf-8", errors="replace")))
    return files


def code_documents(
    files: Sequence[SourceFile],
    *,
    max_file_bytes: int = MAX_CODE_FILE_BYTES,
    max_total_bytes: int = MAX_CODE_TOTAL_BYTES,
) -> list[Document]:
    """Library source files as documents, in path order, until ``max_total_bytes`` is reached.

    Skipped: blank files, exact copies of an earlier file, files larger than ``max_file_bytes``
    (UTF-8) and any file that would take the total past ``max_total_bytes``.
    """
    documents, seen, total = [], set(), 0
    for file in files:
        size = len(file.text.encode("utf-8"))
        if (
            not file.is_library_code
            or not file.text.strip()
            or file.text in seen
            or size > max_file_bytes
            or total + size > max_total_bytes
        ):
            continue
        documents.append((file.relpath, file.text))
        seen.add(file.text)
        total += size
    return documents


def prose_documents(files: Sequence[SourceFile], *, max_chars: int = 4096) -> list[Document]:
    """The pydoc topics, then each file's docstrings and comment blocks, cut into paragraphs.

    A chunk identical to an earlier one (a licence header repeated across files, say) is kept
    only the first time.
    """
    from pydoc_data.topics import topics  # A 750 KB module: imported only when needed.

    sources = [(f"pydoc_data.topics/{name}", topics[name]) for name in sorted(topics)]
    pieces = all_prose_pieces([file.text for file in files])
    sources += [(file.relpath, "\n\n".join(p)) for file, p in zip(files, pieces)]
    documents, seen = [], set()
    for key, text in sources:
        for chunk in chunk_paragraphs(text, max_chars):
            if chunk not in seen:
                documents.append((key, chunk))
                seen.add(chunk)
    return documents


def chunk_paragraphs(text: str, max_chars: int = 4096) -> list[str]:
    """Cut ``text`` at blank lines into documents of about ``max_chars // 2`` to ``max_chars``.

    Paragraphs are packed greedily; a document is closed once it holds ``max_chars // 2``
    characters or the next paragraph would not fit. A paragraph longer than ``max_chars`` is cut
    at line breaks, and a line longer than ``max_chars`` is cut every ``max_chars`` characters.
    """
    if max_chars < 2:
        raise ValueError(f"max_chars must be at least 2, got {max_chars}")
    target = max_chars // 2
    chunks: list[str] = []
    current: list[str] = []
    size = 0
    for piece in _pieces_at_most(text, max_chars):
        if current and (size >= target or size + 2 + len(piece) > max_chars):
            chunks.append("\n\n".join(current))
            current, size = [], 0
        size += len(piece) + (2 if current else 0)
        current.append(piece)
    if current:
        chunks.append("\n\n".join(current))
    return chunks


def _pieces_at_most(text: str, max_chars: int) -> Iterator[str]:
    """Non-blank paragraphs of ``text``, each cut into pieces of at most ``max_chars``."""
    for paragraph in _PARAGRAPH_BREAK.split(text):
        paragraph = paragraph.strip("\n")
        if not paragraph.strip():
            continue
        if len(paragraph) <= max_chars:
            yield paragraph
            continue
        piece = ""
        for line in paragraph.split("\n"):
            for start in range(0, max(len(line), 1), max_chars):
                part = line[start : start + max_chars]
                if piece and len(piece) + 1 + len(part) > max_chars:
                    yield piece
                    piece = part
                else:
                    piece = f"{piece}\n{part}" if piece else part
        if piece.strip():
            yield piece


def all_prose_pieces(sources: Sequence[str]) -> list[list[str]]:
    """The docstrings and comment blocks of each Python source, in order, over the machine's cores.

    ``ast.parse`` of the ~1,800 stdlib files is most of a fresh corpus build (~10 s on one core),
    and it holds the GIL for a whole file at a time. So the sources are parsed in child processes
    (``python -m moejax.data.stdlib_text``, JSON over pipes; not ``fork``, unsafe once JAX's threads
    run, nor ``multiprocessing``'s spawn, which re-runs the caller's main module): on 2 cores the
    build takes about half as long, and the training loop's background compile
    (:mod:`moejax.train.precompile`) keeps the GIL meanwhile. The result is the same as parsing
    each source here, in the same order.
    """
    workers = min(os.cpu_count() or 1, len(sources) // _MIN_SOURCES_PER_WORKER)
    if workers < 2 or not sys.executable:
        return [_prose_pieces(source) for source in sources]
    package_root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))}

    def parse(shard: list[str]) -> list[list[str]]:
        done = subprocess.run(
            [sys.executable, "-m", "moejax.data.stdlib_text"], input=json.dumps(shard), capture_output=True,
            text=True, encoding="utf-8", env=env, check=False,
        )
        if done.returncode:
            raise RuntimeError(f"the prose parser process failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
        return json.loads(done.stdout)

    with ThreadPoolExecutor(workers) as pool:  # threads only wait on the processes
        shards = list(pool.map(parse, [list(sources[i::workers]) for i in range(workers)]))
    pieces: list[list[str]] = [[] for _ in sources]
    for i, shard in enumerate(shards):
        pieces[i::workers] = shard
    return pieces


def _prose_pieces(source: str) -> list[str]:
    """Docstrings and comment blocks of one Python source, in source order."""
    pieces = _docstrings(source) + _comment_blocks(source)
    return [text for _, text in sorted(pieces, key=lambda item: item[0])]


def _docstrings(source: str) -> list[tuple[int, str]]:
    """(line, docstring) for the module, classes and functions; [] if ``source`` won't parse."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []  # Deliberately broken test inputs and Python 2 samples.
    found = []
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, _DOCSTRING_OWNERS) and (doc := ast.get_docstring(node)):
            found.append((getattr(node, "lineno", 0), doc))
        for field in _NESTED_BODIES:
            stack.extend(getattr(node, field, ()))
    return found


def _comment_blocks(source: str) -> list[tuple[int, str]]:
    """(line, text) of blocks of 3+ comment lines that are mostly letters, ``#`` removed."""
    found = []
    line, last_offset = 1, 0
    for match in _COMMENT_BLOCK.finditer(source):
        block = _COMMENT_PREFIX.sub("", match.group(0)).strip()
        if block and sum(c.isalpha() for c in block) > len(block) // 2:
            line += source.count("\n", last_offset, match.start())
            last_offset = match.start()
            found.append((line, block))
    return found


if __name__ == "__main__":  # a worker of all_prose_pieces: a JSON list of sources in, their pieces out
    json.dump([_prose_pieces(source) for source in json.load(sys.stdin)], sys.stdout)
