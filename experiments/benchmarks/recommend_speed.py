"""Wall time of ``recommend`` (every law the table supports, the baselines, the best law's bootstrap
fit and its robust pick) on a 50-run, 4-domain table.

    ./launch.sh python -m experiments.benchmarks.recommend_speed [--sizes 2] [--out results/recommend_speed.json]

The table (:func:`data_mixture.synthetic.user_style_table`): 4 training domains (web, books,
code, math; books scarce, 2e6 unique tokens), 50 runs -- 25 mixtures (uniform + Dirichlet(1)) at
each of 2 sizes (``--sizes 3``: 17 mixtures at 3 sizes, 51 runs), 2 checkpoints each, one seed --
and a held-out target ``heldout`` no run trains on. A 2-size table is scored out of fold
(``kfold=5``), a 3-size one with the largest size held out. ``recommend`` runs with its defaults
(16 starts per fit, 1,000 decision resamples, 50 bootstrap members) in this fresh process, so the
figure includes jit compilation as a CLI call does. Recorded: wall and process CPU seconds, the
machine's load average before and after, the laws scored and the recommendation.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

from data_mixture.recommendation import recommend
from data_mixture.synthetic import user_style_table
from experiments.benchmarks.timing import write_json

DOMAINS = ("web", "books", "code", "math")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=int, choices=(2, 3), default=2)
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "recommend_speed.json"))
    args = p.parse_args(argv)
    sizes, mixtures = ((2e5, 6e5), 25) if args.sizes == 2 else ((1e5, 3e5, 1e6), 17)
    table = user_style_table(DOMAINS, sizes=sizes, mixtures=mixtures, seed=0)
    load0 = os.getloadavg()
    c0, t0 = time.process_time(), time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        result = recommend(table, size=2e6, tokens=4e7, target="heldout", unique_tokens={"books": 2e6},
                           out=Path(tmp) / "rec", progress=True)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    out = {"runs": int(len(set(table.run.tolist()))), "rows": len(table), "domains": len(DOMAINS), "sizes": list(sizes),
           "wall_s": wall, "process_cpu_s": cpu, "load_before": load0, "load_after": os.getloadavg(),
           "cpus": os.cpu_count(), "machine": platform.machine(), "holdout": result["holdout"],
           "laws_scored": {n: a for n, a in result["decision_accuracy"]["laws"].items()},
           "laws_skipped": result["laws_skipped"], "recommended": result["source"], "weights": result["weights"],
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    print(json.dumps(out, indent=1))
    write_json(args.out, out, indent=1)


if __name__ == "__main__":
    main()
