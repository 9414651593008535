"""The notebooks (jupytext percent format) run end to end as notebooks, on a small synthetic table.

Each ``.py`` is converted by jupytext to an ``.ipynb`` and executed by nbclient in a real Jupyter
kernel (ipykernel, this Python), from the notebooks' directory, as Jupyter runs it for a user who
opens it; the executed notebook (outputs included) and its plots are saved in the test's temp
directory. Fast settings via the notebooks' environment variables, which the kernel inherits: the
``regmix_linear`` law (fits in milliseconds) and 4 random starts; the notebooks' defaults (every
law, 64 starts, the ladder table) are what a user gets.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

NOTEBOOKS = Path(__file__).resolve().parents[1] / "data_mixture" / "notebooks"
DOMAINS = ("code", "prose", "math")


def _write_table(path: Path, largest_runs: int = 6) -> None:
    rng = np.random.default_rng(0)
    header = ["run", "params_total", "params_active", "tokens", *[f"mix:{d}" for d in DOMAINS],
              "loss:code", "loss:math", "bench:qa", "bench:arith"]
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        for si, n in enumerate((1e5, 3e5, 1e6)):
            for k in range(6 if n < 1e6 else largest_runs):
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
    ("mixture_vs_size", ["optimal_vs_size.png", "loss_code_vs_code.png", "loss_math_vs_math.png"]),  # every domain
    ("bench_curves", ["bench_qa.png", "bench_arith.png"]),
])
def test_notebook_runs_end_to_end_in_a_kernel(env, name, figures):
    printed = _execute(name, env)
    if name == "fit_and_compare":  # the kernel read the test's table, not the committed ladder
        assert str(env.parent / "runs.csv") in printed, printed[:2000]
    for fig in figures:
        assert (env / fig).stat().st_size > 1000


def test_an_undefined_statistic_prints_na_and_figures_go_beside_the_table(tmp_path, monkeypatch):
    """Two runs at the held-out size: no Spearman there. Without DM_OUT the figures go beside the
    user's table, not into the checkout."""
    _write_table(tmp_path / "runs.csv", largest_runs=2)
    for key, value in {"DM_RUNS": str(tmp_path / "runs.csv"), "DM_LAWS": "regmix_linear", "DM_STARTS": "4",
                       "MPLBACKEND": "Agg"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("DM_OUT", raising=False)
    printed = _execute("fit_and_compare", tmp_path)
    assert "regmix_linear: spearman n/a, pick regret" in printed, printed[-2000:]
    assert (tmp_path / "dm_notebooks" / "pred_vs_obs.png").stat().st_size > 1000


def _execute(name: str, out: Path) -> str:
    """Runs notebook ``name`` in a kernel, saves it executed into ``out``; returns what it printed."""
    jupytext = pytest.importorskip("jupytext")
    nbclient = pytest.importorskip("nbclient")
    nbformat = pytest.importorskip("nbformat")
    pytest.importorskip("ipykernel")

    nb = jupytext.read(NOTEBOOKS / f"{name}.py")
    assert nb.metadata["kernelspec"]["name"] == "python3"  # jupyter_client runs it with this Python
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(NOTEBOOKS)}})
    client.execute()  # raises CellExecutionError, with the cell and its traceback, if a cell fails
    out.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, out / f"{name}.ipynb")
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    printed = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "wrote" in printed, printed[:2000]
    return printed


def test_notebooks_are_jupytext_percent_format():
    import jupytext

    for path in sorted(NOTEBOOKS.glob("[!_]*.py")):
        nb = jupytext.read(path)
        kinds = {c.cell_type for c in nb.cells}
        assert kinds == {"markdown", "code"}, path
