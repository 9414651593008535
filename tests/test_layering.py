"""The layering of moejax, data_mixture and experiments, read from the source with ``ast``
(nothing is imported).

The rules (the layering is described in moejax/checks.py's docstring and docs/architecture.md,
"Architecture"): the import graph of ``moejax/``, ``data_mixture/`` and ``experiments/`` has no
circle; moejax imports nothing from data_mixture or experiments; the leaves ``moejax.errors`` and ``moejax.schema`` (the typed model
configs, from whose field declarations ``moejax.config`` generates the ``model.*`` checks) import
no module of moejax, and ``moejax.config`` imports only those two and ``moejax.configs`` (the
built-in config files, a package that imports nothing from moejax); the model imports nothing from
data, train or any package above them; ``data_mixture`` and ``experiments`` use moejax through
public names only.

How imports are read:

- Every ``import`` and ``from ... import`` statement of a module counts, wherever it is: at module
  level, inside functions and methods, under ``if TYPE_CHECKING:``, in ``try``/``except``. An
  import inside a function runs only when the function is called, which is how a circle hides;
  it is an edge of the graph like any other. A lazy import (of something heavy, or of a module
  only one command needs) is fine, as long as it closes no circle.
- ``from a.b import c`` is an edge to the module ``a.b.c`` when moejax has one, else to ``a.b``
  (``c`` is a name defined there); relative imports are resolved against the importing module.
- An import of ``a.b.c`` is an edge to ``a.b.c`` only. Python runs the ``__init__`` of ``a`` and
  ``a.b`` first, but a package ``__init__`` that imports its own submodules (as
  ``moejax/model/balancing/__init__.py`` does, to export their names) is how a package is made,
  not a circle, so those implied edges are not added.
- Imports by a name computed at run time (``importlib.import_module``: ``moejax.data``'s lazy
  exports, the CLI's subcommands) are not seen; they must not be used to hide a circle either.
"""

from __future__ import annotations

import ast
import functools
import os
from collections.abc import Iterator

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _modules(package: str) -> dict[str, str]:
    """Dotted module name -> file path, for every .py file under ``package`` (a top-level dir)."""
    out = {}
    for directory, _, files in os.walk(os.path.join(ROOT, package)):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(directory, name)
                dotted = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                out[dotted.removesuffix(".__init__")] = path
    return out


MOEJAX = _modules("moejax")
PACKAGES = ("moejax", "data_mixture", "experiments")  # from the bottom up
ALL = {module: path for package in PACKAGES for module, path in _modules(package).items()}


