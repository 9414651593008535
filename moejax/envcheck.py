"""Does a Python environment have what moejax needs, at the versions constraints.txt pins?

``launch.sh`` runs this (as a file, with the standard library only, so it works in an environment
that lacks half of moejax's packages) on the Python that ``MOEJAX_PYTHON`` names, before every
command, and on its own ``./.venv`` after installing into it:

    python moejax/envcheck.py check [--extras dev] [--label TEXT]
        Exit 0 when every requirement of the base install (plus the extras named) is installed at
        its pinned version; else exit 2 with one paragraph naming what is missing and what is at
        the wrong version, and the command that fixes it.
    python moejax/envcheck.py list [--extras dev]
        The requirement names of the base install plus those extras, one a line.
    python moejax/envcheck.py lock REPORT.json
        constraints.txt's pins from a ``pip install --dry-run --report REPORT.json`` resolution
        (docs/install.md, "Updating the pins").

The requirements are pyproject.toml's (ranges); the pins are constraints.txt's (exact versions,
the tested set). A pinned package must be at its pinned version; a local version label does not
count (``torch 2.13.0+cpu`` is ``torch==2.13.0``), so a CPU, CUDA or ROCm build of the pinned
release passes. Only the project's own requirements are checked, not what they pull in: an
environment made for an accelerator (``jax[cuda12]``) may hold other versions of those.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import os
import re
import sys
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYPROJECT = os.path.join(ROOT, "pyproject.toml")
CONSTRAINTS = os.path.join(ROOT, "constraints.txt")
PROJECT = "moejax"

_REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*([^;]*?)\s*(?:;\s*(.*))?$")


def normalize(name: str) -> str:
    """PEP 503 name: ``Ml_Collections`` -> ``ml-collections``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def public(version: str) -> str:
    """A version without its local label: ``2.13.0+cpu`` -> ``2.13.0``."""
    return version.split("+", 1)[0]


def _packaging(module: str) -> Any:
    """``packaging.<module>``, else pip's vendored copy, else None (the standard library alone)."""
    for name in (f"packaging.{module}", f"pip._vendor.packaging.{module}"):
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    return None


def _marker_holds(marker: str | None) -> bool:
    if not marker:
        return True
    markers = _packaging("markers")
    if markers is not None:
        return markers.Marker(marker).evaluate()
    match = re.fullmatch(r"\s*sys_platform\s*(==|!=)\s*['\"]([^'\"]+)['\"]\s*", marker)
    if match:  # the only marker pyproject.toml uses; without packaging, others count as true
        return (sys.platform == match.group(2)) == (match.group(1) == "==")
    return True


def _project() -> dict:
    import tomllib  # Python 3.11+, which launch.sh checks first

    with open(PYPROJECT, "rb") as f:
        return tomllib.load(f)["project"]


def requirements(extras: list[str]) -> dict[str, str]:
    """{normalised name: requirement text} of the base install plus ``extras`` (the project's own
    extras that an extra names, ``moejax[hf]``, expanded), markers applied."""
    project = _project()
    optional = project.get("optional-dependencies", {})
    unknown = [e for e in extras if e not in optional]
    if unknown:
        raise SystemExit(f"envcheck: unknown extra(s) {', '.join(unknown)}; pyproject.toml has: {', '.join(optional)}")
    out: dict[str, str] = {}
    pending, seen = list(project["dependencies"]) + [r for e in extras for r in optional[e]], set(extras)
    while pending:
        text = pending.pop(0)
        match = _REQUIREMENT.match(text)
        if not match:
            raise SystemExit(f"envcheck: cannot read the requirement {text!r} in pyproject.toml")
        name, extra_text, _, marker = match.groups()
        if not _marker_holds(marker):
            continue
        if normalize(name) == PROJECT:
            for extra in (extra_text or "[]")[1:-1].split(","):
                extra = extra.strip()
                if extra and extra not in seen:
                    seen.add(extra)
                    pending += optional[extra]
            continue
        out.setdefault(normalize(name), text)
    return out


def pins(path: str = CONSTRAINTS) -> dict[str, str]:
    """{normalised name: version} of the ``name==version`` lines of a constraints file."""
    out = {}
    with open(path) as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            name, sep, version = line.split(";", 1)[0].partition("==")
            if sep:
                out[normalize(name.strip())] = version.strip()
    return out


def _satisfies(version: str, requirement: str) -> bool:
    """Does ``version`` meet the range in ``requirement`` (True when packaging is unavailable)."""
    parsing = _packaging("requirements")
    if parsing is None:
        return True
    return parsing.Requirement(requirement).specifier.contains(version, prereleases=True)


def problems(extras: list[str]) -> tuple[list[str], list[str]]:
    """(missing packages, 'name X (pinned Y)' for those at another version) in this Python."""
    pinned = pins()
    missing, wrong = [], []
    for name, requirement in sorted(requirements(extras).items()):
        try:
            have = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(name)
            continue
        want = pinned.get(name)
        if want is not None and public(have) != public(want):
            wrong.append(f"{name} {have} (pinned {want})")
        elif want is None and not _satisfies(have, requirement):
            wrong.append(f"{name} {have} (needs {requirement})")
    return missing, wrong


def _check(args: argparse.Namespace) -> int:
    missing, wrong = problems(args.extras)
    if not missing and not wrong:
        return 0
    spec = f".[{','.join(args.extras)}]" if args.extras else "."
    parts = []
    if missing:
        parts.append(f"missing: {', '.join(missing)}")
    if wrong:
        parts.append(f"at the wrong version: {', '.join(wrong)}")
    sys.stderr.write(
        f"launch.sh: error: {args.label} ({sys.executable}) does not have what moejax needs"
        f"{' for ' + args.purpose if args.purpose else ''}, pinned in constraints.txt: {'; '.join(parts)}. "
        f"Install them into it with: {sys.executable} -m pip install -c constraints.txt -e '{spec}' "
        "(keep an accelerator build of jax by adding it to that command, e.g. \"jax[cuda12]==0.10.2\"), "
        "or set MOEJAX_CHECK_PINS=warn to run anyway.\n")
    return 2


def _list(args: argparse.Namespace) -> int:
    for name in requirements(args.extras):
        print(name)
    return 0


def _lock(args: argparse.Namespace) -> int:
    """constraints.txt's pins from a pip --report: every package the resolution installs, but the
    project itself; local version labels dropped (``torch==2.13.0`` matches the CPU build)."""
    with open(args.report) as f:
        report = json.load(f)
    rows = {}
    for item in report["install"]:
        meta = item["metadata"]
        if normalize(meta["name"]) != PROJECT:
            rows[normalize(meta["name"])] = public(meta["version"])
    for name in sorted(rows):
        print(f"{name}=={rows[name]}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="envcheck", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="is this Python's environment at the pins?")
    check.add_argument("--label", default="this Python", help="how to name the environment in the message")
    check.add_argument("--purpose", default="", help="what it is for, e.g. 'the test suite'")
    listing = sub.add_parser("list", help="the requirement names of the base install plus extras")
    for p in (check, listing):
        p.add_argument("--extras", default="", type=lambda s: [e for e in s.split(",") if e],
                       help="comma-separated extras, e.g. dev")
    lock = sub.add_parser("lock", help="constraints lines from a pip --report JSON")
    lock.add_argument("report")
    args = parser.parse_args(argv)
    return {"check": _check, "list": _list, "lock": _lock}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
