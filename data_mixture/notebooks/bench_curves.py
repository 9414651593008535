# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Loss-to-benchmark curves
#
# Per benchmark task of the table, fit the sigmoid law `acc = floor + (ceiling - floor) / (1 +
# exp(k (L - L0)))` on the loss that feeds it (one domain or a fitted combination, chosen by BIC),
# and draw it over the observed scores. On the moejax ladder the models are far too small to beat
# chance (0.25 for the multiple-choice tasks, 0 for math exact match): expect flat curves there.

# %%
import numpy as np

from _common import OUT, RUNS, STARTS

from data_mixture.bench_law import MIN_SCORES, fit_bench
from data_mixture.plots import plot_bench_curves
from data_mixture.table import read_runs

table = read_runs(RUNS)
CHANCE = {"code": 0.25, "prose": 0.25, "knowledge": 0.25, "math": 0.0}
print("tasks:", table.bench_tasks)

# %%
for j, task in enumerate(table.bench_tasks):
    have = np.isfinite(table.bench_rt[:, j])
    if have.sum() < MIN_SCORES:
        print(f"{task}: {int(have.sum())} scores, too few for a law")
        continue
    bf = fit_bench(table, task, chance=CHANCE.get(task), starts=STARTS)
    w = np.array([bf.params["weights"][d] for d in bf.loss_domains])
    loss_r = table.loss_rv[have] @ w
    grid = np.linspace(loss_r.min() - 0.3, loss_r.max() + 0.3, 100)
    # Evaluate the law along the combined loss: any loss vector with that weighted value gives it.
    curve = bf.predict(np.repeat(grid[:, None], len(bf.loss_domains), axis=1))
    print(f"{task}: floor {bf.params['floor']:.3f}, ceiling {bf.params['ceiling']:.3f}, k {bf.params['k']:.3g}, "
          f"L0 {bf.params['L0']:.3f}, weights {bf.params['weights']}")
    print("wrote", plot_bench_curves(loss_r, table.bench_rt[have, j], grid, curve, task, OUT / f"bench_{task}.png"))
