"""Data-mixture science: runs tables -> mixture laws -> predictions, optimal mixtures, plans.

Pipeline (``docs/data_mixture.md``)::

    plan.json --sweep--> workdirs --collect--> runs.csv --fit--> fit.json --predict--> pred.csv
                                                                  \\--optimize--> mixture.json --> launch.sh
"""

from data_mixture.table import RunsTable, TableError, from_columns, read_runs, write_runs

__all__ = ["RunsTable", "TableError", "from_columns", "read_runs", "write_runs"]
