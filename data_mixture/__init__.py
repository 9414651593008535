"""Data-mixture science: runs tables -> mixture laws -> predictions, optimal mixtures, plans.

Pipeline (``docs/data_mixture.md``, the tutorial; reference in ``docs/mixture/``)::

    plan.json --sweep--> workdirs --collect--> runs.csv --fit--> fit.json --predict--> pred.csv
                                                                  \\--optimize--> mixture.json --> launch.sh

CORE modules: ``table`` (runs table), ``laws/`` (one file per law, registry), ``solver``
(the robust multi-start solver every parametric law is fitted with), ``bench_law`` (loss ->
benchmark), ``fit`` (the Fit bundle: a law fitted to every validation domain, its bootstrap).
"""

from data_mixture.bench_law import BenchFit, fit_bench
from data_mixture.fit import Fit, fit_table
from data_mixture.laws import LAWS, Law, LawFit, get_law
from data_mixture.table import RunsTable, TableError, from_columns, read_runs, write_runs

__all__ = [
    "LAWS",
    "BenchFit",
    "Fit",
    "Law",
    "LawFit",
    "RunsTable",
    "TableError",
    "fit_bench",
    "fit_table",
    "from_columns",
    "get_law",
    "read_runs",
    "write_runs",
]
