"""Studies: each module answers one question, named after it; experiments/README.md maps each to
its results (``experiments/studies/results/<name>/``) and to the module name it had before."""