def _imports(module: str, path: str) -> Iterator[tuple[int, str, list[str]]]:
    """(line, imported module, names taken from it) for every import statement of the file."""
    is_package = path.endswith("__init__.py")
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read(), path)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, []
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = module.split(".")
                base = parts if is_package else parts[:-1]
                base = base[:len(base) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            yield node.lineno, source, [alias.name for alias in node.names]


def _our_module(dotted: str) -> str | None:
    """The module of the three packages ``dotted`` names, or the innermost one that contains it;
    None outside them."""
    parts = dotted.split(".")
    while parts and ".".join(parts) not in ALL:
        parts.pop()
    return ".".join(parts) if parts and parts[0] in PACKAGES else None


@functools.cache
def full_import_graph() -> dict[str, dict[str, int]]:
    """module -> {module it imports: line of the first such import}, over the three packages."""
    graph: dict[str, dict[str, int]] = {module: {} for module in ALL}
    for module, path in ALL.items():
        for line, source, names in _imports(module, path):
            targets = [f"{source}.{name}" if f"{source}.{name}" in ALL else source for name in names] or [source]
            for target in filter(None, map(_our_module, targets)):
                if target != module:
                    graph[module].setdefault(target, line)
    return graph


def import_graph() -> dict[str, dict[str, int]]:
    """The part of :func:`full_import_graph` among moejax's modules."""
    return {module: {t: line for t, line in targets.items() if t in MOEJAX}
            for module, targets in full_import_graph().items() if module in MOEJAX}


def cycles(graph: dict[str, dict[str, int]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _describe(component: frozenset[str], graph: dict[str, dict[str, int]]) -> str:
    edges = [f"  {a} imports {b} (line {graph[a][b]})" for a in sorted(component) for b in sorted(graph[a])
             if b in component]
    return f"{len(component)} modules in a circle:\n" + "\n".join(edges)


def test_the_import_graph_reads_imports_at_every_depth():
    """The reader sees what it must, on the real sources: imports inside functions, a submodule
    named in ``from a import b``, a package ``__init__``'s imports; and the circle finder finds one."""
    graph = import_graph()
    assert "moejax.train.loop" in graph["moejax.main"]  # imported inside main()
    assert "moejax.data.bpe" in graph["moejax.data.tokenizer"]  # inside get_tokenizer
    assert "moejax.model.balancing.registry" in graph["moejax.model.balancing"]  # from a package's __init__
    assert "moejax.config" in graph["moejax.train.startup"]  # from moejax import config as config_lib
    assert cycles({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}) == [frozenset("abc")]


def test_moejax_has_no_import_circle():
    graph = import_graph()
    found = cycles(graph)
    assert not found, "\n\n".join(_describe(c, graph) for c in found)


def test_no_import_circle_across_moejax_data_mixture_and_experiments():
    graph = full_import_graph()
    found = cycles(graph)
    assert not found, "\n\n".join(_describe(c, graph) for c in found)


def test_each_package_imports_only_the_ones_below_it():
    """moejax imports neither data_mixture nor experiments; data_mixture does not import experiments."""
    bad = [
        f"{module} imports {target} (line {line})"
        for module, targets in sorted(full_import_graph().items())
        for target, line in sorted(targets.items())
        if PACKAGES.index(target.split(".")[0]) > PACKAGES.index(module.split(".")[0])
    ]
    assert not bad, "\n".join(bad)


def test_errors_and_config_import_no_package_of_moejax():
    """``config`` builds on the leaves only: ``errors`` and ``schema`` (the declarations of the
    model.* keys, which it generates their checks from), and ``configs`` (the built-in config files
    ``load`` finds by name); they import nothing from moejax."""
    graph = import_graph()
    assert graph["moejax.errors"] == {}
    assert graph["moejax.schema"] == {}
    assert graph["moejax.configs"] == {}
    assert set(graph["moejax.config"]) == {"moejax.errors", "moejax.schema", "moejax.configs"}


def test_the_model_imports_nothing_from_data_train_or_above():
    """moejax.model builds on errors, schema, config and sharding only: not on data, train, the
    composed checks, eval, interop or the command line."""
    allowed = ("moejax.errors", "moejax.schema", "moejax.config", "moejax.sharding", "moejax.model")
    bad = [
        f"{module} imports {target} (line {line})"
        for module, targets in sorted(import_graph().items()) if module.startswith("moejax.model")
        for target, line in sorted(targets.items())
        if not any(target == a or target.startswith(a + ".") for a in allowed)
    ]
    assert not bad, "\n".join(bad)


def test_generation_and_evaluation_run_one_way():
    """The ``generate`` command sits on top: it opens a checkpoint with ``moejax.load`` and decodes
    with the evaluation's KV-cache generator (``moejax.eval.generator``). Nothing below it (the
    evaluation, ``moejax.trained``) imports ``moejax.generate`` back."""
    graph = import_graph()
    bad = [
        f"{module} imports moejax.generate (line {targets['moejax.generate']})"
        for module, targets in sorted(graph.items())
        if "moejax.generate" in targets and module not in ("moejax.cli", "moejax.__main__")
    ]
    assert not bad, "\n".join(bad)
    assert {"moejax.trained", "moejax.eval.generator"} <= set(graph["moejax.generate"])


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_moejax_uses(source: str) -> list[str]:
    """Where ``source`` uses a private moejax name: ``from moejax.x import _y``, a private module
    in an import, or ``m._y`` / ``m.sub._y`` on a name bound to a moejax module (by any import in
    the file). Private attributes of objects moejax returns are not seen."""
    tree = ast.parse(source)
    found, modules = set(), {}  # modules: local name -> the moejax module it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "moejax":
                    if any(map(_private, alias.name.split("."))):
                        found.add(f"line {node.lineno}: import {alias.name}")
                    modules[alias.asname or "moejax"] = alias.name if alias.asname else "moejax"
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "moejax":
            for alias in node.names:
                if any(map(_private, node.module.split("."))) or _private(alias.name):
                    found.add(f"line {node.lineno}: from {node.module} import {alias.name}")
                if f"{node.module}.{alias.name}" in MOEJAX:
                    modules[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            chain, value = [node.attr], node.value
            while isinstance(value, ast.Attribute):
                chain.append(value.attr)
                value = value.value
            if isinstance(value, ast.Name) and value.id in modules:
                chain.reverse()
                dotted = modules[value.id]
                for depth, attr in enumerate(chain):  # down the chain while it names modules
                    if _private(attr):
                        used = ".".join([value.id, *chain[:depth + 1]])
                        found.add(f"line {node.lineno}: {used} ({dotted}.{attr})")
                        break
                    if f"{dotted}.{attr}" not in MOEJAX:
                        break
                    dotted = f"{dotted}.{attr}"
    return sorted(found)


def test_private_name_detection():
    uses = private_moejax_uses(
        "import moejax.eval.restore\n"
        "from moejax.eval import restore\n"
        "from moejax import config as config_lib\n"
        "from moejax.train.checkpoint import describe_mismatch, _hidden\n"
        "from moejax.eval.__main__ import main\n"
        "def f(x):\n"
        "    restore.open_run(x)._private_attr_of_a_result, restore.read_meta(x)\n"
        "    return restore._read(x).y, config_lib._fail, moejax.eval.restore._read, x._anything\n"
    )
    assert uses == [
        "line 4: from moejax.train.checkpoint import _hidden",
        "line 8: config_lib._fail (moejax.config._fail)",
        "line 8: moejax.eval.restore._read (moejax.eval.restore._read)",
        "line 8: restore._read (moejax.eval.restore._read)",
    ]


@pytest.mark.parametrize("package", ["data_mixture", "experiments"])
def test_data_mixture_and_experiments_use_public_moejax_names_only(package):
    bad = [
        f"{os.path.relpath(path, ROOT)}: {use}"
        for path in sorted(_modules(package).values())
        for use in private_moejax_uses(open(path, encoding="utf-8").read())
    ]
    assert not bad, "make these names public in moejax (or stop using them):\n" + "\n".join(bad)
