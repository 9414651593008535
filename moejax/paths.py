"""The user's files: paths mean what the user typed, and outputs never overwrite or mix them.

Every moejax command resolves the paths it is given with :func:`user_path`: ``~`` is expanded,
and a relative path is relative to the directory the user ran the command from. ``launch.sh``
runs every command from the repository (its ``.venv``, ``experiments/`` and default ``runs/``
live there) and passes the user's directory in ``MOEJAX_CALLER_CWD``; the first moejax import
reads that variable and removes it from the environment, so a process started by a moejax
command (a sweep's training runs, ``prepare``'s workers) does not resolve its own repository-
relative paths against it.

A command that writes an output refuses an existing non-empty one unless the user passes
``--force`` (:func:`check_new_output`), and writes it under a temporary sibling name that is
renamed into place when complete (:func:`replace_dir`, :func:`write_file`), so a reader never
finds old and new files mixed, or a half-written file under its final name. Every problem is a
``ConfigError``, which the command lines print as one paragraph with exit status 2.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from typing import IO

import moejax
from moejax.errors import ConfigError

CALLER_CWD_ENV = moejax.CALLER_CWD_ENV


def caller_cwd() -> str | None:
    """The directory the user ran ``launch.sh`` from, if it was launched from another one."""
    caller = moejax.CALLER_CWD
    if not caller or os.path.realpath(caller) == os.path.realpath(os.getcwd()):
        return None
    return caller


def user_path(path: str) -> str:
    """``path`` as the user meant it: ``~`` expanded, relative to the directory they ran from, made
    absolute, so that no library (orbax wants absolute checkpoint paths) and no later change of
    directory reads it otherwise."""
    if not path:
        return path
    path = os.path.expanduser(str(path))
    if os.path.isabs(path):
        return path
    return os.path.abspath(os.path.join(caller_cwd() or os.getcwd(), path))


def relative_to_note(path: str) -> str:
    """' (relative to DIR)' for a relative path, to say in a message where it was looked up."""
    if not path or os.path.isabs(os.path.expanduser(path)):
        return ""
    return f" (relative to {caller_cwd() or os.getcwd()})"


def user_input_path(path: str) -> str:
    """An input the repository may hold (an experiment file): the user's if it exists, else the
    repository's, so ``experiments/tiny_moe.py`` works from any directory."""
    mine = user_path(path)
    if os.path.exists(mine) or not os.path.exists(os.path.expanduser(path)):
        return mine
    return os.path.expanduser(path)


# The argparse ``type`` of every path flag of every command (moejax's and data_mixture's): argparse
# applies it to the typed value and to a string default, so the parser itself resolves the path
# and is the list of path flags (``tests/test_path_flags.py`` checks every flag that reads like a
# path has one). A command module with its own form (``DOMAIN=PATH``) marks its type with
# :func:`path_flag_type`.
def path_flag_type(function: Callable[[str], str]) -> Callable[[str], str]:
    """Marks ``function`` as a path type (:func:`is_path_type`)."""
    function.resolves_path = True  # type: ignore[attr-defined]
    return function


def is_path_type(function: object) -> bool:
    """Whether ``function`` (an argparse action's ``type``) resolves a path as :func:`user_path`."""
    return bool(getattr(function, "resolves_path", False))


@path_flag_type
def path_type(text: str) -> str:
    """A path the user typed: ``~`` expanded, relative to the directory they ran the command from."""
    return user_path(text)


@path_flag_type
def input_path_type(text: str) -> str:
    """An input the repository may hold too (an experiment file): the user's, else the repository's."""
    return user_input_path(text)


@path_flag_type
def named_path_type(text: str) -> str:
    """``NAME=PATH`` with PATH resolved as :func:`path_type` (text without ``=`` is left for the
    command's own check, which names the allowed form)."""
    name, sep, value = text.partition("=")
    return f"{name}={user_path(value.strip())}" if sep and value.strip() else text


def keyword_or_path_type(*keywords: str) -> Callable[[str], str]:
    """One of ``keywords`` as it is (``byte``, ``bpe``), else a path resolved as :func:`path_type`."""

    @path_flag_type
    def keyword_or_path(text: str) -> str:
        return text if text in keywords else user_path(text)

    keyword_or_path.__doc__ = f"{' | '.join(keywords)} or a path"
    return keyword_or_path


def is_non_empty_dir(path: str) -> bool:
    return os.path.isdir(path) and any(True for _ in os.scandir(path))


