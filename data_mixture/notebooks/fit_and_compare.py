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
# # Fitting and comparing mixture laws
#
# Fit every law on the same rows of a runs table and score them where they were not fitted:
# leave one scale out (fit below the largest model size, predict the largest). Set `DM_RUNS` to
# your own table; the default is the moejax ladder committed in `experiments/studies/results/`. Set
# `DM_TARGET` (e.g. `heldout_qa` or `code=0.6,prose=0.4`) to score the laws on a target that is
# not the training mix.

# %%
from _common import LAWS, OUT, RUNS, STARTS, TARGET, fmt, target_table

from data_mixture.evaluate import evaluate_laws, format_report
from data_mixture.laws import LAWS as REGISTERED
from data_mixture.plots import plot_pred_vs_obs
from data_mixture.table import read_runs

table = target_table(read_runs(RUNS))  # DM_TARGET: score the laws on that target alone
print(f"target: {TARGET or 'every validation domain'}")
print(f"{RUNS}: {len(table)} rows, {len(set(table.run))} runs, sizes {sorted(set(table.params_total))}")
laws = [law for law in LAWS if law in REGISTERED]
print("laws:", laws)

# %% [markdown]
# ## Leave one scale out

# %%
report = evaluate_laws(table, laws, holdout="largest", starts=STARTS)
print(format_report(report))

# %% [markdown]
# ## Predicted vs observed at the held-out size

# %%
png = plot_pred_vs_obs(report, OUT / "pred_vs_obs.png")
print("wrote", png)

# %% [markdown]
# Which law ranks the mixtures best where it was not fitted (Spearman of the mean loss), and how
# far is the mixture it would pick from the best tested one (pick regret)?

# %%
for name, entry in report["laws"].items():
    if "skipped" in entry:
        print(f"{name}: skipped ({entry['skipped']})")
    else:
        print(f"{name}: spearman {fmt(entry['mean']['spearman_of_mean_loss'])}, "
              f"pick regret {fmt(entry['pick_regret'], '.4f')}, "
              f"optimal mixture {', '.join(f'{d} {w:.2f}' for d, w in entry['optimal_mixture'].items())}")
