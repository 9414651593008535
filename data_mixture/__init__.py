"""Data-mixture science: runs tables -> mixture laws -> predictions, optimal mixtures, plans.

Pipeline (``docs/data_mixture.md``, the tutorial; reference in ``docs/mixture/``)::

    plan.json --sweep--> workdirs --collect--> runs.csv --fit--> fit.json --predict--> pred.csv
                                                                  \\--optimize--> mixture.json --> launch.sh

CORE modules: ``table`` (runs table), ``laws/`` (one file per law, registry), ``solver``
(the robust multi-start solver every parametric law is fitted with), ``bench_law`` (loss ->
benchmark), ``fit`` (the Fit bundle: a law fitted to every validation domain, its bootstrap).
``data_mixture.recommend(runs, size=..., tokens=..., target=...)`` (``recommendation``) is the
whole path from a runs table to a mixture in one call.

Importing the package imports none of them (nor numpy or JAX): each public name below is imported
from its module on first use (``from data_mixture import fit_table`` works as before), so the
command line's ``--help`` and usage errors answer at once.

The command line (``python -m data_mixture COMMAND``): ``__main__.py`` only dispatches; each
command's flags and body live in ``data_mixture/cli/<command>.py`` (``HELP``, ``EXAMPLE``,
``INTERRUPTED``, ``add_arguments(parser)``, ``run(args)``), which imports its library inside
``run``. A new command is one such module plus its name in ``__main__.COMMANDS``
(:mod:`data_mixture.cli` says more).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from data_mixture.bench_law import BenchFit, fit_bench
    from data_mixture.fit import Fit, fit_table
    from data_mixture.laws import LAWS, Law, LawFit, get_law
    from data_mixture.recommendation import recommend
    from data_mixture.table import RunsTable, TableError, from_columns, read_runs, write_runs

# public name -> the module that defines it (imported on first use)
_PUBLIC = {
    "BenchFit": "bench_law", "fit_bench": "bench_law",
    "Fit": "fit", "fit_table": "fit",
    "LAWS": "laws", "Law": "laws", "LawFit": "laws", "get_law": "laws",
    "recommend": "recommendation",
    "RunsTable": "table", "TableError": "table", "from_columns": "table", "read_runs": "table", "write_runs": "table",
}

__all__ = ["LAWS", "BenchFit", "Fit", "Law", "LawFit", "RunsTable", "TableError", "fit_bench", "fit_table", "from_columns",
           "get_law", "read_runs", "recommend", "write_runs"]


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'data_mixture' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"data_mixture.{_PUBLIC[name]}"), name)
    globals()[name] = value  # the next access is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC})