def make_dir(path: str, flag: str) -> None:
    """Creates directory ``path`` (and its parents); a one-paragraph ``ConfigError`` naming
    ``flag`` if something is in the way (a file, a missing permission, a read-only filesystem)."""
    if os.path.isdir(path):
        if not os.access(path, os.W_OK | os.X_OK):
            raise ConfigError(f"{flag} {path}: the directory is not writable by this user; choose "
                              "a directory you can write to.")
        return
    blocker = _file_in_the_way(path)
    if blocker is not None:
        what = "is a file" if blocker == path else f"has a file, {blocker}, where a directory should be"
        raise ConfigError(f"{flag} {path} {what}; {flag} takes a directory. Choose another path.")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"{flag} {path}: cannot create the directory ({e.strerror or e}); choose "
                          "a directory you can write to.") from None


def _file_in_the_way(path: str) -> str | None:
    """``path`` or the nearest of its parents that exists as something other than a directory."""
    current = os.path.abspath(path)
    while True:
        if os.path.lexists(current):
            return None if os.path.isdir(current) else current
        parent = os.path.dirname(current)
        if parent == current:
            return None
        current = parent


def check_new_output(path: str, flag: str, *, force: bool, what: str = "") -> None:
    """Refuses ``path`` if it exists and is not empty, unless ``force``; checks it can be written.

    ``what`` describes what is already there when the caller knows (e.g. "the Hugging Face
    checkpoint this run was imported from").
    """
    if os.path.isfile(path) or (os.path.lexists(path) and not os.path.isdir(path)):
        raise ConfigError(f"{flag} {path} is a file; {flag} takes a directory. Choose another path.")
    if is_non_empty_dir(path) and not force:
        held = what or "files"
        raise ConfigError(f"{flag} {path} already holds {held}; refusing to overwrite it. Choose a new "
                          "or empty directory, or pass --force to replace it.")
    make_dir(os.path.dirname(os.path.abspath(path)), f"{flag} (its parent)")


def check_new_file(path: str, flag: str, *, force: bool) -> None:
    """Refuses an existing file ``path`` unless ``force`` (a directory always); checks its
    directory can be written."""
    refuse_existing_file(path, flag, force=force)
    make_dir(os.path.dirname(os.path.abspath(path)), f"{flag} (its directory)")


def refuse_existing_file(path: str, flag: str, *, force: bool) -> None:
    """Refuses a directory at ``path`` always, and an existing file unless ``force``."""
    if os.path.isdir(path):
        raise ConfigError(f"{flag} {path} is a directory; {flag} takes a file name. Choose another path.")
    if os.path.lexists(path) and not force:
        raise ConfigError(f"{flag} {path} already exists; refusing to overwrite it. Choose a new file name, "
                          "or pass --force to replace it.")


@contextlib.contextmanager
def replace_dir(final: str) -> Iterator[str]:
    """Yields a temporary sibling directory to write into; on success it replaces ``final``.

    The old directory (if any) is moved aside, the new one renamed into place, then the old one
    deleted: at every moment ``final`` is the complete old or the complete new directory. On an
    error the temporary directory is removed and ``final`` is untouched.
    """
    final = os.path.abspath(final)
    parent, name = os.path.split(final)
    tmp = tempfile.mkdtemp(prefix=f".{name}.", suffix=".tmp", dir=parent)
    os.chmod(tmp, plain_mode(final, 0o777))
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if os.path.lexists(final):
        old = tempfile.mkdtemp(prefix=f".{name}.", suffix=".old", dir=parent)
        os.replace(final, os.path.join(old, name))
    os.replace(tmp, final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def plain_mode(path: str, default: int) -> int:
    """The permissions a plain write would give ``path``: an existing file's own, else
    ``default`` (0o666 for files, 0o777 for directories) less the umask. Temporary files and
    directories are created owner-only; what is renamed into place gets these instead."""
    if os.path.exists(path):
        return stat.S_IMODE(os.stat(path).st_mode)
    umask = os.umask(0)
    os.umask(umask)
    return default & ~umask


def write_file(path: str, write: Callable[[IO], object], *, mode: str = "w") -> None:
    """Writes ``path`` through ``write(file)`` under a temporary name, then renames it into place.

    ``mode``: "w" (text) or "wb" (bytes)."""
    directory, name = os.path.split(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
    try:
        os.fchmod(fd, plain_mode(path, 0o666))
        text = "b" not in mode
        with os.fdopen(fd, mode, encoding="utf-8" if text else None, newline="" if text else None) as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
