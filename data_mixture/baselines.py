"""Replicate-averaged cells of a runs table, and the trivial baselines every mixture law must beat.

A *cell* is one (model size, mixture, tokens) point of a runs table; its rows are seed replicates
(:meth:`data_mixture.table.RunsTable.mixture_keys`). Comparisons use the cell mean over seeds.
A cell's *checkpoint fraction* is tokens / the largest tokens of its (size, mixture): 1 for the
final checkpoint.

The baselines predict the held-out cells from the training cells only, with no law:

- ``uniform``: ranks mixtures by closeness to the uniform mixture, score ``sum_j r_j log r_j``
  (= -entropy; lower = predicted better); its pick is the uniform mixture when it was run. No
  loss prediction.
- ``best_at_proxy``: a held-out cell's loss = the same mixture's loss at the largest training
  size below it (the *proxy* size), at the checkpoint of the nearest checkpoint fraction. A
  mixture not run at the proxy size borrows the nearest proxy mixture (L1 distance on the
  simplex; the notes say how many and how far).
- ``trend``: per mixture and validation domain, ``log L = a + b log N`` by least squares over the
  training sizes below the held-out size at which the mixture was run (>= 2), at the matched
  checkpoint fraction, extrapolated to the held-out N. A mixture with fewer than 2 such sizes
  borrows the nearest mixture that has them (noted); with none at all the baseline is skipped.
- ``rank_by_weight``: for a validation domain that is also a training domain, the predicted
  order is the descending weight of that domain (score ``-r_v``). Per domain only; no loss.

Two more for sources of unequal size, from the table's unique tokens per training domain (columns
``unique:<domain>``; skipped, with the reason, when the table lacks them):

- ``proportional``: the natural mixture, weights in proportion to each domain's unique tokens
  ``p_j = U_j / sum U``; ranks mixtures by closeness to it, score ``KL(r || p) = sum_j r_j log(r_j / p_j)``
  (the ``uniform`` score is the same with ``p`` uniform, up to a constant).
- ``unimax``: UniMax (Chung et al. 2023, "UniMax: Fairer and More Effective Language Sampling for
  Large-Scale Multilingual Pretraining"): as uniform as a cap of ``UNIMAX_MAX_EPOCHS`` epochs per
  domain allows at the cell's token budget D. Domains in ascending order of unique tokens; each
  takes the equal share of the budget not yet given out, capped at ``max_epochs x U_j``; what a
  capped domain cannot take is shared among the larger ones. Ranks mixtures by ``KL(r || unimax)``.
  The paper's cap is its parameter N (epochs per language); 4 here is ours, after Muennighoff et
  al. 2023 (repeating data up to about 4 epochs is almost as good as new data).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from data_mixture.table import RunsTable, TableError

DECIMALS = 6  # mixtures equal to this many decimals are the same mixture (as RunsTable.mixture_keys)


class BaselineSkipped(Exception):
    """A baseline that these rows cannot give; the message is the reason."""


@dataclasses.dataclass(frozen=True)
class Cells:
    """Cells of a runs table (C cells, V validation domains, M training domains).

    size_c, tokens_c, frac_c: model size (the size column), tokens, checkpoint fraction;
    mix_cm: mixture; obs_cv: loss averaged over the cell's replicates; seeds_c: replicates;
    runs: the run names of each cell; reps: per cell, (seed, loss_v) of each replicate;
    unique_cm: unique tokens per training domain (columns ``unique:<domain>``), None without them.
    """

    size_c: np.ndarray
    tokens_c: np.ndarray
    frac_c: np.ndarray
    mix_cm: np.ndarray
    obs_cv: np.ndarray
    seeds_c: np.ndarray
    runs: list
    reps: list
    unique_cm: np.ndarray | None = None  # (C, M) unique tokens per training domain; None: the table has none

    def __len__(self) -> int:
        return int(self.size_c.shape[0])

    @property
    def final_c(self) -> np.ndarray:
        """(C,) bool: the cell is the final checkpoint of its (size, mixture)."""
        return np.isclose(self.frac_c, 1.0)

    def label(self, c: int) -> str:
        return "+".join(self.runs[c])

    def mean_reps(self, c: int) -> list[tuple[int, float]]:
        """(seed, mean loss over domains) of each replicate of cell c."""
        return [(s, float(np.mean(v))) for s, v in self.reps[c]]


def mixture_ids(mix_cm: np.ndarray) -> np.ndarray:
    """(C,) id of each row's mixture (equal to DECIMALS decimals)."""
    _, inv = np.unique(np.round(mix_cm, DECIMALS), axis=0, return_inverse=True)
    return inv.reshape(-1)


