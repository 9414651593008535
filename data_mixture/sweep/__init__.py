"""Sweep runner: a plan (``python -m data_mixture plan``) -> trained, evaluated runs -> runs table.

``python -m data_mixture sweep --plan plan.json --root sweeps/NAME [--backend local|ray]`` (docs/
mixture/commands.md, "Sweeps"). One module per job:

- ``targets``     plan entries -> run targets (name, overrides, run dir), every entry's config
                  resolved and validated with moejax's own parser before anything is launched;
- ``record``      what a run directory says: progress on disk, lease, status, record;
- ``attempt``     one attempt at one run (train, then evaluate), shared by both backends;
- ``runner``      the scheduling loop: skip/lease/launch/retry, heartbeats, progress, Ctrl-C, collect;
- ``local``       subprocess backend (``--parallel N``);
- ``ray_backend`` Ray backend (imported only for ``--backend ray``).
"""

from data_mixture.sweep.runner import SweepOptions, SweepResult, prepare, run_sweep
from data_mixture.sweep.targets import RunTarget, SweepError, load_plan, targets_from_plan

__all__ = ["RunTarget", "SweepError", "SweepOptions", "SweepResult", "load_plan", "prepare", "run_sweep",
           "targets_from_plan"]
