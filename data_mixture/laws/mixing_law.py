"""``mixing_law``: the data mixing law of Ye et al. 2024 (arXiv 2403.16952) with its nested scaling laws.

Ye et al. predict the loss of a large model on any mixture in three nested steps: per mixture,
a scaling law in training steps and one in model size take the small runs to the target size
and tokens; then the data mixing law, fitted over the mixtures at the target, interpolates
between mixtures. Implemented here as:

Stage 1 (at fit time, one joint fit over all K distinct mixtures of the table):

    L_k(N, D) = E_k + A_k (N / n_ref)^-alpha + B_k (D / d_ref)^-beta        (mixture k)

with per-mixture E_k >= 0, A_k, B_k > 0 and exponents alpha, beta in [0, 3] shared by all
mixtures (per-mixture exponents need many sizes per mixture, which ladders rarely have; Ye et
al. also fit the size law on few sizes). Tokens D play the role of their training steps.
Parameters: 3K + 2. Every mixture needs runs at >= 2 model sizes and >= 2 token counts
(checkpoints), else its A_k or B_k is unidentifiable: the fit refuses such tables and names
the mixtures. A one-budget table (one token count, or one per model size: ``token_design``) is
the exception: there beta is fixed at Chinchilla's 0.28 and every B_k that merges into E_k and
A_k (all of them with one token count; with one per size, typically those of mixtures run at
only 2 sizes) at its lower bound (``ParametricLaw.resolve_fixed``), so each mixture needs >= 2
sizes only.

Stage 2 (at prediction time, for each distinct query (N, D)): fit over the K mixtures

    L(r) = c + k exp(sum_j t_j r_j),    t_1 = 0

(c >= 0, k > 0, t_j in [-20, 20]; t_1 = 0 because sum_j r_j = 1 makes a common shift of t
equivalent to rescaling k) to the stage-1 predictions L_k(N, D), with the same Huber-on-log
objective, and evaluate it at the query mixtures. M + 1 parameters per query point; results are
cached per (N, D) on the fit, so optimising the mixture at one target costs one stage-2 fit.
The optimum moves with scale whenever the per-mixture laws cross (``mixture_moves_with_scale``).
A bootstrap member refits stage 2 only over the mixtures its resample contains.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from data_mixture.laws.base import Law, token_design
from data_mixture.laws.parametric import ParametricLaw
from data_mixture.solver import Fitter, Param, ParamSpec, starts_rng
from data_mixture.table import RunsTable, TableError, _rows

ROUND = 6  # mixtures equal to 6 decimals are the same mixture
STAGE2_STARTS = 16
_STAGE2: dict[int, Fitter] = {}


def mixture_ids(mix_rm: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(distinct mixtures (K, M) in first-seen order, id of each row (R,))."""
    keys = np.round(mix_rm, ROUND)
    _, first, inverse = np.unique(keys, axis=0, return_index=True, return_inverse=True)
    order = np.argsort(first)
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    return mix_rm[np.sort(first)], rank[inverse.reshape(-1)]


def stage2_spec(m: int) -> ParamSpec:
    return ParamSpec(
        [
            Param("c", (), 0.0, 50.0, (0.0, 2.0), doc="loss floor"),
            Param("k", (), 1e-8, 1e4, (0.05, 5.0), log=True, doc="scale"),
            Param("t", (m - 1,), -20.0, 20.0, (-2.0, 2.0), doc="domain coefficients 2..M (t_1 = 0)"),
        ]
    )


def stage2_log_loss(x, data):
    t = jnp.concatenate([jnp.zeros((1,), x["t"].dtype), x["t"]])
    return jnp.log(x["c"] + x["k"] * jnp.exp(data["mix"] @ t))


def _stage2_fitter(m: int) -> Fitter:
    if m not in _STAGE2:
        _STAGE2[m] = Fitter(stage2_spec(m), stage2_log_loss, iters=200)
    return _STAGE2[m]