def build_cells(table: RunsTable, size_column: str) -> Cells:
    """Averages the replicates of every (size, mixture, tokens) cell of ``table``."""
    key_r = table.mixture_keys(size_column)
    size_r, seed_r = table.size(size_column), table.seeds()
    cells = np.unique(key_r)
    first = np.array([np.flatnonzero(key_r == c)[0] for c in cells])
    size_c, tokens_c, mix_cm = size_r[first], table.tokens[first], table.mix_rm[first]
    obs_cv = np.stack([table.loss_rv[key_r == c].mean(axis=0) for c in cells])
    runs = [table.run[key_r == c].tolist() for c in cells]
    reps = [[(int(s), v) for s, v in zip(seed_r[key_r == c], table.loss_rv[key_r == c])] for c in cells]
    group = _size_mixture_ids(size_c, mix_cm)
    final = np.array([tokens_c[group == g].max() for g in group])
    unique_rm = unique_tokens(table)
    return Cells(size_c, tokens_c, tokens_c / final, mix_cm, obs_cv, np.array([len(r) for r in runs]), runs, reps,
                 None if unique_rm is None else unique_rm[first])


def cell_pools(table: RunsTable, size_column: str) -> np.ndarray:
    """(C, M) each cell's pool of unique tokens per training domain, cells as :func:`build_cells`
    makes them from the same arguments (``RunsTable.unique_rm``: ``inf`` where a row has no pool,
    an unlimited domain). A cell's replicates differ only in seed, so a cell whose rows differ in a
    pool is a TableError naming its runs."""
    key_r = table.mixture_keys(size_column)
    u_rm = table.unique_rm()
    out = np.empty((int(key_r.max()) + 1 if len(key_r) else 0, u_rm.shape[1]))
    for c in range(len(out)):
        u_nm = u_rm[key_r == c]
        if not (u_nm == u_nm[0]).all():
            runs = ", ".join(dict.fromkeys(table.run[key_r == c].tolist()))
            raise TableError(f"runs {runs} are replicates of one cell (same size, mixture and tokens) but differ in a "
                             f"unique:<domain> pool ({u_nm.tolist()}); replicates must share their pools: fix the "
                             "table's unique: cells, or keep one pool per cell.")
        out[c] = u_nm[0]
    return out


UNIQUE = "unique:"


def unique_tokens(table: RunsTable) -> np.ndarray | None:
    """(R, M) unique tokens of each training domain (columns ``unique:<domain>``, read as numbers;
    the table's own parsed ``unique_rm`` when it has one); None when any domain's column is absent
    or a value is not a number > 0."""
    if hasattr(table, "unique_rm") and callable(table.unique_rm):  # RunsTable.unique_rm(): inf where absent or empty
        try:
            got = np.asarray(table.unique_rm(), np.float64)
        except ValueError:  # a TableError: a cell that is not a number > 0
            return None
        return got if np.all(np.isfinite(got)) else None
    cols = [table.extra.get(f"{UNIQUE}{d}") for d in table.mix_domains]
    if any(c is None for c in cols):
        return None
    try:
        u_rm = np.stack([np.asarray(c, np.float64) for c in cols], axis=1)
    except ValueError:
        return None
    return u_rm if np.all(np.isfinite(u_rm) & (u_rm > 0)) else None


def _size_mixture_ids(size_c: np.ndarray, mix_cm: np.ndarray) -> np.ndarray:
    key = np.concatenate([size_c[:, None], np.round(mix_cm, DECIMALS)], axis=1)
    _, inv = np.unique(key, axis=0, return_inverse=True)
    return inv.reshape(-1)


def nearest(mix_km: np.ndarray, query_m: np.ndarray) -> tuple[int, float]:
    """Index of the mixture in ``mix_km`` nearest ``query_m`` in L1 distance, and the distance."""
    dist_k = np.abs(mix_km - query_m[None]).sum(axis=1)
    k = int(np.argmin(dist_k))
    return k, float(dist_k[k])


def _matched_checkpoint(train: Cells, sel: np.ndarray, frac: float) -> int:
    """The cell among ``sel`` (indices) whose checkpoint fraction is nearest ``frac``."""
    return int(sel[np.argmin(np.abs(train.frac_c[sel] - frac))])


def _borrowed_note(borrowed: list[float], total: int, what: str) -> str:
    if not borrowed:
        return ""
    return (f"{len(borrowed)} of {total} held-out cells borrow the nearest {what} (L1 distance up to "
            f"{max(borrowed):.3f})")


def uniform_score(mix_cm: np.ndarray) -> np.ndarray:
    """(C,) ``sum_j r_j log r_j`` of each mixture (0 log 0 = 0): the uniform mixture scores lowest."""
    r = np.asarray(mix_cm, np.float64)
    return np.sum(np.where(r > 0, r * np.log(np.where(r > 0, r, 1.0)), 0.0), axis=1)


