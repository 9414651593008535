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
# # A trained checkpoint in Python: `moejax.load`
#
# Train something first (`./launch.sh --config.train.steps=20` writes `runs/tiny_moe`), then run
# this notebook (or `./launch.sh python experiments/notebooks/load_checkpoint.py`). `MOEJAX_WORKDIR`
# names another run; relative paths are relative to the directory you start from.

# %%
import os

import numpy as np

import moejax

workdir = os.environ.get("MOEJAX_WORKDIR", "runs/tiny_moe")
model = moejax.load(workdir)  # the latest checkpoint; moejax.load(workdir, step=N) for another
print(model, "| context", model.max_len, "| layers", model.config.model.num_layers)

# %% [markdown]
# ## Tokens and next-token logits
# `model.tokenizer` is the run's own tokenizer; `model.logits(ids)` gives `[T, V]` (row t predicts
# token t + 1), `[B, T, V]` for a batch.

# %%
ids = model.tokenizer.encode("def add(a, b):\n    return")
logits = model.logits(ids)
top = np.argsort(logits[-1])[::-1][:5]
print("after the prompt, the most likely next tokens:", [model.tokenizer.decode([int(t)]) for t in top])

# %% [markdown]
# ## Loss of any text (nats per token) and a continuation

# %%
for text in ("def add(a, b):\n    return a + b\n", "The quick brown fox jumps over the lazy dog."):
    print(f"{model.loss(text):.3f} nats/token  {text!r}")
print(repr(model.generate("Q: What is 2 + 3?\nA:", max_new_tokens=8)))
