"""lm-eval's results table (the columns of ``lm_eval.utils.make_table``), as Markdown, in this process.

``make_table`` formats through pytablewriter; the version pinned in ``constraints.txt`` (0.38) names
its columns A, B, C ... instead of lm-eval's headers and formats the cells in a pool of forked
processes, which a process running JAX (multithreaded) must not do. This module writes the same
rows with plain string formatting.
"""

from __future__ import annotations

from typing import Any

HEADERS = ("Tasks", "Version", "Filter", "n-shot", "Metric", "", "Value", "", "Stderr")
ARROWS = {True: "↑", False: "↓"}


def results_table(results: dict[str, Any], column: str = "results") -> str:
    """One row per (task, metric, filter) of ``results[column]``, in lm-eval's order and columns."""
    headers = ("Groups", *HEADERS[1:]) if column == "groups" else HEADERS
    rows = []
    for key, values in results[column].items():
        values = dict(values)
        name = values.pop("alias", key)
        for dropped in ("name", "sample_len", "sample_count"):
            values.pop(dropped, None)
        version = str(results.get("versions", {}).get(key, "N/A"))
        shots = str(results.get("n-shot", {}).get(key, ""))
        better = results.get("higher_is_better", {}).get(key, {})
        for metric_filter, value in sorted(values.items()):
            metric, _, filter_name = metric_filter.partition(",")
            if metric.endswith("_stderr"):
                continue
            stderr = values.get(f"{metric}_stderr,{filter_name}")
            rows.append([name, version, filter_name, shots, metric, ARROWS.get(better.get(metric), ""),
                         _number(value), "±" if stderr is not None else "", _number(stderr)])
            name = version = ""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    line = lambda cells: "|" + "|".join(f" {c:<{w}} " for c, w in zip(cells, widths)) + "|"
    return "\n".join([line(headers), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)])


def _number(value: Any) -> str:
    if value is None:
        return ""
    return f"{value:.4f}" if isinstance(value, float) else str(value)
