"""The feasible set of a mixture: the simplex ``sum w = 1`` cut by a box ``lo <= w <= hi``;
exact projection onto it and the check that a point is in it."""

from __future__ import annotations

import numpy as np


def project(x_km: np.ndarray, lo_m: np.ndarray, hi_m: np.ndarray) -> np.ndarray:
    """Euclidean projection of each row onto {lo <= w <= hi, sum w = 1} (assumed non-empty).

    w = clip(x - tau, lo, hi) with tau found by bisection (the sum is monotone in tau); the last
    rounding residual goes to a coordinate strictly inside its bounds, so bounds hold exactly.
    """
    x_km = np.atleast_2d(np.asarray(x_km, np.float64))
    a = (x_km - hi_m).min(axis=1) - 1.0
    b = (x_km - lo_m).max(axis=1) + 1.0
    for _ in range(200):
        mid = 0.5 * (a + b)
        s = np.clip(x_km - mid[:, None], lo_m, hi_m).sum(axis=1)
        big = s > 1.0
        a = np.where(big, mid, a)
        b = np.where(big, b, mid)
    w = np.clip(x_km - (0.5 * (a + b))[:, None], lo_m, hi_m)
    for k in range(w.shape[0]):
        for _ in range(3):
            r = 1.0 - w[k].sum()
            if r == 0.0:
                break
            room = (hi_m - w[k]) if r > 0 else (w[k] - lo_m)
            j = int(np.argmax(room))
            w[k, j] = min(hi_m[j], max(lo_m[j], w[k, j] + r))
    return w


def check_feasible(w_m: np.ndarray, lo_m: np.ndarray, hi_m: np.ndarray, tol: float = 1e-12) -> None:
    if not (np.all(w_m >= lo_m - tol) and np.all(w_m <= hi_m + tol) and abs(w_m.sum() - 1.0) <= 1e-9):
        raise RuntimeError(f"internal error: optimum {w_m.tolist()} violates its bounds {lo_m.tolist()}..{hi_m.tolist()}")
