"""No function longer than 80 lines in ``data_mixture/`` or ``moejax/train/``.

A long function there is a sign that several jobs share one body; split it into named pieces
(see how ``data_mixture.table.from_columns`` or ``moejax.train.default_hooks.hooks`` read). A
function's length runs from its ``def`` line to its last line, nested functions included,
decorators not.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("data_mixture", "moejax/train")
MAX_LINES = 80


def long_functions(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES, limit: int = MAX_LINES) -> list[str]:
    """``path:line name (N lines)`` for every function or method over ``limit`` lines."""
    found = []
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    length = (node.end_lineno or node.lineno) - node.lineno + 1
                    if length > limit:
                        found.append(f"{path.relative_to(root)}:{node.lineno} {node.name} ({length} lines)")
    return found


def test_no_function_over_80_lines():
    found = long_functions()
    assert not found, (f"functions over {MAX_LINES} lines (split them into well-named pieces): "
                       + "; ".join(found))


def test_the_check_names_a_long_function(tmp_path):
    (tmp_path / "pkg").mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(85))
    (tmp_path / "pkg" / "m.py").write_text(f"def short():\n    return 1\n\n\ndef too_long():\n{body}\n")
    assert long_functions(tmp_path, ("pkg",)) == ["pkg/m.py:5 too_long (86 lines)"]
