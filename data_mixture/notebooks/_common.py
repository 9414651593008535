"""Shared setup of the notebooks: which runs table, which laws, where figures go (environment variables).

``DM_RUNS``: runs-table CSV (default: the committed moejax ladder, experiments/studies/results/ladder_runs.csv);
``DM_LAWS``: comma-separated laws to compare; ``DM_LAW``: the one law of the single-law notebooks;
``DM_STARTS``: random starts per fit; ``DM_OUT``: directory for figures (default: ``dm_notebooks/``
beside ``DM_RUNS`` when it is set, else ``$MOEJAX_CACHE/dm_notebooks``, ``~/.cache/moejax/dm_notebooks``
without it: never inside the checkout); ``DM_TARGET``: what the mixture is chosen for when it is not
every validation domain, a ``--target`` text (``heldout_qa``, ``code=0.6,prose=0.4``,
``logprob:know_type``; docs/mixture/tables.md, "Targets"): the notebooks fit and score the laws on it
alone (:func:`target_table`). ``fmt`` prints a statistic, or ``n/a`` where it is undefined.
The tests run every notebook through a Jupyter kernel on a small synthetic table with fast settings.

The notebooks are jupytext percent-format ``.py`` files. To open them in Jupyter: ``pip install -e
".[notebooks]"`` in the repository, then ``jupyter lab data_mixture/notebooks`` and open a file as a
notebook (right click, "Open With", "Notebook"); each also runs as a script (``python
data_mixture/notebooks/fit_and_compare.py``). They import ``data_mixture`` as an installed package
and this file from the notebook's own directory (a kernel's working directory).
"""

import math
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNS = os.environ.get("DM_RUNS", str(ROOT / "experiments" / "studies" / "results" / "ladder_runs.csv"))
LAWS = [x for x in os.environ.get("DM_LAWS", "additive,regmix_linear,regmix,camel").split(",") if x]
LAW = os.environ.get("DM_LAW", "camel")
STARTS = int(os.environ.get("DM_STARTS", "64"))
if os.environ.get("DM_OUT"):
    OUT = Path(os.environ["DM_OUT"])
elif os.environ.get("DM_RUNS"):  # beside the user's table
    OUT = Path(RUNS).resolve().parent / "dm_notebooks"
else:  # the committed ladder: figures go to the cache, not into the checkout
    OUT = Path(os.environ.get("MOEJAX_CACHE") or Path.home() / ".cache" / "moejax") / "dm_notebooks"
OUT.mkdir(parents=True, exist_ok=True)
TARGET = os.environ.get("DM_TARGET", "") or None


def target_table(table):
    """The table with ``DM_TARGET`` as its one validation domain, or unchanged without one."""
    from data_mixture.target import parse_target

    return parse_target(TARGET).apply(table) if TARGET else table


def fmt(value, spec: str = ".3f") -> str:
    """``value`` formatted with ``spec``, or ``n/a`` where the statistic is undefined (None, NaN), as
    the command line prints it."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    return format(value, spec)
