"""Every runnable example of the docs runs, so a renamed flag breaks the suite, not a user.

How to mark an example (for anyone writing README.md or a page under docs/):

- Put ``<!-- runnable -->`` on the line just before a fenced ```` ```bash ````, ```` ```sh ```` or
  ```` ```python ```` block of README.md or of any ``docs/**/*.md`` page. This test finds every page
  and every marked block by itself: a new page needs nothing else.
- A block that takes more than a few seconds (training, a law fit with bootstrap, an evaluation)
  is marked ``<!-- runnable: slow -->`` instead: it runs only with ``./launch.sh test -m slow``.
  The default suite must stay fast: a default block runs in seconds (``--help``, parsing, a small
  table command).
- The blocks of one page run in page order, in one fresh temporary directory, so a later block may
  read what an earlier one wrote (the default run takes a page's default blocks; the slow run takes
  all its marked blocks). A default block must not need the output of a slow one.
- That directory holds links to the repository's top-level files and folders (not ``runs/``,
  ``results/``, ``datasets/``, ``sweeps/``), so relative paths such as
  ``experiments/studies/results/ladder_runs.csv`` resolve and a block's outputs (``fit.json``,
  ``runs/NAME``) land in the temporary directory. Do not write into a linked folder.
- Blocks see one CPU device, as a user does (not the suite's 8 fake ones), and share the suite's
  compilation cache. Shell blocks run with ``bash -e`` (``-o pipefail``): ``./launch.sh`` is the repository's launch.sh
  with this test's Python (``MOEJAX_PYTHON``), and ``python``, ``moejax`` and ``data-mixture`` are
  this environment's. Python blocks run as a script with this Python. A block passes when it exits
  with status 0; a failure names the page, the block's line and its output.
- Anything else in a marker (``<!-- runnable: slo -->``), or a marker not followed by a block of
  a runnable language, fails ``test_markers_are_well_formed``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MARKER_RE = re.compile(r"^\s*<!--\s*runnable\b(.*?)-->\s*$")
FENCE_RE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)")
LANGUAGES = {"bash": "shell", "sh": "shell", "shell": "shell", "python": "python", "py": "python"}
TIERS = {"": "default", "slow": "slow"}
NOT_LINKED = {"runs", "results", "datasets", "sweeps"}


@dataclass(frozen=True)
class Block:
    page: str  # relative to the repository root
    line: int  # 1-based line of the opening fence
    kind: str  # "shell" or "python"
    tier: str  # "default" or "slow"
    code: str


def pages() -> list[Path]:
    """README.md and every Markdown page under docs/, sorted."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def parse(path: Path, root: Path = ROOT) -> tuple[list[Block], list[str]]:
    """The marked blocks of one page, and a message for each malformed marker."""
    lines = path.read_text(encoding="utf-8").splitlines()
    rel = path.relative_to(root).as_posix()
    blocks: list[Block] = []
    problems: list[str] = []
    for i, text in enumerate(lines):
        marker = MARKER_RE.match(text)
        if not marker:
            continue
        option = marker.group(1).strip().removeprefix(":").strip()
        where = f"{rel}:{i + 1}"
        if option not in TIERS:
            problems.append(f"{where}: marker {text.strip()!r}: allowed: <!-- runnable --> or "
                            "<!-- runnable: slow -->")
            continue
        fence = FENCE_RE.match(lines[i + 1]) if i + 1 < len(lines) else None
        if fence is None or fence.group(3) not in LANGUAGES:
            problems.append(f"{where}: {text.strip()} must be followed, on the next line, by a fenced block "
                            f"of one of {sorted(LANGUAGES)}")
            continue
        indent, ticks = fence.group(1), fence.group(2)
        body: list[str] = []
        for j in range(i + 2, len(lines)):
            if lines[j].strip().startswith(ticks[0] * len(ticks)) and not lines[j].strip().strip(ticks[0]):
                break
            body.append(lines[j][len(indent):] if lines[j].startswith(indent) else lines[j])
        else:
            problems.append(f"{where}: the block after the marker is never closed")
            continue
        blocks.append(Block(rel, i + 2, LANGUAGES[fence.group(3)], TIERS[option], "\n".join(body) + "\n"))
    return blocks, problems


def _all_blocks() -> dict[str, list[Block]]:
    return {path.relative_to(ROOT).as_posix(): parse(path)[0] for path in pages()}


def _cases() -> list:
    cases = []
    for page, blocks in _all_blocks().items():
        if any(b.tier == "default" for b in blocks):
            cases.append(pytest.param(page, "default", id=f"{page}-default"))
        if any(b.tier == "slow" for b in blocks):
            cases.append(pytest.param(page, "slow", id=f"{page}-slow", marks=pytest.mark.slow))
    return cases


def _workspace(tmp: Path) -> dict[str, str]:
    """Links to the repository's top-level entries, a ./launch.sh that runs the repository's with
    this Python, and the environment the blocks run in."""
    for entry in ROOT.iterdir():
        if entry.name.startswith(".") or entry.name in NOT_LINKED or entry.name == "launch.sh":
            continue
        (tmp / entry.name).symlink_to(entry)
    launch = tmp / "launch.sh"
    launch.write_text(f'#!/usr/bin/env bash\nexec {str(ROOT / "launch.sh")!r} "$@"\n')
    launch.chmod(0o755)
    env = dict(os.environ)
    # One CPU device, as a user has (conftest's 8 fake devices are for the in-process tests); the
    # suite's compile settings and caches stay, so a block reuses what the tests compiled.
    env["XLA_FLAGS"] = re.sub(r"--xla_force_host_platform_device_count=\d+", "", env.get("XLA_FLAGS", "")).strip()
    env.update(MOEJAX_PYTHON=sys.executable, MOEJAX_CHECK_PINS="0",
               PATH=os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]))
    return env


