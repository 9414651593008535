"""Schur-A*: the subset of K experts of one layer with the least reconstruction distortion, exactly.

The objective is :meth:`moejax.prune.objectives.Quadratic.distortion`,
``D(S) = ||Y||^2 - b_S^T G_SS^{-1} b_S`` (a Schur complement of the bordered Gram).

Search space. Experts are ordered (by decreasing single-expert fit ``b_e^2 / G_ee``, so good
subsets are met early) and a node decides the first i of them: a kept set C and the undecided
rest R = {order[i:]}. Its children keep or drop order[i]. A goal is a node with |C| = K.
Nodes that cannot reach K (|C| + |R| < K) are never created.

Bound. h(C, R) = D(C u R): the distortion when *every* undecided expert may still be kept, i.e.
the Schur complement of the relaxed Gram block G_{C u R}. It is admissible: every completion S of
the node satisfies C <= S <= C u R, and D is non-increasing under inclusion (least squares over
more columns never fits worse), so D(S) >= D(C u R). It is also consistent: keeping order[i] leaves
C u R unchanged (same bound) and dropping it shrinks C u R (bound can only grow), so f never
decreases along a path. At a goal the bound is the exact D(C) (R is then dropped entirely: a goal's
f is D(C)). A* pops nodes by increasing bound, so the first goal popped is optimal: no open node
can lead to a subset below it.

Limits. ``max_nodes`` (expansions) and ``max_seconds`` stop the search early; the answer is then
the best goal seen so far, or the greedy backward-elimination subset computed first (the
incumbent), with ``optimal=False`` and the proven lower bound (the smallest open bound) reported,
so the gap is known.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import time

import numpy as np

from moejax.prune.objectives import Quadratic


@dataclasses.dataclass(frozen=True)
class SearchResult:
    """The chosen subset (sorted expert ids), its distortion, whether it is proven optimal, the
    search effort, and the proven lower bound on the optimum (== ``distortion`` when optimal)."""

    keep: tuple[int, ...]
    distortion: float
    optimal: bool
    nodes: int
    seconds: float
    lower_bound: float
    stopped_by: str  # "" (finished), "max_nodes" or "max_seconds"


def greedy_backward(q: Quadratic, k: int) -> tuple[int, ...]:
    """Drop, one at a time, the expert whose removal raises D least, down to ``k``: the incumbent."""
    keep = list(range(q.num_experts))
    while len(keep) > k:
        costs = [q.distortion([e for e in keep if e != drop]) for drop in keep]
        keep.pop(int(np.argmin(costs)))
    return tuple(sorted(keep))


def schur_astar(q: Quadratic, k: int, *, max_nodes: int = 200_000, max_seconds: float = 60.0) -> SearchResult:
    """The K-subset minimising ``q.distortion`` by A* with the Schur-complement relaxation bound."""
    e = q.num_experts
    if not 1 <= k <= e:
        raise ValueError(f"K={k} must be between 1 and the layer's {e} experts")
    start = time.perf_counter()
    incumbent = greedy_backward(q, k)
    best_keep, best = incumbent, q.distortion(incumbent)
    single = np.array([q.b_e[i] ** 2 / max(q.gram_ee[i, i], 1e-300) for i in range(e)])
    order = tuple(int(i) for i in np.argsort(-single, kind="stable"))
    counter = itertools.count()  # ties: first pushed first
    # (bound, tie, depth i, kept set C)
    heap: list[tuple[float, int, int, tuple[int, ...]]] = [(q.distortion(order), next(counter), 0, ())]
    nodes, stopped = 0, ""
    while heap:
        bound, _, i, kept = heapq.heappop(heap)
        if len(kept) == k:  # a goal: its bound is its exact distortion, and nothing open is lower
            return SearchResult(tuple(sorted(kept)), bound, True, nodes, time.perf_counter() - start, bound, "")
        if _tied_out(bound, best):
            # Every completion is at least ``bound`` >= the incumbent: the incumbent is optimal.
            return SearchResult(best_keep, best, True, nodes, time.perf_counter() - start, best, "")
        nodes += 1
        if nodes > max_nodes or time.perf_counter() - start > max_seconds:
            stopped = "max_nodes" if nodes > max_nodes else "max_seconds"
            heapq.heappush(heap, (bound, next(counter), i, kept))
            break
        item = order[i]
        rest = order[i + 1:]
        with_item = (*kept, item)
        if len(with_item) == k:  # goal: the rest dropped; bound = D(C)
            value = q.distortion(with_item)
            if value < best:
                best, best_keep = value, tuple(sorted(with_item))
            heapq.heappush(heap, (value, next(counter), i + 1, with_item))
        else:
            heapq.heappush(heap, (bound, next(counter), i + 1, with_item))  # C u R unchanged
        if len(kept) + len(rest) >= k:  # dropping ``item`` can still reach K
            heapq.heappush(heap, (q.distortion((*kept, *rest)), next(counter), i + 1, kept))
    lower = min((b for b, *_ in heap), default=best)
    return SearchResult(best_keep, best, False, nodes, time.perf_counter() - start, min(lower, best), stopped)


def _tied_out(bound: float, best: float) -> bool:
    """The smallest open bound reaches the incumbent (up to float noise): nothing open beats it."""
    return bound >= best - 1e-12 * max(abs(best), 1.0)


def brute_force(q: Quadratic, k: int) -> tuple[tuple[int, ...], float]:
    """The optimum by enumerating every K-subset (for tests and small layers)."""
    best_keep: tuple[int, ...] = ()
    best = float("inf")
    for subset in itertools.combinations(range(q.num_experts), k):
        value = q.distortion(subset)
        if value < best:
            best, best_keep = value, subset
    return best_keep, best


def distortion_curve(q: Quadratic, k_min: int, **limits) -> dict[int, SearchResult]:
    """The optimal subset and distortion for every K from ``k_min`` to E (the knee's input)."""
    return {k: schur_astar(q, k, **limits) for k in range(k_min, q.num_experts + 1)}
