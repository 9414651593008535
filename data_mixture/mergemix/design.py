"""Points on the simplex for the MergeMix alpha search: the seed design and the candidate sets.

Seed design (:func:`seed_design`)
    Priors first, then space filling; see its docstring.

Candidates (:func:`fine_candidates`, :func:`local_candidates`)
    The points the regressors' predicted objective is maximised over: ``N_DIRICHLET`` Dirichlet(1)
    draws, the lattice of step ``1 / FINE_LATTICE`` (where it has at most ``MAX_LATTICE``
    points), and ``N_LOCAL`` concentrated Dirichlet draws around each of a few centres (local
    refinement; :func:`data_mixture.mergemix.search.mergemix_search` picks the centres).

Rows are mixtures in the order of the search's ``domains``. Nothing here imports JAX.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np

from data_mixture.mergemix.objective import SearchError

N_DIRICHLET = 20_000
FINE_LATTICE = 20
MAX_LATTICE = 20_000
N_LOCAL = 500
LOCAL_CONCENTRATION = 200.0
SEED_LATTICE = 4
SEED_POOL = 4_000


def check_domains(domains: Sequence[str]) -> tuple[str, ...]:
    """``domains`` as a tuple: a list (not one string) of at least 2, none twice; SearchError otherwise."""
    if isinstance(domains, str):
        raise SearchError(f"domains={domains!r}: give a list of domain names, not one string.")
    domains = tuple(domains)
    if len(domains) < 2:
        raise SearchError(f"the search needs at least 2 domains to mix; got {list(domains)}.")
    if len(set(domains)) != len(domains):
        dup = sorted({d for d in domains if domains.count(d) > 1})
        raise SearchError(f"domains are listed twice: {', '.join(dup)}.")
    return domains


def check_int(name: str, value, minimum: int) -> int:
    """``value`` as an int if it is an integer (not a bool) >= ``minimum``; SearchError naming ``name`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise SearchError(f"{name}={value!r}; allowed: an integer >= {minimum}.")
    return int(value)


def simplex_lattice(k: int, h: int) -> np.ndarray:
    """All points of the simplex in K dims whose coordinates are multiples of 1/h, [C(h+K-1, K-1), K]."""
    pts = []
    for bars in itertools.combinations(range(h + k - 1), k - 1):
        edges = (-1,) + bars + (h + k - 1,)
        pts.append([edges[i + 1] - edges[i] - 1 for i in range(k)])
    return np.asarray(pts, np.float64) / h


def _lattice_size(k: int, h: int) -> int:
    return math.comb(h + k - 1, k - 1)


def clip_to_simplex(alpha_k: np.ndarray) -> np.ndarray:
    """``alpha_k`` with negative entries set to 0, rescaled to sum 1 (float64)."""
    a = np.clip(np.asarray(alpha_k, np.float64), 0.0, None)
    return a / a.sum()


def _dedupe(points: np.ndarray, existing: np.ndarray | None = None, tol: float = 1e-9) -> np.ndarray:
    seen = set() if existing is None else {tuple(np.round(p / tol).astype(np.int64)) for p in existing}
    keep = []
    for i, p in enumerate(points):
        key = tuple(np.round(p / tol).astype(np.int64))
        if key not in seen:
            seen.add(key)
            keep.append(i)
    return points[keep]


def _maximin_pick(pool: np.ndarray, chosen: np.ndarray, count: int) -> np.ndarray:
    """Greedily pick ``count`` rows of ``pool`` each farthest (L1) from everything chosen so far."""
    if count <= 0 or len(pool) == 0:
        return pool[:0]
    if len(chosen):
        dmin = np.abs(pool[:, None, :] - chosen[None, :, :]).sum(-1).min(1)
    else:
        dmin = np.full(len(pool), np.inf)
    picked = []
    for _ in range(min(count, len(pool))):
        j = int(np.argmax(dmin))  # first index among ties: deterministic
        picked.append(j)
        dmin = np.minimum(dmin, np.abs(pool - pool[j]).sum(-1))
        dmin[j] = -np.inf
    return pool[picked]


def seed_design(domains: Sequence[str], n: int = 40, seed: int = 0) -> np.ndarray:
    """The ``n`` seed mixtures [n, K], rows on the simplex in the order of ``domains``.

    The paper says "a coarse grid plus priors" and no more; here, in priority order (duplicates
    dropped, each group taken whole while it fits, otherwise its most spread-out members by greedy
    maximin L1 distance to what is already chosen):

    1. the uniform mixture (the usual default, and the centre of the simplex);
    2. the vertices ``e_k`` (each expert alone: anchors each domain's effect);
    3. leave-one-out uniforms (``1/(K-1)`` on all domains but one: what dropping a domain costs);
    4. pairwise midpoints ``(e_i + e_j) / 2``;
    5. the coarse lattice of step ``1/4`` (where it has at most ``SEED_POOL`` points);
    6. Dirichlet(1) draws (uniform on the simplex), picked greedily maximin from a pool of
       ``SEED_POOL`` draws, to fill up to ``n`` (space filling rather than clumped random points).

    For K = 4 and n = 40: 1 + 4 + 4 + 6 = 15 priors, 20 of the remaining 20 lattice points, 5
    Dirichlet fills. Deterministic by ``seed`` (only group 6 is random).
    """
    domains = check_domains(domains)
    n = check_int("n", n, 1)
    k = len(domains)
    eye = np.eye(k)
    groups = [np.full((1, k), 1.0 / k), eye,
              (1.0 - eye) / (k - 1),
              np.asarray([(eye[i] + eye[j]) / 2 for i, j in itertools.combinations(range(k), 2)])]
    if _lattice_size(k, SEED_LATTICE) <= SEED_POOL:
        groups.append(simplex_lattice(k, SEED_LATTICE))
    chosen = np.zeros((0, k))
    for g in groups:
        if len(chosen) >= n:
            break
        g = _dedupe(g, chosen)
        room = n - len(chosen)
        take = g if len(g) <= room else _maximin_pick(g, chosen, room)
        chosen = np.concatenate([chosen, take])
    if len(chosen) < n:
        rng = np.random.default_rng(seed)
        pool = rng.dirichlet(np.ones(k), size=SEED_POOL)
        chosen = np.concatenate([chosen, _maximin_pick(pool, chosen, n - len(chosen))])
    return chosen[:n]


def fine_candidates(k: int, rng: np.random.Generator) -> np.ndarray:
    """The fine search set: ``N_DIRICHLET`` Dirichlet(1) draws + the lattice of step 1/FINE_LATTICE (coarser
    while it would exceed ``MAX_LATTICE`` points; left out when even step 1/2 is too many)."""
    parts = [rng.dirichlet(np.ones(k), size=N_DIRICHLET)]
    h = FINE_LATTICE
    while h > 2 and _lattice_size(k, h) > MAX_LATTICE:
        h //= 2
    if _lattice_size(k, h) <= MAX_LATTICE:
        parts.append(simplex_lattice(k, h))
    return np.concatenate(parts)


def local_candidates(centres_ck: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``N_LOCAL`` draws around each centre: Dirichlet(LOCAL_CONCENTRATION * c + 0.05), a cloud of L1
    radius ~0.05-0.1 that still reaches the faces of the simplex (the +0.05 lets zeros move)."""
    return np.concatenate([rng.dirichlet(LOCAL_CONCENTRATION * np.asarray(c) + 0.05, size=N_LOCAL) for c in centres_ck])
