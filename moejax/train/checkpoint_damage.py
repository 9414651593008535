"""Why a checkpoint cannot be read, in one line: the file that is missing or damaged and what is
wrong with it, never the storage layer's whole spec (a TensorStore error prints its full JSON spec,
hundreds of lines). Used where a damaged checkpoint is reported: training's fallback
(``moejax.train.checkpoint``) and the readers' (``moejax.eval.restore``)."""

from __future__ import annotations

import os
import re
import sys

# Files orbax writes into a step directory (moejax.train.checkpoint's items): the state's always,
# an item's metadata where the item's directory exists. A step that lacks one cannot be read.
EXPECTED_FILES = ("state/_METADATA", "meta/metadata", "data/metadata")
_STATUS = re.compile(r"^[A-Z_]{4,}: ")  # absl status messages: OUT_OF_RANGE: ..., NOT_FOUND: ..., DATA_LOSS: ...
_NOISE = re.compile(r"\s*See full TensorStore details.*", re.DOTALL)
MAX_CHARS = 400


def unreadable_reason(step_dir: str, error: BaseException | None) -> str:
    """One line: the missing files of ``step_dir``, else the most specific message in ``error``'s
    chain (a storage status naming the file, e.g. ``OUT_OF_RANGE: Error reading "params.embed_vd/0.0"
    ... at local file ".../state/": Requested byte range [..) is not valid for value of size 100``)."""
    missing = [name for name in EXPECTED_FILES if _expected(step_dir, name)
               and not os.path.exists(os.path.join(step_dir, name))]
    if missing:
        return "missing " + ", ".join(os.path.join(step_dir, name) for name in missing)
    if error is None:
        return "another process could not read it"
    chain = []
    while error is not None and error not in chain and len(chain) < 20:
        chain.append(error)
        error = error.__cause__ or error.__context__
    messages = [(type(e).__name__, _NOISE.sub("", str(e)).strip()) for e in chain]
    messages = [(name, text) for name, text in messages if text]
    if not messages:
        return type(chain[0]).__name__
    status = [text for _, text in messages if _STATUS.match(text)]
    name, text = (None, status[-1]) if status else messages[-1]
    line = text.splitlines()[0]
    line = line if len(line) <= MAX_CHARS else line[: MAX_CHARS - 3] + "..."
    return line if name is None else f"{name}: {line}"


def _expected(step_dir: str, name: str) -> bool:
    item = name.split("/")[0]
    return item == "state" or os.path.isdir(os.path.join(step_dir, item))


def quiet_closed_loop_callbacks() -> None:
    """Installed before checkpoints are read (once per process). After a read that failed, the
    read's other parts still end: a storage thread completes an
    I/O callback onto the event loop orbax already closed ("RuntimeError: Event loop is closed"),
    and the reads of other array chunks fail too, in coroutines nobody awaits any more. Python
    prints each as an "Exception ignored in ..." traceback (with the whole TensorStore spec: a
    thousand lines), sometimes at exit, under the one-line notice. Drops exactly these reports;
    any other unraisable exception is printed as before."""
    previous = sys.unraisablehook
    if getattr(previous, "_moejax_quiet", False):
        return

    def hook(unraisable) -> None:
        message = str(unraisable.exc_value)
        if (isinstance(unraisable.exc_value, RuntimeError) and message == "Event loop is closed") or (
                "TensorStore" in message and "error while reading" in message):
            return
        previous(unraisable)

    hook._moejax_quiet = True  # type: ignore[attr-defined]
    sys.unraisablehook = hook