def uniform(held: Cells, loss_domains) -> dict:
    """Rank by :func:`uniform_score`: closer to the uniform mixture, predicted better."""
    score_c = uniform_score(held.mix_cm)
    return {"pred_cv": None, "rank_cv": np.repeat(score_c[:, None], len(loss_domains), axis=1), "rank_c": score_c, "notes": ""}


def best_at_proxy(train: Cells, held: Cells) -> dict:
    """Each held-out cell's loss taken from its mixture at the largest training size below it."""
    pred_cv = np.empty_like(held.obs_cv)
    borrowed = []
    proxies = set()
    for c in range(len(held)):
        below = np.unique(train.size_c[train.size_c < held.size_c[c]])
        if not below.size:
            raise BaselineSkipped(f"no training size below the held-out size {held.size_c[c]:.4g}")
        at = np.flatnonzero(train.size_c == below[-1])
        proxies.add(float(below[-1]))
        k, dist = nearest(train.mix_cm[at], held.mix_cm[c])
        if dist > 10 ** -DECIMALS:
            borrowed.append(dist)
        same = at[np.all(np.round(train.mix_cm[at], DECIMALS) == np.round(train.mix_cm[at[k]], DECIMALS), axis=1)]
        pred_cv[c] = train.obs_cv[_matched_checkpoint(train, same, held.frac_c[c])]
    notes = [f"proxy size {', '.join(f'{s:.4g}' for s in sorted(proxies))}"]
    if borrowed:
        notes.append(_borrowed_note(borrowed, len(held), "proxy mixture"))
    return {"pred_cv": pred_cv, "rank_cv": pred_cv, "rank_c": pred_cv.mean(axis=1), "notes": "; ".join(notes)}


def trend(train: Cells, held: Cells) -> dict:
    """Per mixture and domain, ``log L = a + b log N`` over its training sizes, extrapolated."""
    mid_c = mixture_ids(np.concatenate([train.mix_cm, held.mix_cm]))
    mid_train, mid_held = mid_c[: len(train)], mid_c[len(train):]
    pred_cv = np.empty_like(held.obs_cv)
    borrowed, n_sizes = [], []
    for c in range(len(held)):
        below = train.size_c < held.size_c[c]
        ok = [m for m in np.unique(mid_train[below]) if len(np.unique(train.size_c[below & (mid_train == m)])) >= 2]
        if not ok:
            raise BaselineSkipped(f"no mixture was run at 2 or more training sizes below {held.size_c[c]:.4g} "
                                  "(a trend needs the same mixture at >= 2 sizes)")
        if mid_held[c] in ok:
            m = mid_held[c]
        else:
            reps = np.array([np.flatnonzero(below & (mid_train == m))[0] for m in ok])
            k, dist = nearest(train.mix_cm[reps], held.mix_cm[c])
            m = ok[k]
            borrowed.append(dist)
        sel = np.flatnonzero(below & (mid_train == m))
        sizes = np.unique(train.size_c[sel])
        n_sizes.append(len(sizes))
        pts = [_matched_checkpoint(train, sel[train.size_c[sel] == s], held.frac_c[c]) for s in sizes]
        log_n = np.log(sizes)
        coef_2v = np.polyfit(log_n, np.log(train.obs_cv[pts]), 1)  # rows: slope b, intercept a
        pred_cv[c] = np.exp(coef_2v[1] + coef_2v[0] * np.log(held.size_c[c]))
    notes = [f"power law over {min(n_sizes)}-{max(n_sizes)} sizes" if min(n_sizes) != max(n_sizes)
             else f"power law over {n_sizes[0]} sizes"]
    if borrowed:
        notes.append(_borrowed_note(borrowed, len(held), "mixture with a trend"))
    return {"pred_cv": pred_cv, "rank_cv": pred_cv, "rank_c": pred_cv.mean(axis=1), "notes": "; ".join(notes)}


def rank_by_weight(held: Cells, loss_domains, mix_domains) -> dict:
    """Per validation domain v that is a training domain: score ``-r_v`` (NaN for the others)."""
    shared = [d for d in loss_domains if d in mix_domains]
    if not shared:
        raise BaselineSkipped("no validation domain is also a training domain")
    rank_cv = np.full((len(held), len(loss_domains)), np.nan)
    for v, d in enumerate(loss_domains):
        if d in mix_domains:
            rank_cv[:, v] = -held.mix_cm[:, list(mix_domains).index(d)]
    return {"pred_cv": None, "rank_cv": rank_cv, "rank_c": None, "notes": f"domains {', '.join(shared)}"}


