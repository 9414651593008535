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
# # Loss vs mixture per size, and the optimal mixture vs size
#
# Fit one law (`DM_LAW`, default `camel`) on the whole table, look at how each validation loss
# moves with the share of each training domain at every model size, then ask the law for the best
# mixture at a range of sizes (equal-weight mean of the validation losses, at the table's largest
# tokens-per-parameter ratio). A law whose optimum cannot move with scale (`additive`) draws flat
# bands; CAMEL may not.

# %%
import numpy as np

from _common import LAW, OUT, RUNS, STARTS

from data_mixture.fit import fit_table
from data_mixture.optimize import optimize_mixture
from data_mixture.plots import plot_loss_vs_share, plot_optimal_vs_size
from data_mixture.table import read_runs

table = read_runs(RUNS)
fit = fit_table(table, LAW, bootstrap=0, starts=STARTS, progress=False)
print(f"{LAW} fitted on {len(table)} rows; domains {fit.loss_domains}")

# %% [markdown]
# Parameters held constant (`fit --fix`, or fixed by the law on a table with one token budget
# per size) and fitted parameters at (or within 1 % of) a bound: a parameter on its bound is a
# sign that the table does not identify it, and the curves below inherit that.

# %%
for line in fit.fixed_lines():
    print(line)
print("\n".join(fit.at_bounds_lines()) or "no fitted parameter at a bound")

# %% [markdown]
# ## Loss vs share, per size (points: runs at their last checkpoint; lines: the law)

# %%
for dom in table.loss_domains:  # every validation domain against every training domain's share
    for mix_dom in table.mix_domains:
        print("wrote", plot_loss_vs_share(table, dom, mix_dom, OUT / f"loss_{dom}_vs_{mix_dom}.png", fit=fit))

# %% [markdown]
# ## Optimal mixture vs size

# %%
size = table.size(fit.size_column)
ratio = float(np.max(table.tokens / size))
sizes = np.geomspace(size.min(), size.max() * 100, 6)
weights_sm = []
for n in sizes:
    out = optimize_mixture(fit, size=float(n), tokens=float(ratio * n), starts=4, bootstrap=False)
    weights_sm.append([out["weights"][d] for d in fit.mix_domains])
    print(f"N={n:.3g}: " + ", ".join(f"{d} {w:.3f}" for d, w in out["weights"].items()))
weights_sm = np.array(weights_sm)
print("wrote", plot_optimal_vs_size(sizes, weights_sm, fit.mix_domains, OUT / "optimal_vs_size.png", title=LAW))
