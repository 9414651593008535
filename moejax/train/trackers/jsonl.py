"""The ``jsonl`` writer: every logged record, whole, as one JSON line of ``WORKDIR/metrics.jsonl``."""

from __future__ import annotations

import json
import os
from typing import Any

FILE = "metrics.jsonl"


class JsonlWriter:
    """Appends (a resumed run continues the file; the loop first drops records past its checkpoint)."""

    def __init__(self, workdir: str):
        self.file = open(os.path.join(workdir, FILE), "a")

    def write(self, step: int, record: dict[str, Any]) -> None:
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()

    def close(self, error: BaseException | None = None) -> None:
        self.file.close()


def open_writer(settings) -> JsonlWriter:
    return JsonlWriter(settings.workdir)