def _run(block: Block, cwd: Path, env: dict[str, str]) -> None:
    if block.kind == "shell":
        argv = ["bash", "-e", "-o", "pipefail", "-c", block.code]
    else:
        script = cwd / f"_block_{block.line}.py"
        script.write_text(block.code)
        argv = [sys.executable, str(script)]
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        pytest.fail(f"{block.page}, the {block.kind} block at line {block.line}, exited with status "
                    f"{proc.returncode}:\n{block.code}\n--- stdout (end) ---\n{proc.stdout[-3000:]}\n"
                    f"--- stderr (end) ---\n{proc.stderr[-3000:]}", pytrace=False)


def test_markers_are_well_formed():
    problems = [p for path in pages() for p in parse(path)[1]]
    assert not problems, "\n".join(problems)


def test_the_parser_finds_marked_blocks(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("text\n<!-- runnable -->\n```bash\necho one\n```\n\n```bash\necho unmarked\n```\n"
                    "<!--runnable: slow-->\n```python\nprint(2)\n```\n<!-- runnable: slo -->\n```bash\nx\n```\n"
                    "<!-- runnable -->\ntext\n")
    blocks, problems = parse(page, root=tmp_path)
    assert [(b.line, b.kind, b.tier, b.code) for b in blocks] == [
        (3, "shell", "default", "echo one\n"), (11, "python", "slow", "print(2)\n")]
    assert len(problems) == 2 and "runnable: slo" in problems[0] and "page.md:18" in problems[1]


def test_the_front_pages_stay_short():
    """The README is read in five minutes and the mixture tutorial is one page: details go to the
    pages they link, dated measurements to experiments/benchmarks/LOG.md."""
    for page, limit in (("README.md", 150), ("docs/data_mixture.md", 200)):
        lines = len((ROOT / page).read_text(encoding="utf-8").splitlines())
        assert lines <= limit, f"{page} has {lines} lines; at most {limit}: move details to a linked page"


def test_the_readme_workflows_are_marked():
    """The README's three workflows stay runnable: each has marked blocks."""
    blocks = parse(ROOT / "README.md")[0]
    assert len(blocks) >= 4
    text = "".join(b.code for b in blocks)
    for command in ("moejax.data.prepare", "data_mixture recommend", "moejax.eval"):
        assert command in text, command


@pytest.mark.parametrize(("page", "tier"), _cases())
def test_docs_examples_run(page, tier, tmp_path):
    env = _workspace(tmp_path)
    for block in _all_blocks()[page]:
        if tier == "slow" or block.tier == "default":
            _run(block, tmp_path, env)


# ---- links: every relative link of README.md and docs/ leads to a file, and an anchor to a heading ----

LINK_RE = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCED_RE = re.compile(r"^(`{3,}|~{3,}).*?^\1", re.M | re.S)


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading: lower case, punctuation but '-' and '_' dropped,
    spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _prose(path: Path) -> str:
    """The page with its fenced blocks blanked (their lines kept, so line numbers stay right)."""
    return FENCED_RE.sub(lambda m: "\n" * m.group(0).count("\n"), path.read_text(encoding="utf-8"))


def anchors(path: Path) -> set[str]:
    text = _prose(path)
    return {github_anchor(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.*?)\s*#*\s*$", text, re.M)}


def broken_links(path: Path) -> list[str]:
    text = _prose(path)
    problems = []
    for match in LINK_RE.finditer(text):
        target = match.group(1)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        line = text[:match.start()].count("\n") + 1
        where = f"{path.relative_to(ROOT).as_posix()} (line {line}): link {target!r}"
        if not dest.exists():
            problems.append(f"{where}: no file {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            problems.append(f"{where}: {dest.name} has no heading with anchor #{anchor}")
    return problems


def test_the_anchor_rule():
    assert github_anchor("The headroom study (`experiments/studies/results/headroom_v1/`)") == \
        "the-headroom-study-experimentsstudiesresultsheadroom_v1"
    assert github_anchor("11. Headline figures moved from the README (2026-12-06)") == \
        "11-headline-figures-moved-from-the-readme-2026-12-06"


def test_docs_links_resolve():
    """A renamed page or heading breaks the suite, not a reader's click."""
    targets = [*pages(), ROOT / "experiments" / "README.md", ROOT / "experiments" / "benchmarks" / "README.md"]
    problems = [p for path in targets for p in broken_links(path)]
    assert not problems, "\n".join(problems)


def test_docs_pages_named_in_code_exist():
    """A docs page that a docstring, help text or message names exists."""
    named = re.compile(r"\bdocs/[\w/.-]+?\.md\b")
    missing = []
    for package in ("moejax", "data_mixture", "experiments", "tests"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                missing += [f"{path.relative_to(ROOT)}:{number}: {page}" for page in named.findall(line)
                            if not (ROOT / page).is_file()]
    assert not missing, "pages named but missing:\n" + "\n".join(missing)
