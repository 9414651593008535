"""The user's files in data_mixture's commands: paths mean what was typed, outputs are never
overwritten silently, and every problem with them is found before any fitting starts.

The rules are moejax's own (:mod:`moejax.paths`):

- **Paths**: ``~`` expands, and a relative path is relative to the directory the user ran
  ``launch.sh`` from: every path flag declares a path type of :mod:`data_mixture.cli.flags`,
  which applies :func:`moejax.paths.user_path` as argparse parses it. A ``--config`` is looked
  up there first, then in the repository, so the default ``experiments/configs/tiny_moe.py`` is
  found from anywhere.
- **Outputs**: a command that writes refuses an existing output unless the user passes
  ``--force`` (:func:`check_out_file`, :func:`check_out_dir`), and checks that it can create the
  output's directory, creating nothing yet: a refused or failed command leaves no empty
  directory behind. Files are written under a temporary sibling name and renamed into place
  (:func:`write_text`), so a reader finds the complete old or the complete new file, never half
  of one. Outputs that are meant to be resumed (``sweep --root``, ``mergemix --out``) are resumed
  instead; :func:`check_resumable_dir` refuses only a directory that holds something else.
- **Inputs** that are clearly the wrong kind of file (a JSON, compressed or binary file given as
  a runs table, a missing ``--config``) are named before anything is read (:func:`check_inputs`);
  a fit file is checked by ``Fit.load``.

Every problem is a ``ConfigError``, which the command line prints as one paragraph with exit
status 2.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable

from moejax import configs as builtin_configs
from moejax.errors import ConfigError
from moejax.paths import is_non_empty_dir, refuse_existing_file, relative_to_note, write_file

def check_out_file(path: str, flag: str, *, force: bool) -> None:
    """Refuses an existing ``path`` unless ``force`` (a directory always); checks that its
    directory exists and is writable, or can be created."""
    refuse_existing_file(path, flag, force=force)
    check_can_create(os.path.dirname(os.path.abspath(path)), flag, path)


def check_out_dir(path: str, flag: str, *, force: bool) -> None:
    """Refuses a file, or a non-empty directory unless ``force``; checks ``path`` is writable or
    can be created."""
    check_dir(path, flag)
    if is_non_empty_dir(path) and not force:
        raise ConfigError(f"{flag} {path} already holds files; refusing to overwrite them. Choose a new or empty "
                          "directory, or pass --force to write over the files there.")


def check_resumable_dir(path: str, flag: str, *, marks: Iterable[str], what: str) -> None:
    """A directory a command resumes: new, empty, or holding one of ``marks`` (names the command
    writes there); anything else is refused, and ``path`` must be writable or creatable."""
    check_dir(path, flag)
    marks = tuple(marks)
    if is_non_empty_dir(path) and not any(os.path.lexists(os.path.join(path, m)) for m in marks):
        raise ConfigError(f"{flag} {path} holds files that are not {what} (none of {', '.join(marks)}); refusing "
                          f"to write into it. Choose a new or empty directory (the same {flag} as an earlier run "
                          "resumes that run).")


def check_dir(path: str, flag: str) -> None:
    """``path`` is a directory that is writable or can be created (not a file)."""
    if os.path.lexists(path) and not os.path.isdir(path):
        raise ConfigError(f"{flag} {path} is a file; {flag} takes a directory. Choose another path.")
    check_can_create(path, flag, path)


def check_can_create(directory: str, flag: str, given: str) -> None:
    """``directory`` is writable, or can be created (tried in the nearest existing parent with a
    probe that is removed at once). ``given``: the path the user typed, for the message."""
    existing = _nearest_existing(directory)
    if not os.path.isdir(existing):
        raise ConfigError(f"{flag} {given} has a file, {existing}, where a directory should be. Choose another path.")
    if existing == directory:
        if not os.access(directory, os.W_OK | os.X_OK):
            raise ConfigError(f"{flag} {given}: the directory {directory} is not writable by this user; choose a "
                              "directory you can write to.")
        return
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".probe.", dir=existing))
    except OSError as e:
        raise ConfigError(f"{flag} {given}: cannot create the directory {directory} ({e.strerror or e}); choose a "
                          "directory you can write to.") from None


def _nearest_existing(path: str) -> str:
    current = os.path.abspath(path)
    while not os.path.lexists(current) and os.path.dirname(current) != current:
        current = os.path.dirname(current)
    return current


def write_text(path: str | os.PathLike, text: str) -> None:
    """Writes ``text`` to ``path`` (its directory created) under a temporary name, then renames it
    into place (:func:`moejax.paths.write_file`: the file gets a plain write's permissions)."""
    path = os.path.abspath(os.fspath(path))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_file(path, lambda f: f.write(text))


def check_inputs(args) -> None:
    """Every ``--runs`` file is a text table, not JSON, a compressed or a binary file (the table's
    own reader then checks its columns and rows); a ``--config`` exists."""
    runs = getattr(args, "runs", None)
    for path in [runs] if isinstance(runs, str) else runs or []:
        check_csv(path, "--runs")
    config = getattr(args, "config", None)
    if config and not os.path.isfile(config) and not builtin_configs.find(config):
        raise ConfigError(f"--config {config} does not exist{relative_to_note(config)}, nor in the repository; "
                          "give a moejax experiment file, e.g. --config experiments/configs/tiny_moe.py, or a "
                          f"built-in config name ({', '.join(builtin_configs.BUILTIN)}).")


def check_csv(path: str, flag: str) -> None:
    """A one-paragraph ``ConfigError`` when ``path`` is missing, a directory, or clearly not a CSV."""
    if os.path.isdir(path):
        raise ConfigError(f"{flag} {path} is a directory; {flag} takes a runs-table CSV file (e.g. the runs.csv "
                          "that collect or a sweep writes).")
    if not os.path.isfile(path):
        return  # the table reader names the missing file
    with open(path, "rb") as f:
        head = f.read(4096)
    kind = _not_a_table(head)
    if kind:
        raise ConfigError(f"{flag} {path} is {kind}, not a runs-table CSV; {flag} takes the CSV that "
                          "`python -m data_mixture collect` (or a sweep) writes.")


def _not_a_table(head: bytes) -> str | None:
    if head[:2] == b"\x1f\x8b":
        return "gzip-compressed (gunzip it first)"
    if head[:4] == b"\x28\xb5\x2f\xfd":
        return "zstd-compressed (decompress it first)"
    try:
        text = head.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        if e.start < len(head) - 4:  # not just a character cut by the 4096-byte read
            return "a binary file"
        text = head[:e.start].decode("utf-8-sig")
    if "\x00" in text:
        return "a binary file"
    if text.lstrip()[:1] in ("{", "["):
        return "a JSON file (a fit goes to --fit)"
    return None


def check_outputs(args) -> None:
    """A writing command's ``--out`` file and ``--out-dir`` directory, checked before it reads or
    computes anything; a sweep's ``--root`` (resumed by design) only for being a writable directory.
    ``mergemix`` checks its resumable ``--out`` itself."""
    if getattr(args, "root", None):
        check_dir(args.root, "--root")
    if not hasattr(args, "force"):
        return
    if getattr(args, "out_dir", None):
        check_out_dir(args.out_dir, "--out-dir", force=args.force)
    if getattr(args, "out", None):
        check_out_file(args.out, "--out", force=args.force)