class MixingLaw(ParametricLaw):
    name = "mixing_law"
    mixture_moves_with_scale = True

    # Stage-1 spec depends on the number of mixtures K, not only on M.
    def spec(self, k: int) -> ParamSpec:
        return ParamSpec(
            [
                Param("E", (k,), 0.0, 20.0, (0.1, 3.0), doc="per-mixture irreducible loss"),
                Param("A", (k,), 1e-8, 1e4, (0.05, 3.0), log=True, doc="per-mixture size coefficient at n_ref"),
                Param("B", (k,), 1e-8, 1e4, (0.05, 3.0), log=True, doc="per-mixture token coefficient at d_ref"),
                Param("alpha", (), 0.0, 3.0, (0.05, 1.0), doc="shared size exponent"),
                Param("beta", (), 0.0, 3.0, (0.05, 1.0), doc="shared token exponent"),
            ]
        )

    def table_spec(self, table: RunsTable) -> ParamSpec:
        return self.spec(len(mixture_ids(table.mix_rm)[0]))

    def num_params(self, m: int) -> int:
        raise NotImplementedError("mixing_law's parameter count is 3K + 2 (K mixtures) + M + 1 per query point")

    def min_runs(self, m: int) -> int:
        return 2 * (m + 2)

    def table_features(self, table, size_column, refs):
        data = self.features(table.size(size_column), table.tokens, table.mix_rm, refs)
        mixes, ids = mixture_ids(table.mix_rm)
        data["onehot"] = np.eye(len(mixes))[ids]
        return data

    def extra_info(self, table, weights):
        mixes, ids = mixture_ids(table.mix_rm)
        w = np.ones(len(table)) if weights is None else np.asarray(weights)
        present = np.bincount(ids, weights=w, minlength=len(mixes)) > 0
        return {"mixtures": mixes.tolist(), "mixture_present": present.tolist()}

    def extra_starts(self, spec, data, y, wts):
        """Variable projection: for fixed (alpha, beta) the law is linear in (E_k, A_k, B_k), so
        a grid of exponents with per-mixture least squares gives good starts in 3K + 2 dims."""
        oh = data["onehot"]
        loss = np.exp(y)
        starts = []
        for a in (0.2, 0.35, 0.5, 0.7):
            for b in (0.2, 0.35, 0.5, 0.7):
                e_k, a_k, b_k = [], [], []
                for k in range(oh.shape[1]):
                    rows = (oh[:, k] > 0) & (wts > 0)
                    x = np.stack([np.ones(rows.sum()), np.exp(-a * data["logn"][rows]), np.exp(-b * data["logd"][rows])], 1)
                    coef = np.linalg.lstsq(x, loss[rows], rcond=None)[0] if rows.sum() >= 3 else np.array([loss.mean(), 0.3, 0.3])
                    coef = np.clip(coef, [0.0, 1e-3, 1e-3], [20.0, 1e3, 1e3])
                    e_k.append(coef[0]), a_k.append(coef[1]), b_k.append(coef[2])
                starts.append(spec.pack({"E": e_k, "A": a_k, "B": b_k, "alpha": a, "beta": b}))
        return np.stack(starts)

    @staticmethod
    def log_loss(x, data):
        oh = data["onehot"]
        loss = oh @ x["E"] + (oh @ x["A"]) * jnp.exp(-x["alpha"] * data["logn"]) + (oh @ x["B"]) * jnp.exp(-x["beta"] * data["logd"])
        return jnp.log(loss)

    def check(self, table, domain, size_column, fixed=None):
        Law.check(self, table, domain, size_column)
        self._check_mixtures(table, size_column)
        super().check(table, domain, size_column, fixed=fixed)

    def _check_mixtures(self, table, size_column):
        mixes, ids = mixture_ids(table.mix_rm)
        m = table.mix_rm.shape[1]
        size = table.size(size_column)
        one_budget = token_design(table, size_column) != "varied"  # the token term is fixed (resolve_fixed)
        if len(mixes) < m + 2:
            raise TableError(
                f"law 'mixing_law' fits c + k exp(t . r) over mixtures at the target: {m} training domains need at least "
                f"{m + 2} distinct mixtures; the table has {len(mixes)}."
            )
        thin = []
        for k in range(len(mixes)):
            rows = np.flatnonzero(ids == k)
            ns, nd = len(np.unique(size[rows])), len(np.unique(table.tokens[rows]))
            if ns < 2 or (nd < 2 and not one_budget):
                thin.append((k, rows, ns, nd))
        if thin:
            parts = [
                f"mixture {np.round(mixes[k], 3).tolist()} ({_rows(rows[:3], table.run)}{'...' if len(rows) > 3 else ''}: "
                f"{ns} size(s), {nd} token count(s))"
                for k, rows, ns, nd in thin[:5]
            ]
            more = f" and {len(thin) - 5} more" if len(thin) > 5 else ""
            raise TableError(
                f"law 'mixing_law' extrapolates each mixture with its own scaling law in N and D, so every mixture needs runs at "
                f">= 2 model sizes (column {size_column!r}) and >= 2 token counts; {len(thin)} of {len(mixes)} do not: "
                f"{'; '.join(parts)}{more}. Train the same mixtures at several sizes (or use camel/additive/regmix)."
            )

    # -- stage 2 -------------------------------------------------------------------------------
    def stage2(self, fit, points: list[tuple[float, float]]) -> dict[tuple[float, float], dict]:
        """Mixing-law parameters at each (N, D) (cached on the fit)."""
        cache = fit._cache.setdefault("stage2", {})
        todo = [p for p in points if p not in cache]
        if todo:
            mixes = np.asarray(fit.info["mixtures"], np.float64)
            present = np.asarray(fit.info.get("mixture_present", [True] * len(mixes)), bool)
            kk, m = mixes.shape
            with jax.enable_x64(True):
                x1 = {k: jnp.asarray(v, jnp.float64) for k, v in fit.params.items()}
                ys = []
                for n, d in todo:
                    data = self.features(np.full(kk, n), np.full(kk, d), mixes, fit.info)
                    data["onehot"] = np.eye(kk)
                    ys.append(np.asarray(self.log_loss(x1, {k: jnp.asarray(v) for k, v in data.items()})))
            y_qk = np.stack(ys)
            s2 = stage2_spec(m)
            rng = starts_rng(0, 21, kk, m)
            w0 = []
            for y in y_qk:
                lm = np.exp(y[present])
                starts = [s2.sample(rng, STAGE2_STARTS)]
                for frac in (0.0, 0.5, 0.9):  # linearised starts: log(L - c) = log k + t . r
                    c = frac * lm.min()
                    feats = np.concatenate([np.ones((present.sum(), 1)), mixes[present][:, 1:]], axis=1)
                    coef, *_ = np.linalg.lstsq(feats, np.log(np.maximum(lm - c, 1e-12)), rcond=None)
                    starts.append(s2.pack({"c": c, "k": np.exp(np.clip(coef[0], -18, 9)), "t": np.clip(coef[1:], -19.9, 19.9)})[None])
                w0.append(s2.clip(np.concatenate(starts)))
            w, _, infos = _stage2_fitter(m).solve(
                np.stack(w0), {"mix": mixes}, y_qk, np.repeat(present[None].astype(np.float64), len(todo), 0), polish=0
            )
            for p, wi, inf in zip(todo, w, infos):
                cache[p] = {**s2.to_dict(wi), "objective": inf["objective"]}
        return {p: cache[p] for p in points}

    def predict(self, fit, size_r, tokens_r, mix_rm):
        keys = [(float(n), float(d)) for n, d in zip(size_r, tokens_r)]
        uniq = sorted(set(keys))
        params = self.stage2(fit, uniq)
        out = np.empty(len(keys))
        index = {p: i for i, p in enumerate(uniq)}
        group = np.array([index[k] for k in keys])
        for p, i in index.items():
            rows = group == i
            x = params[p]
            t = np.concatenate([[0.0], np.asarray(x["t"], np.float64)])
            out[rows] = x["c"] + x["k"] * np.exp(mix_rm[rows] @ t)
        return out

    def predict_jax(self, fit):
        """f(size_r, tokens_r, mix_rm): differentiable in mix_rm; size_r and tokens_r must be
        concrete (numpy) values, since stage 2 is refitted per (N, D) outside jax."""

        def f(size_r, tokens_r, mix_rm):
            size_r = np.asarray(size_r, np.float64).reshape(-1)
            tokens_r = np.broadcast_to(np.asarray(tokens_r, np.float64).reshape(-1), size_r.shape)
            keys = [(float(n), float(d)) for n, d in zip(size_r, tokens_r)]
            params = self.stage2(fit, sorted(set(keys)))
            c = jnp.asarray([params[k]["c"] for k in keys])
            kk = jnp.asarray([params[k]["k"] for k in keys])
            t = jnp.asarray([[0.0, *np.atleast_1d(params[k]["t"])] for k in keys])
            return c + kk * jnp.exp(jnp.sum(jnp.asarray(mix_rm) * t, axis=-1))

        return f
