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

**Practitioner rules** -- the rule a careful practitioner uses without any law; a law's pick
matters only where it beats these too. Both take a cap of K epochs per domain at the target's
token budget D (K in ``PRACTITIONER_EPOCHS`` = 4 and 16: Muennighoff et al. 2023, "Scaling
Data-Constrained Language Models", find repeated tokens worth nearly as much as new ones up to
about 4 epochs and of little value after about 16) and fill it by :func:`capped_mixture`:

- ``target_capped_<K>``: the target's own weights on the training domains (``--target
  knowledge=0.75,prose=0.25`` -> knowledge 0.75, prose 0.25; no target: equal weights over the
  validation domains that are training domains); target columns that are not training domains
  are dropped and the rest renormalised; a training domain the target does not score gets 0.
  Each domain is capped at ``K x U_d / D`` (``U_d`` its unique tokens, ``unique:<domain>``;
  a domain without a pool is not capped); the excess goes to the uncapped target domains in
  proportion to their weights, repeatedly until none exceeds its cap. Only when every target
  domain is capped does the rest go to the other domains, equally (each under its own cap); when
  even that cannot fill D the rule is skipped with the numbers.
- ``proxy_capped_<K>``: the best mixture at the largest proxy size (the lowest seed-mean loss on
  the metric -- the target, or the mean over validation domains -- at the final checkpoint of the
  largest training size), with the same caps at D, the excess to its other domains in proportion.

**A held-out target** (one no run trains on, e.g. ``--target heldout_qa``, or a benchmark's
``logprob:<task>``) weights no training domain, so ``target_capped_<K>`` does not apply (skipped,
saying so) and ``proxy_capped_<K>`` is the practitioner's rule for it. A target that weights some
training domains and some held-out columns keeps the training-domain part, renormalised.

