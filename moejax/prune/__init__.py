"""Post-training expert pruning that shrinks the checkpoint (docs/pruning.md).

    python -m moejax.prune --workdir DIR --method schur_astar|step|least_used \\
        --keep K | --ratio R | --auto [--keep K | --ratio R] --out OUT

writes a new workdir whose MoE layers hold fewer experts (weights and router columns removed),
which training, ``moejax.eval``, ``moejax.generate`` and the Hugging Face export read.

=================  ==================================================================================
``calibration``    calibration tokens: every MoE layer's input, routing, weights; each token's loss
``objectives``     expert outputs, the quadratic reconstruction objective, the pruned layer's error
``schur_astar``    the optimal K-subset by A* with a Schur-complement relaxation bound; brute force
``step``           loss-weighted token-aware importance; the knowledge-preserving down-projection refit
``least_used``     the baseline: keep the most-used experts
``knee``           per-layer budgets: the distortion knee and a global expert (memory) target
``write``          the pruned workdir
``prune``          one pruning job end to end; ``cli``: the command line
=================  ==================================================================================
"""

from moejax.prune.prune import METHODS, Budget, choose, describe, prune_workdir

__all__ = ["METHODS", "Budget", "choose", "describe", "prune_workdir"]
