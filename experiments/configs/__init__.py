"""The repository's experiment configs: ``./launch.sh experiments/configs/<name>.py``.

Each file here re-exports a built-in config of the package (``moejax/configs/<name>.py``), so the
repository path and the installed name (``moejax train <name>``) load the same file. They lived
in ``experiments/`` itself before (``experiments/tiny_moe.py``); that path still works, from
``launch.sh``, ``python -m moejax.main --config`` and sweep plans, with a one-line note naming the
new one.
"""