In :mod:`data_mixture.evaluate` a practitioner rule ranks each held-out cell by the total variation
distance ``0.5 sum_j |r_j - p_j|`` between its mixture r and the rule's mixture p at that cell's
own token budget and pools (closer = predicted better; KL is infinite where the rule gives a domain
0). ``recommend`` and ``optimize``'s robust report use the rules' mixtures at the target itself
(:func:`practitioner_mixtures`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

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
    pool_cm: np.ndarray | None = None  # (C, M) each domain's pool, inf where unlimited (no unique:<domain>); None: unreadable

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
    try:
        pool_cm = np.asarray(table.unique_rm(), np.float64)[first] if callable(getattr(table, "unique_rm", None)) else None
    except ValueError:  # a TableError: a unique: cell that is not a number > 0, or one naming no training domain
        pool_cm = None
    return Cells(size_c, tokens_c, tokens_c / final, mix_cm, obs_cv, np.array([len(r) for r in runs]), runs, reps,
                 None if unique_rm is None else unique_rm[first], pool_cm)


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

PRACTITIONER_EPOCHS = (4.0, 16.0)
"""K of the practitioner rules' epoch caps (see the module docstring)."""
PRACTITIONER_RULES = ("target_capped", "proxy_capped")


def practitioner_names(epochs=PRACTITIONER_EPOCHS) -> list[str]:
    """``target_capped_4, target_capped_16, proxy_capped_4, proxy_capped_16`` (for the default K)."""
    return [f"{rule}_{k:g}" for rule in PRACTITIONER_RULES for k in epochs]


def _water_fill(pref_m: np.ndarray, cap_m: np.ndarray, left: float) -> np.ndarray:
    """Shares of ``left`` in proportion to ``pref_m`` (> 0 only), none above its ``cap_m``: a
    domain whose proportional share exceeds its cap takes the cap, the rest is shared again."""
    give = np.zeros_like(pref_m)
    free = pref_m > 0
    while free.any() and left > 1e-15:
        share = left * pref_m * free / pref_m[free].sum()
        over = free & (share > cap_m - give + 1e-15)
        if not over.any():
            return give + share
        left -= float((cap_m[over] - give[over]).sum())
        give[over] = cap_m[over]
        free &= ~over
    return give


def capped_mixture(pref_m, pool_m, budget: float, max_epochs: float) -> tuple[np.ndarray, str]:
    """(M,) a practitioner rule's mixture and a note: ``pref_m`` (>= 0, the rule's weights) with each
    domain capped at ``max_epochs x pool_m / budget`` (``inf`` pool: no cap), the excess to the
    uncapped domains of ``pref_m`` in proportion; when all of them are capped, the rest to the other
    domains equally (each under its cap). BaselineSkipped when no mixture fills the budget."""
    pref = np.asarray(pref_m, np.float64)
    pool = np.asarray(pool_m, np.float64)
    if not (np.isfinite(budget) and budget > 0) or not pref.sum() > 0:
        raise BaselineSkipped(f"no token budget (D = {budget!r}) or no weight to start from")
    cap = np.minimum(1.0, np.where(np.isfinite(pool), max_epochs * pool / budget, np.inf))
    w = _water_fill(pref / pref.sum(), cap, 1.0)
    capped = [j for j in range(len(pref)) if pref[j] > 0 and w[j] >= cap[j] - 1e-12 and cap[j] < 1]
    note = ""
    left = 1.0 - w.sum()
    if left > 1e-9:
        rest = (pref <= 0).astype(np.float64)
        w = w + _water_fill(rest, cap, left)
        note = f"every preferred domain capped; {left:.3g} given to the others"
        if 1.0 - w.sum() > 1e-9:
            raise BaselineSkipped(f"{max_epochs:g} epochs of every pool hold {min(1.0, float(cap.sum())):.3g} of the "
                                  f"{budget:.4g} tokens: no mixture fills the budget under the cap")
    if capped and not note:
        note = f"{len(capped)} domain(s) at the {max_epochs:g}-epoch cap"
    return w / w.sum(), note


def target_preference(target, mix_domains, loss_domains=()) -> tuple[np.ndarray | None, str]:
    """(M,) the target's weights on the training domains (renormalised) and a note, or (None, why)
    when it weights none (a held-out target: only ``proxy_capped`` applies). ``target``: a
    :class:`data_mixture.target.Target`, its text, a {loss domain: weight} mapping, or None (equal
    weights over ``loss_domains``)."""
    from data_mixture.target import resolve

    if target is None:
        weights = {d: 1.0 for d in loss_domains}
        label = "the mean over the validation domains"
    elif isinstance(target, dict):
        weights, label = dict(target), ", ".join(f"{d}={w:g}" for d, w in target.items())
    else:
        t = resolve(target)
        weights = {c.split(":", 1)[1]: w for c, w in t.weights.items() if c.startswith("loss:")}
        label = t.text
    pref = np.array([float(weights.get(d, 0.0)) for d in mix_domains])
    if not pref.sum() > 0:
        return None, (f"the target ({label}) weights no training domain ({', '.join(mix_domains)}): target-capped does "
                      "not apply to a held-out target; proxy-capped is the practitioner rule for it")
    dropped = sorted(set(weights) - set(mix_domains))
    note = f"target weights of {label}" + (f" (not trained: {', '.join(dropped)} dropped, the rest renormalised)"
                                           if dropped and target is not None else "")
    return pref / pref.sum(), note


def proxy_best(cells: Cells) -> tuple[np.ndarray, str]:
    """(M,) the mixture with the lowest seed-mean loss (mean over the cells' validation domains) at
    the final checkpoint of the largest size in ``cells``, and which cell it is."""
    at = np.flatnonzero(np.isclose(cells.size_c, cells.size_c.max()) & cells.final_c)
    k = at[int(np.argmin(cells.obs_cv[at].mean(axis=1)))]
    return cells.mix_cm[k], f"{cells.label(k)} at size {cells.size_c[k]:.4g}"


def tv_distance(mix_cm: np.ndarray, ref_cm: np.ndarray) -> np.ndarray:
    """(C,) total variation distance ``0.5 sum_j |r_j - p_j|``."""
    return 0.5 * np.abs(np.asarray(mix_cm, np.float64) - np.asarray(ref_cm, np.float64)).sum(axis=1)


def practitioner(held: Cells, loss_domains, pref_m: np.ndarray, max_epochs: float, what: str) -> dict:
    """Rank held-out cells by TV distance from the rule's mixture at each cell's budget and pools."""
    if held.pool_cm is None:
        raise BaselineSkipped("the table's unique:<domain> columns are not readable as pools")
    memo: dict[tuple, tuple[np.ndarray, str]] = {}
    ref_cm = np.empty_like(held.mix_cm)
    for c in range(len(held)):
        key = (float(held.tokens_c[c]), *held.pool_cm[c].tolist())
        if key not in memo:
            memo[key] = capped_mixture(pref_m, held.pool_cm[c], held.tokens_c[c], max_epochs)
        ref_cm[c] = memo[key][0]
    score_c = tv_distance(held.mix_cm, ref_cm)
    last = int(np.argmax(held.tokens_c))
    ref = ", ".join(f"{x:.3f}" for x in ref_cm[last])
    note = memo[(float(held.tokens_c[last]), *held.pool_cm[last].tolist())][1]
    return {"pred_cv": None, "rank_cv": np.repeat(score_c[:, None], len(loss_domains), axis=1), "rank_c": score_c,
            "notes": f"{what}; cap {max_epochs:g} epochs; at {held.tokens_c[last]:.4g} tokens ({ref})"
                     + (f"; {note}" if note else "")}


def practitioner_mixtures(mix_domains, *, tokens: float, pools=None, target=None, loss_domains=(),
                          proxy: tuple[np.ndarray, str] | None = None,
                          epochs=PRACTITIONER_EPOCHS) -> dict[str, dict]:
    """{name: {"weights": {domain: w}, "why": text} or {"skipped": reason}}: every practitioner
    rule's mixture at the target's ``tokens`` with ``pools`` {domain: unique tokens} (a domain not
    named is unlimited). ``target`` as :func:`target_preference`; ``proxy``: (weights (M,), which
    cell) of the best mixture at the largest proxy size (:func:`proxy_best`), None: skipped."""
    pools = dict(pools or {})
    pool_m = np.array([float(pools.get(d, np.inf)) for d in mix_domains])
    pref, pref_note = target_preference(target, mix_domains, loss_domains)
    starts = {"target_capped": (pref, pref_note), "proxy_capped": (None, "no proxy size")
              if proxy is None else (np.asarray(proxy[0], np.float64), f"best at the largest proxy: {proxy[1]}")}
    out: dict[str, dict] = {}
    for rule in PRACTITIONER_RULES:
        start, note = starts[rule]
        for k in epochs:
            name = f"{rule}_{k:g}"
            if start is None:
                out[name] = {"skipped": note}
                continue
            try:
                w, cap_note = capped_mixture(start, pool_m, tokens, k)
            except BaselineSkipped as e:
                out[name] = {"skipped": str(e)}
                continue
            out[name] = {"weights": dict(zip(mix_domains, w.tolist())),
                         "why": f"{note}; cap {k:g} epochs at {tokens:.4g} tokens" + (f"; {cap_note}" if cap_note else "")}
    return out


def checked_pools(unique_tokens: Mapping[str, float], domains: Sequence[str], *, of: str = "the fit",
                  error: type[Exception] = TableError) -> dict[str, float]:
    """``--unique-tokens`` {domain: tokens} after checking that every domain is one ``of`` trains on
    and every count is a finite number > 0 (``error`` names the bad one otherwise)."""
    unknown = sorted(set(unique_tokens) - set(domains))
    if unknown:
        raise error(f"--unique-tokens names domain(s) {', '.join(unknown)} that {of} does not train on; its training "
                    f"domains: {', '.join(domains)}.")
    for d, v in unique_tokens.items():
        if not (math.isfinite(float(v)) and float(v) > 0):
            raise error(f"--unique-tokens {d}={v!r}; allowed: a number of tokens > 0.")
    return {d: float(v) for d, v in unique_tokens.items()}


def target_pools(table, unique_tokens: Mapping[str, float] | None) -> dict[str, float]:
    """{domain: unique tokens at the target}: ``unique_tokens``, else the table's largest pool per domain."""
    domains = tuple(table.mix_domains)
    if unique_tokens:
        return checked_pools(unique_tokens, domains, of="the table", error=TableError)
    u_rm = table.unique_rm()
    return {d: float(u_rm[:, j].max()) for j, d in enumerate(domains) if np.isfinite(u_rm[:, j]).any()}


def baseline_mixtures(table_t, size_column: str, target, tokens: float, pools: Mapping[str, float]) -> dict[str, dict]:
    """{name: {"weights", "why"} or {"skipped"}} of every baseline mixture at the target."""
    domains = tuple(table_t.mix_domains)
    cells = build_cells(table_t, size_column)
    out: dict[str, dict] = {"uniform": {"weights": {d: 1.0 / len(domains) for d in domains}, "why": "equal weights"}}
    u_m = np.array([pools.get(d, np.inf) for d in domains])
    if np.all(np.isfinite(u_m)):
        out["proportional"] = {"weights": dict(zip(domains, (u_m / u_m.sum()).tolist())), "why": "in proportion to the pools"}
        out["unimax"] = {"weights": dict(zip(domains, unimax_weights(u_m, tokens, UNIMAX_MAX_EPOCHS).tolist())),
                         "why": f"UniMax, cap {UNIMAX_MAX_EPOCHS:g} epochs at the target's tokens"}
    best, which = proxy_best(cells)
    out["best_at_proxy"] = {"weights": dict(zip(domains, best.tolist())), "why": f"lowest target loss: {which}"}
    out.update(practitioner_mixtures(domains, tokens=tokens, pools=pools, target=target,
                                     loss_domains=table_t.loss_domains, proxy=(best, which)))
    return out


BASELINES = {
    "uniform": "closer to uniform is better (rank by entropy); pick: the most uniform mixture run",
    "best_at_proxy": "each mixture's loss at the largest training size below, taken as is",
    "trend": "each mixture's own power law in N over the training sizes, extrapolated",
    "rank_by_weight": "per domain: more weight on the domain, lower its loss",
    "proportional": "closer to the mixture proportional to each domain's unique tokens is better (KL)",
    "unimax": f"closer to UniMax (as uniform as a cap of {UNIMAX_MAX_EPOCHS:g} epochs per domain allows) is better (KL)",
    **{f"target_capped_{k:g}": f"practitioner: closer (TV) to the target's own weights, {k:g}-epoch caps at the budget, "
                               "is better" for k in PRACTITIONER_EPOCHS},
    **{f"proxy_capped_{k:g}": f"practitioner: closer (TV) to the best mixture at the largest proxy, {k:g}-epoch caps "
                              "at the budget, is better" for k in PRACTITIONER_EPOCHS},
}
"""name -> one-line description, in report order."""


def compute_baselines(train: Cells, held: Cells, loss_domains, mix_domains, target=None) -> dict[str, dict]:
    """{name: predictions dict (pred_cv, rank_cv, rank_c, notes) or {"skipped": reason}}.
    ``target``: what the practitioner rules start from (:func:`target_preference`; None: the mean
    over ``loss_domains``)."""
    pref, pref_note = target_preference(target, mix_domains, loss_domains)

    def target_rule(k):
        if pref is None:
            raise BaselineSkipped(pref_note)
        return practitioner(held, loss_domains, pref, k, pref_note)

    def proxy_rule(k):
        if not len(train):
            raise BaselineSkipped("no training cells, so no proxy size")
        best, which = proxy_best(train)
        return practitioner(held, loss_domains, best, k, f"best at the largest proxy: {which}")

    makers = {
        "uniform": lambda: uniform(held, loss_domains),
        "best_at_proxy": lambda: best_at_proxy(train, held),
        "trend": lambda: trend(train, held),
        "rank_by_weight": lambda: rank_by_weight(held, loss_domains, mix_domains),
        "proportional": lambda: proportional(held, loss_domains),
        "unimax": lambda: unimax(held, loss_domains),
        **{f"target_capped_{k:g}": (lambda k=k: target_rule(k)) for k in PRACTITIONER_EPOCHS},
        **{f"proxy_capped_{k:g}": (lambda k=k: proxy_rule(k)) for k in PRACTITIONER_EPOCHS},
    }
    out = {}
    for name, make in makers.items():
        try:
            out[name] = make()
        except BaselineSkipped as e:
            out[name] = {"skipped": str(e)}
    return out
