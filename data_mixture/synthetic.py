"""Synthetic runs tables drawn from a known law (tests, benchmarks, planning simulations).

``synthetic_table`` trains nothing: it draws mixtures (Dirichlet), model sizes and checkpoints,
evaluates a law's loss function with given true parameters and multiplies by log-normal noise.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from data_mixture.table import RunsTable, from_columns


def draw_design(
    *,
    mix_domains: Sequence[str],
    sizes: Sequence[float],
    runs_per_size: int,
    checkpoints: Sequence[float] = (0.5, 1.0),
    tokens_per_param: float = 20.0,
    seed: int = 0,
    shared_mixtures: bool = False,
    concentration: float = 1.0,
) -> dict[str, Any]:
    """Columns run, params_total, params_active, tokens, mix:* of a ladder: ``runs_per_size``
    mixtures at each size (the same mixtures at every size if ``shared_mixtures``), each run
    with checkpoints at fractions of ``tokens_per_param * N`` tokens."""
    rng = np.random.default_rng(seed)
    m = len(mix_domains)
    shared = rng.dirichlet(np.full(m, concentration), runs_per_size)
    cols: dict[str, list] = {"run": [], "params_total": [], "params_active": [], "tokens": []}
    for d in mix_domains:
        cols[f"mix:{d}"] = []
    for si, n in enumerate(sizes):
        mixes = shared if shared_mixtures else rng.dirichlet(np.full(m, concentration), runs_per_size)
        for k in range(runs_per_size):
            for frac in checkpoints:
                cols["run"].append(f"s{si}_m{k}")
                cols["params_total"].append(float(n))
                cols["params_active"].append(float(n))
                cols["tokens"].append(float(round(frac * tokens_per_param * n)))
                for j, d in enumerate(mix_domains):
                    cols[f"mix:{d}"].append(float(mixes[k, j]))
    return cols


def synthetic_table(
    loss_fn,
    design: Mapping[str, Any],
    mix_domains: Sequence[str],
    *,
    domains: Sequence[str] = ("valid",),
    noise: float = 0.005,
    seed: int = 0,
) -> RunsTable:
    """Adds ``loss:<domain>`` columns: ``loss_fn(domain_index, N, D, mix_rm) * exp(noise * z)``."""
    rng = np.random.default_rng(seed + 7919)
    cols = dict(design)
    n = np.asarray(cols["params_total"], np.float64)
    d = np.asarray(cols["tokens"], np.float64)
    mix = np.stack([np.asarray(cols[f"mix:{x}"], np.float64) for x in mix_domains], axis=1)
    for v, name in enumerate(domains):
        clean = np.asarray(loss_fn(v, n, d, mix), np.float64)
        cols[f"loss:{name}"] = list(clean * np.exp(noise * rng.standard_normal(clean.shape)))
    return from_columns(cols)


# -- truths for the law robustness matrix -----------------------------------------------------
# Each truth is a noiseless loss L(N, D, r) for the four training domains ROBUST_DOMAINS, with
# n = N / ROBUST_N_REF and d = D / ROBUST_D_REF (d = n at 20 tokens per parameter). Four have
# the form of a law in ``data_mixture/laws`` (with parameters of their own, not fitted to
# anything); three are capacity-aware forms that none of the laws has. Their parameters were
# fixed before any law was tuned on the matrix (``experiments/benchmarks/law_robustness.py``)
# and must not be changed to favour a law.

ROBUST_DOMAINS = ("code", "prose", "math", "knowledge")
ROBUST_N_REF = 1e8
ROBUST_D_REF = 2e9


def _nd(size_r, tokens_r):
    return np.asarray(size_r, np.float64) / ROBUST_N_REF, np.asarray(tokens_r, np.float64) / ROBUST_D_REF


def _pow(r, g):
    """r ** g for r >= 0 (0 ** g = 0)."""
    r = np.asarray(r, np.float64)
    return np.where(r > 0, np.power(np.maximum(r, 1e-300), g), 0.0)


def truth_camel(size_r, tokens_r, mix_rm):
    """The form of the first ``camel`` law (capacity in the data term only):

        L = E + A n^-alpha + B (d S)^-beta,   S = sum_j exp(t_j) n^{s_j} r_j^rho

    E = 1.6, A = 0.5, alpha = 0.35, B = 0.8, beta = 0.3, rho = 0.5, t = (0, 0.2, -0.2, -0.4),
    s = (0, 0.1, 0.05, 0.4): knowledge gains value with size."""
    n, d = _nd(size_r, tokens_r)
    t, s = np.array([0.0, 0.2, -0.2, -0.4]), np.array([0.0, 0.1, 0.05, 0.4])
    big_s = np.sum(np.exp(t[None] + s[None] * np.log(n)[:, None]) * _pow(mix_rm, 0.5), axis=1)
    return 1.6 + 0.5 * n**-0.35 + 0.8 * (d * big_s) ** -0.3


def truth_additive(size_r, tokens_r, mix_rm):
    """The form of ``additive`` (Shukor et al.): a mixture term independent of scale,

        L = E + A n^-alpha + B d^-beta + 1 / sum_j C_j r_j^gamma_j

    E = 1.5, A = 0.5, alpha = 0.35, B = 0.6, beta = 0.3, C = (1.2, 1.5, 0.8, 0.9),
    gamma = (0.5, 0.3, 0.6, 0.4)."""
    n, d = _nd(size_r, tokens_r)
    c, g = np.array([1.2, 1.5, 0.8, 0.9]), np.array([0.5, 0.3, 0.6, 0.4])
    return 1.5 + 0.5 * n**-0.35 + 0.6 * d**-0.3 + 1.0 / np.sum(c[None] * _pow(mix_rm, g[None]), axis=1)


def truth_mixing_law(size_r, tokens_r, mix_rm):
    """Per-mixture scaling laws whose coefficients are exponential in the mixture (the form
    ``mixing_law`` assumes: Ye et al.'s c + k exp(t . r) across mixtures, a Chinchilla law
    across sizes and tokens for each mixture):

        L = E0 + k exp(t_E . r) + A exp(t_A . r) n^-alpha + B d^-beta

    E0 = 1.2, k = 0.5, t_E = (0, -0.5, 0.3, -0.2), A = 0.45, t_A = (0, 0.3, 0.2, -0.6),
    alpha = 0.35, B = 0.6, beta = 0.3: prose lowers the floor, knowledge the size term."""
    n, d = _nd(size_r, tokens_r)
    t_e, t_a = np.array([0.0, -0.5, 0.3, -0.2]), np.array([0.0, 0.3, 0.2, -0.6])
    mix = np.asarray(mix_rm, np.float64)
    return 1.2 + 0.5 * np.exp(mix @ t_e) + 0.45 * np.exp(mix @ t_a) * n**-0.35 + 0.6 * d**-0.3


def truth_regmix_linear(size_r, tokens_r, mix_rm):
    """The form of ``regmix_linear``: log-linear, no floor,

        log L = sum_j w_j r_j + a log n + b log d

    w = log(3.0, 2.8, 3.2, 3.1), a = -0.06, b = -0.05."""
    n, d = _nd(size_r, tokens_r)
    w = np.log([3.0, 2.8, 3.2, 3.1])
    return np.exp(np.asarray(mix_rm, np.float64) @ w - 0.06 * np.log(n) - 0.05 * np.log(d))


def truth_mixture_floor(size_r, tokens_r, mix_rm):
    """Capacity-aware form (i): the irreducible loss depends on the mixture, and the mixture
    also sets the data efficiency,

        L = E0 + e . r + A n^-alpha + B (d q(r))^-beta,   q(r) = sum_j c_j r_j^rho

    E0 = 1.4, e = (0.3, 0, 0.25, 0.1), A = 0.5, alpha = 0.35, B = 0.9, beta = 0.35, rho = 0.5,
    c = (1.5, 0.6, 1.8, 0.8): code and math are efficient data (small models want them), prose
    has the lowest floor (large models, whose data term has shrunk, want it)."""
    n, d = _nd(size_r, tokens_r)
    e, c = np.array([0.3, 0.0, 0.25, 0.1]), np.array([1.5, 0.6, 1.8, 0.8])
    mix = np.asarray(mix_rm, np.float64)
    q = np.sum(c[None] * _pow(mix, 0.5), axis=1)
    return 1.4 + mix @ e + 0.5 * n**-0.35 + 0.9 * (d * q) ** -0.35


def truth_capped_domain(size_r, tokens_r, mix_rm):
    """Capacity-aware form (ii): knowledge is the most valuable domain but its benefit
    saturates at a cap that grows with model size (a small model cannot hold many facts),

        L = E + A n^-alpha + B (sum_j x_j^rho)^-beta,
        x_j = c_j d r_j (j != knowledge),   x_k = c_k d r_k / (1 + c_k d r_k / (k0 n^kappa))

    E = 1.6, A = 0.5, alpha = 0.35, B = 0.8, beta = 0.35, rho = 0.6, c = (1, 0.8, 1, 3),
    k0 = 1, kappa = 1.5 (the cap, in tokens, grows faster than the 20-tokens-per-parameter
    budget, so larger models saturate later)."""
    n, d = _nd(size_r, tokens_r)
    c = np.array([1.0, 0.8, 1.0, 3.0])
    x = c[None] * d[:, None] * np.asarray(mix_rm, np.float64)
    x[:, 3] = x[:, 3] / (1.0 + x[:, 3] / n**1.5)
    return 1.6 + 0.5 * n**-0.35 + 0.8 * np.sum(_pow(x, 0.6), axis=1) ** -0.35


def truth_interactions(size_r, tokens_r, mix_rm):
    """Capacity-aware form (iii): pairs of domains interact, and the interactions change sign
    with size (code and math help each other in small models and compete in large ones; prose
    and knowledge the other way round),

        L = E + A n^-alpha + B d^-beta + 1 / sum_j C_j r_j^gamma_j
              + tanh(log(n / n_x)) (g_cm r_code r_math + g_pk r_prose r_knowledge)

    E = 1.5, A = 0.5, alpha = 0.35, B = 0.6, beta = 0.3, C = (1.2, 1.5, 0.8, 0.9),
    gamma = (0.5, 0.3, 0.6, 0.4), n_x = 0.3 (N = 3e7, inside the fitted sizes), g_cm = 0.8,
    g_pk = -0.8."""
    n, d = _nd(size_r, tokens_r)
    mix = np.asarray(mix_rm, np.float64)
    sign = np.tanh(np.log(n / 0.3))
    inter = 0.8 * mix[:, 0] * mix[:, 2] - 0.8 * mix[:, 1] * mix[:, 3]
    return truth_additive(size_r, tokens_r, mix_rm) + sign * inter


ROBUST_TRUTHS = {
    "camel": truth_camel,
    "additive": truth_additive,
    "mixing_law": truth_mixing_law,
    "regmix_linear": truth_regmix_linear,
    "mixture_floor": truth_mixture_floor,
    "capped_domain": truth_capped_domain,
    "interactions": truth_interactions,
}
"""name -> L(N, D, mix_rm) (noiseless); the first four have the forms of laws, the last three
are capacity-aware forms no law has."""


def simplex_grid(m: int, step: float = 0.05) -> np.ndarray:
    """(G, m) all mixtures on the simplex with weights in multiples of ``step``."""
    k = int(round(1.0 / step))
    pts = [c for c in _compositions(k, m)]
    return np.asarray(pts, np.float64) / k


def _compositions(k: int, m: int):
    if m == 1:
        yield (k,)
        return
    for i in range(k + 1):
        for rest in _compositions(k - i, m - 1):
            yield (i, *rest)


def truth_optimum(loss_fn, size: float, tokens: float, m: int, step: float = 0.05) -> np.ndarray:
    """argmin_r loss_fn(N, D, r) over :func:`simplex_grid` (m,)."""
    g = simplex_grid(m, step)
    loss = loss_fn(np.full(len(g), size), np.full(len(g), tokens), g)
    return g[int(np.argmin(loss))]


def user_style_table(mix_domains: Sequence[str] = ("web", "books", "code"), *, sizes: Sequence[float] = (2e5, 6e5),
                     mixtures: int = 10, seed: int = 0, scarce: str | None = "books", pool: float = 2e6,
                     noise: float = 0.004) -> RunsTable:
    """A runs table as a user's own sweep writes it: ``mixtures`` Dirichlet mixtures of
    ``mix_domains`` at every size of ``sizes`` (20 tokens per parameter, two checkpoints each), one
    validation domain per training domain plus a held-out target ``heldout`` no run trains on, and
    the ``scarce`` domain's pool ``unique:<scarce>``. The truth: a Chinchilla-like size/token term
    plus, per validation domain, ``0.6 exp(-3 r_v^eff)``, with the held-out target scored by the
    first two domains 0.7/0.3 and the scarce domain's effective share saturating past 4 epochs."""
    rng = np.random.default_rng(seed)
    m = len(mix_domains)
    mix_km = np.concatenate([np.full((1, m), 1.0 / m), rng.dirichlet(np.ones(m), size=mixtures - 1)])
    cols: dict[str, list] = {k: [] for k in ("run", "params_total", "params_active", "tokens", "seed")}
    for d in mix_domains:
        cols[f"mix:{d}"] = []
    for n in sizes:
        for k, w in enumerate(mix_km):
            for frac in (0.5, 1.0):
                cols["run"].append(f"n{n:g}_m{k}")
                cols["params_total"].append(2 * n)
                cols["params_active"].append(n)
                cols["tokens"].append(20 * n * frac)
                cols["seed"].append(0)
                for j, d in enumerate(mix_domains):
                    cols[f"mix:{d}"].append(float(w[j]))
    n_r, d_r = np.asarray(cols["params_active"]), np.asarray(cols["tokens"])
    w_rm = np.stack([np.asarray(cols[f"mix:{d}"]) for d in mix_domains], axis=1)
    eff_rm = w_rm.copy()
    if scarce is not None:
        j = list(mix_domains).index(scarce)
        epochs = w_rm[:, j] * d_r / pool
        eff_rm[:, j] = np.where(epochs > 4, w_rm[:, j] * (4 + np.log1p(np.maximum(epochs - 4, 0))) / epochs, w_rm[:, j])
        cols[f"unique:{scarce}"] = [pool] * len(n_r)
    base = 1.5 + 30 * n_r ** -0.3 + 60 * d_r ** -0.3
    z = lambda: np.exp(noise * rng.standard_normal(len(n_r)))  # noqa: E731
    for j, d in enumerate(mix_domains):
        cols[f"loss:{d}"] = list((base + 0.6 * np.exp(-3 * eff_rm[:, j])) * z())
    held = 0.7 * np.exp(-3 * eff_rm[:, 0]) + 0.3 * np.exp(-3 * eff_rm[:, 1 % m])
    cols["loss:heldout"] = list((base + 0.8 * held) * z())
    return from_columns(cols)
