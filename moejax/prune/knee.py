"""Per-layer budgets (``--auto``): each layer's distortion against its expert count, its knee, and
an allocation of a global expert budget (the memory target) across heterogeneous layers.

Input per layer: ``curve[K]``, the relative distortion D*(K) / ||Y||^2 of the best K-subset
(Schur-A*, :func:`moejax.prune.schur_astar.distortion_curve`) for K from top-k to E. Every routed
expert of a model has the same size, so memory is linear in the experts kept and a memory target
is a total expert count.

- :func:`knee` (Kneedle): with K and the distortion both scaled to [0, 1], the K whose point lies
  farthest below the chord from (top-k, D*(top-k)) to (E, 0): past it, keeping more experts buys
  little. With no target, ``--auto`` keeps each layer's knee.
- :func:`allocate`: with a target (``--auto --ratio R`` or ``--keep K``: K experts per layer on
  average), start every layer at its knee and move one expert at a time: while over budget,
  remove it where the distortion rises least; while under, add it where it falls most (steps in
  D*/||Y||^2, so every layer's output counts alike). The layer's knee is where the allocation
  starts, so an unconstrained allocation is the knees themselves; the target decides the rest.
"""

from __future__ import annotations

import numpy as np


def knee(curve: dict[int, float]) -> int:
    """The Kneedle knee of one layer's decreasing distortion curve {K: D}."""
    ks = np.array(sorted(curve))
    if ks.size <= 2:
        return int(ks[-1])
    d = np.array([curve[int(k)] for k in ks])
    x = (ks - ks[0]) / (ks[-1] - ks[0])
    span = d[0] - d[-1]
    if span <= 0:
        return int(ks[0])  # no gain from more experts
    y = (d - d[-1]) / span
    gap = (1 - x) - y  # the chord from (0, 1) to (1, 0), minus the curve
    return int(ks[int(np.argmax(gap))])


def allocate(curves: list[dict[int, float]], total: int) -> list[int]:
    """Experts per layer summing to ``total`` (see the module docstring); ``ValueError`` if no
    allocation within each layer's [top-k, E] can."""
    lo = [min(c) for c in curves]
    hi = [max(c) for c in curves]
    if not sum(lo) <= total <= sum(hi):
        raise ValueError(f"a total of {total} experts cannot be met: each layer keeps between its top-k and all "
                         f"of its experts, {sum(lo)} to {sum(hi)} in all")
    counts = [knee(c) for c in curves]
    while sum(counts) > total:
        rise = [curves[i][counts[i] - 1] - curves[i][counts[i]] if counts[i] > lo[i] else np.inf
                for i in range(len(curves))]
        counts[int(np.argmin(rise))] -= 1
    while sum(counts) < total:
        fall = [curves[i][counts[i]] - curves[i][counts[i] + 1] if counts[i] < hi[i] else -np.inf
                for i in range(len(curves))]
        counts[int(np.argmax(fall))] += 1
    return counts
