"""Studies: each module answers one question, named after it; experiments/README.md maps each to
its results (``experiments/studies/results/<name>/``) and to the module name it had before."""

# The held-out windows every committed study evaluated: the first consecutive windows of each
# domain (train.eval_windows=first, the behaviour before the key; new runs sample them across the
# split). Each study that trains runs pins it, so rerunning a study reproduces its committed numbers.
EVAL_WINDOWS = {"train.eval_windows": "first"}

