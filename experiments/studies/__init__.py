"""Studies: each module answers one question, named after it; experiments/README.md maps each to
its results (``data_mixture/results/<name>/`` for the data-mixture studies, ``results/`` here for
the others) and to the module name it had before."""
