"""The notebooks (jupytext percent format) run end to end as plain scripts on a small synthetic table.

Fast settings via the notebooks' environment variables: the ``regmix_linear`` law (fits in
milliseconds) and 4 random starts; the notebooks' defaults (every law, 64 starts, the ladder
table) are what a user gets.
"""

from __future__ import annotations

import csv
import runpy
import sys
from pathlib import Path

import numpy as np
import pytest

NOTEBOOKS = Path(__file__).resolve().parents[1] / "data_mixture" / "notebooks"
DOMAINS = ("code", "prose", "math")


def _write_table(path: Path) -> None:
    rng = np.random.default_rng(0)
    header = ["run", "params_total", "params_active", "tokens", *[f"mix:{d}" for d in DOMAINS],
              "loss:code", "loss:math", "bench:qa", "bench:arith"]
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        for si, n in enumerate((1e5, 3e5, 1e6)):
            for k in range(6):
                mix = rng.dirichlet(np.ones(3))
                for d in (10 * n, 20 * n):
                    base = 1.5 + 30 / n ** 0.3 + 50 / d ** 0.3
                    lc, lm = base + 0.4 * np.exp(-2 * mix[0]), base + 0.4 * np.exp(-2 * mix[2])
                    qa = 0.25 + 0.5 / (1 + np.exp(5 * (lc - 3.3)))
                    w.writerow([f"s{si}_{k}", n, n, d, *mix, lc, lm, qa, 0.5 / (1 + np.exp(5 * (lm - 3.3)))])


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    out = tmp_path_factory.mktemp("dm_nb")
    _write_table(out / "runs.csv")
    mp = pytest.MonkeyPatch()
    for key, value in {"DM_RUNS": str(out / "runs.csv"), "DM_LAWS": "regmix_linear", "DM_LAW": "regmix_linear",
                       "DM_STARTS": "4", "DM_OUT": str(out / "figs"), "MPLBACKEND": "Agg"}.items():
        mp.setenv(key, value)
    yield out / "figs"
    mp.undo()


@pytest.mark.parametrize("name, figures", [
    ("fit_and_compare", ["pred_vs_obs.png"]),
    ("mixture_vs_size", ["optimal_vs_size.png", "loss_code_vs_code.png"]),
    ("bench_curves", ["bench_qa.png", "bench_arith.png"]),
])
def test_notebook_runs_end_to_end(env, name, figures):
    sys.modules.pop("_common", None)  # re-read the environment
    runpy.run_path(str(NOTEBOOKS / f"{name}.py"), run_name="__main__")
    for fig in figures:
        assert (env / fig).stat().st_size > 1000


def test_notebooks_are_jupytext_percent_format():
    import jupytext

    for path in sorted(NOTEBOOKS.glob("[!_]*.py")):
        nb = jupytext.read(path)
        kinds = {c.cell_type for c in nb.cells}
        assert kinds == {"markdown", "code"}, path