UNIMAX_MAX_EPOCHS = 4.0
"""UniMax's epoch cap per domain (see the module docstring)."""


def unimax_weights(unique_m: np.ndarray, budget: float, max_epochs: float = UNIMAX_MAX_EPOCHS) -> np.ndarray:
    """(M,) UniMax mixture for a budget of ``budget`` tokens over domains of ``unique_m`` unique
    tokens: ascending by size, each domain takes the equal share of the remaining budget, at most
    ``max_epochs x U_j``. When every domain is capped (budget > max_epochs x sum U) the weights are
    the caps' proportions."""
    unique_m = np.asarray(unique_m, np.float64)
    give_m = np.zeros_like(unique_m)
    left, order = float(budget), np.argsort(unique_m, kind="stable")
    for i, j in enumerate(order):
        share = left / (len(order) - i)
        give_m[j] = min(share, max_epochs * unique_m[j])
        left -= give_m[j]
    return give_m / give_m.sum()


def kl_score(mix_cm: np.ndarray, ref_cm: np.ndarray) -> np.ndarray:
    """(C,) ``KL(r || p) = sum_j r_j log(r_j / p_j)`` per cell (0 log 0 = 0; inf where r_j > 0 = p_j)."""
    r, p = np.asarray(mix_cm, np.float64), np.asarray(ref_cm, np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        term = np.where(r > 0, r * (np.log(np.where(r > 0, r, 1.0)) - np.log(p)), 0.0)
    return np.sum(term, axis=1)


def _needs_unique(held: Cells) -> np.ndarray:
    if held.unique_cm is None:
        raise BaselineSkipped("the table has no unique tokens per training domain (columns unique:<domain>), so "
                              "sources of unequal size cannot be weighed")
    return held.unique_cm


def proportional(held: Cells, loss_domains) -> dict:
    """Rank by KL divergence from the mixture proportional to unique tokens."""
    u_cm = _needs_unique(held)
    p_cm = u_cm / u_cm.sum(axis=1, keepdims=True)
    score_c = kl_score(held.mix_cm, p_cm)
    ref = ", ".join(f"{x:.3f}" for x in p_cm[0])
    return {"pred_cv": None, "rank_cv": np.repeat(score_c[:, None], len(loss_domains), axis=1), "rank_c": score_c,
            "notes": f"proportional mixture ({ref})"}


def unimax(held: Cells, loss_domains, max_epochs: float = UNIMAX_MAX_EPOCHS) -> dict:
    """Rank by KL divergence from the UniMax mixture at each cell's token budget."""
    u_cm = _needs_unique(held)
    ref_cm = np.stack([unimax_weights(u_cm[c], held.tokens_c[c], max_epochs) for c in range(len(held))])
    score_c = kl_score(held.mix_cm, ref_cm)
    last = int(np.argmax(held.tokens_c))
    ref = ", ".join(f"{x:.3f}" for x in ref_cm[last])
    return {"pred_cv": None, "rank_cv": np.repeat(score_c[:, None], len(loss_domains), axis=1), "rank_c": score_c,
            "notes": f"cap {max_epochs:g} epochs; UniMax mixture at {held.tokens_c[last]:.4g} tokens ({ref})"}


BASELINES = {
    "uniform": "closer to uniform is better (rank by entropy); pick: the most uniform mixture run",
    "best_at_proxy": "each mixture's loss at the largest training size below, taken as is",
    "trend": "each mixture's own power law in N over the training sizes, extrapolated",
    "rank_by_weight": "per domain: more weight on the domain, lower its loss",
    "proportional": "closer to the mixture proportional to each domain's unique tokens is better (KL)",
    "unimax": f"closer to UniMax (as uniform as a cap of {UNIMAX_MAX_EPOCHS:g} epochs per domain allows) is better (KL)",
}
"""name -> one-line description, in report order."""


def compute_baselines(train: Cells, held: Cells, loss_domains, mix_domains) -> dict[str, dict]:
    """{name: predictions dict (pred_cv, rank_cv, rank_c, notes) or {"skipped": reason}}."""
    makers = {
        "uniform": lambda: uniform(held, loss_domains),
        "best_at_proxy": lambda: best_at_proxy(train, held),
        "trend": lambda: trend(train, held),
        "rank_by_weight": lambda: rank_by_weight(held, loss_domains, mix_domains),
        "proportional": lambda: proportional(held, loss_domains),
        "unimax": lambda: unimax(held, loss_domains),
    }
    out = {}
    for name, make in makers.items():
        try:
            out[name] = make()
        except BaselineSkipped as e:
            out[name] = {"skipped": str(e)}
    return out
