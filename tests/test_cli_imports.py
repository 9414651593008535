"""``--help`` and usage errors answer at once: no command imports JAX (or numpy, scipy) before it
needs them: not for ``--help``, a missing flag, or a flag value in the wrong form (``--fix beta``).

Each check runs in a fresh interpreter and reads its ``sys.modules`` (``-X importtime`` for the
``python -m`` forms), so an import added at the top of a command module, or of a module the
package's ``__init__`` pulls in, fails here with the command that brought it.
"""

from __future__ import annotations

import json
import subprocess
import sys

from data_mixture.__main__ import COMMANDS

HEAVY = ("jax", "jaxlib", "flax", "optax", "numpy", "scipy")

# Every data_mixture command's --help, its usage error (required flags missing), and flag values in
# the wrong form, in one process; prints, per step, the heavy modules imported so far.
PROBE = f"""
import json, os, sys, contextlib, io, tempfile
from data_mixture.__main__ import main
tmp = tempfile.mkdtemp()
with open(os.path.join(tmp, "candidates.json"), "w") as f:
    json.dump({{"a": {{"code": 1.0}}}}, f)
out = os.path.join(tmp, "out.json")
bad_values = [
    ["fit", "--runs", "r.csv", "--law", "camel", "--out", out, "--fix", "beta"],
    ["optimize", "--fit", "f.json", "--size", "1e6", "--tokens", "1e8", "--out", out, "--min-weight", "code"],
    ["plan", "--budget-flops", "1e15", "--target-size", "1e6", "--target-tokens", "1e8", "--out", out,
     "--tokens-per-param", "a"],
    ["register", "--rule", "r", "--candidates", os.path.join(tmp, "candidates.json"), "--fits", "x", "--out", out],
    ["mergemix", "--base", "b", "--domains", "a,b", "--expert-tokens", "1e4", "--out", tmp, "--fractions", "a"],
]
steps = {{}}
for argv in ([["--help"], []] + [[c, "--help"] for c in {COMMANDS!r}] + [[c] for c in {COMMANDS!r} if c != "laws"]
             + bad_values):
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
        try:
            main(argv)
        except SystemExit as e:
            assert e.code in (0, 2), (argv, e.code, err.getvalue())
            assert e.code == 0 or "error:" in err.getvalue(), (argv, err.getvalue())
    steps[" ".join(argv) or "(no command)"] = sorted(m for m in {HEAVY!r} if m in sys.modules)
print(json.dumps(steps))
"""


def test_no_data_mixture_help_or_usage_error_imports_jax():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    steps = json.loads(out.stdout)
    assert len(steps) == 2 + 2 * len(COMMANDS) - 1 + 5
    heavy = {argv: mods for argv, mods in steps.items() if mods}
    assert not heavy, f"imported before a command needs them (first: {next(iter(heavy))}): {heavy}"


def _imported(args: list[str]) -> set[str]:
    """Top-level packages a ``python -X importtime ARGS`` process imported."""
    out = subprocess.run([sys.executable, "-X", "importtime", *args], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = [line.split("|")[-1].strip() for line in out.stderr.splitlines() if line.startswith("import time:")]
    return {name.split(".")[0] for name in lines}


def test_python_m_help_of_both_commands_imports_no_jax():
    for args in (["-m", "data_mixture", "--help"], ["-m", "data_mixture", "fit", "--help"], ["-m", "moejax", "--help"]):
        assert not _imported(args) & set(HEAVY), args


def test_the_package_imports_lazily_and_its_public_names_still_import():
    code = "import json, sys, data_mixture; print(json.dumps(sorted(m for m in %r if m in sys.modules)))" % (HEAVY,)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(out.stdout) == []
    import data_mixture
    from data_mixture import LAWS, Fit, fit_table, get_law  # the names notebooks and studies import
    from data_mixture.fit import Fit as defined

    assert Fit is defined and callable(fit_table) and get_law("camel").name == "camel" and "camel" in LAWS
    assert all(getattr(data_mixture, name) is not None for name in data_mixture.__all__)
