"""``regmix`` and ``regmix_linear``: RegMix regressors (Liu et al. 2024, arXiv 2407.01492).

RegMix trains many small proxy runs on random mixtures and regresses the validation loss on the
mixture weights. Here the features are ``[r_1 .. r_M, log N, log D]`` (size and tokens as
features, so one regressor covers a ladder) and the target is ``log L``.

* ``regmix``: LightGBM gradient-boosted trees (``LGBM_PARAMS``; deterministic: fixed seed, one
  thread, ``deterministic=True``, row-wise histograms). Stored as LightGBM model text inside
  the JSON (``params["model"]``), never pickle. Its parameter count is the number of tree
  leaves. Trees are piecewise constant: beyond the largest fitted size or token count they
  predict as at the edge, so they cannot extrapolate in N or D (they can still rank
  mixtures). Trees may split on log N and then on a weight, so the optimum *can* move with
  scale (``mixture_moves_with_scale = True``).
* ``regmix_linear``: ``log L = sum_j w_j r_j + a log(N / n_ref) + b log(D / d_ref)`` by
  (weighted) least squares; no intercept since sum_j r_j = 1 already is one. M + 2 parameters.
  Linear in r, so its best mixture is a vertex of the simplex whatever N and D
  (``mixture_moves_with_scale = False``). Any coefficient can be fixed (``fixed={"b": 0,
  "w[1]": 1.0}``): the fixed columns' contribution is subtracted from log L and the rest solved
  by least squares. On a one-budget table (``token_design`` "single": log D is constant, a
  column of zeros; "per_size": log D is a function of log N) the token coefficient ``b`` is
  fixed at 0 unless given: the loss is assumed not to change with D at fixed N.

One-budget tables and ``regmix``: a constant log D feature is never split on, and one that is
a function of log N is split on in its place; both are fine for trees, which cannot extrapolate
in D anyway (``info["token_design"]`` records which case). ``regmix`` has no named parameters,
so it cannot fix any.
"""

from __future__ import annotations

import time
from typing import Any

import lightgbm as lgb
import numpy as np

from data_mixture.laws.base import Law, LawFit, size_range, token_design
from data_mixture.solver import Param, ParamSpec

LGBM_PARAMS: dict[str, Any] = {
    "objective": "regression",
    "learning_rate": 0.1,
    "num_leaves": 8,
    "max_depth": 4,
    "lambda_l2": 1e-3,
    "feature_fraction": 1.0,
    "bagging_fraction": 1.0,
    "verbose": -1,
    "num_threads": 1,
    "deterministic": True,
    "force_row_wise": True,
}
NUM_ROUNDS = 100


def _features(size_r, tokens_r, mix_rm) -> np.ndarray:
    return np.concatenate([mix_rm, np.log(size_r)[:, None], np.log(tokens_r)[:, None]], axis=1)


class RegMixLaw(Law):
    name = "regmix"
    mixture_moves_with_scale = True

    def min_sizes(self) -> int:
        return 1

    def min_runs(self, m: int) -> int:
        return max(10, 2 * (m + 2))

    def num_params(self, m: int) -> int:
        return NUM_ROUNDS * LGBM_PARAMS["num_leaves"]  # upper bound; the fit records the real count

    def fit(self, table, domain, *, size_column="params_total", seed=0, starts=64, init=None, weights=None, progress=False, fixed=None):
        self.check(table, domain, size_column, fixed=fixed)
        t0 = time.perf_counter()
        x = _features(table.size(size_column), table.tokens, table.mix_rm)
        y = np.log(table.loss(domain))
        w = None if weights is None else np.asarray(weights, np.float64)
        keep = np.ones(len(y), bool) if w is None else w > 0
        params = {**LGBM_PARAMS, "seed": int(seed), "min_data_in_leaf": int(max(2, min(20, keep.sum() // 10)))}
        ds = lgb.Dataset(x[keep], y[keep], weight=None if w is None else w[keep], free_raw_data=True, params={"verbose": -1})
        booster = lgb.train(params, ds, num_boost_round=NUM_ROUNDS)
        dump = booster.dump_model()
        leaves = int(sum(t["num_leaves"] for t in dump["tree_info"]))
        fit = LawFit(
            self.name, domain, tuple(table.mix_domains), {"model": booster.model_to_string()}, leaves,
            {"size_column": size_column, "lgbm_params": params, "num_rounds": NUM_ROUNDS, "fit_seconds": time.perf_counter() - t0,
             "size_range": size_range(table, size_column),
             "token_range": [float(table.tokens.min()), float(table.tokens.max())], "token_design": token_design(table, size_column),
             "at_bounds": []},
        )
        fit._cache["booster"] = booster
        return fit

    def predict(self, fit, size_r, tokens_r, mix_rm):
        if "booster" not in fit._cache:
            fit._cache["booster"] = lgb.Booster(model_str=fit.params["model"])
        return np.exp(fit._cache["booster"].predict(_features(size_r, tokens_r, mix_rm), num_threads=1))


class RegMixLinearLaw(Law):
    name = "regmix_linear"
    mixture_moves_with_scale = False
    token_params = ("b",)

    def min_sizes(self) -> int:
        return 1

    def min_runs(self, m: int) -> int:
        return m + 3

    def num_params(self, m: int) -> int:
        return m + 2

    @staticmethod
    def spec(m: int) -> ParamSpec:
        """The coefficients as named (unbounded) parameters: what ``fixed`` may name."""
        return ParamSpec([Param("w", (m,), doc="log loss of each pure training domain at n_ref, d_ref"),
                          Param("a", (), doc="size coefficient of log L"), Param("b", (), doc="token coefficient of log L")])

    def check(self, table, domain, size_column, fixed=None):
        super().check(table, domain, size_column)
        self.spec(len(table.mix_domains)).fix(fixed or {}, law=self.name)

    def resolve_fixed(self, table, size_column, fixed=None) -> tuple[dict, str]:
        """(fixed, reason): the user's, plus b = 0 on a one-budget table unless b is given."""
        fixed = dict(fixed or {})
        parts = [f"{', '.join(fixed)} fixed by the user."] if fixed else []
        design = token_design(table, size_column)
        if design != "varied" and "b" not in fixed:
            fixed["b"] = 0.0
            what = ("The table has one token count, so log D is constant" if design == "single" else
                    "The table has one token count per model size, so log D is a function of log N")
            parts.append(f"{what}: b fixed at 0 (the loss is assumed not to change with D at fixed N).")
        return fixed, " ".join(parts)

    def fit(self, table, domain, *, size_column="params_total", seed=0, starts=64, init=None, weights=None, progress=False, fixed=None):
        """Weighted least squares on the free coefficients: ``log L - X_fixed c_fixed = X_free c_free``."""
        self.check(table, domain, size_column, fixed=fixed)
        t0 = time.perf_counter()
        size = table.size(size_column)
        refs = {"n_ref": float(np.exp(np.mean(np.log(size)))), "d_ref": float(np.exp(np.mean(np.log(table.tokens))))}
        if init is not None:
            refs = {k: init.info[k] for k in ("n_ref", "d_ref")}
        if init is not None and fixed is None:
            fixed_all, reason = dict(init.info.get("fixed") or {}), init.info.get("fixed_reason", "")
        else:
            fixed_all, reason = self.resolve_fixed(table, size_column, fixed)
        m = table.mix_rm.shape[1]
        spec = self.spec(m).fix(fixed_all, law=self.name)
        x = np.concatenate([table.mix_rm, np.log(size / refs["n_ref"])[:, None], np.log(table.tokens / refs["d_ref"])[:, None]], axis=1)
        y = np.log(table.loss(domain))
        sw = np.ones(len(y)) if weights is None else np.sqrt(np.asarray(weights, np.float64))
        free = spec.free_index
        y_free = y - x @ spec.full(np.zeros(spec.size))
        coef_free, *_ = np.linalg.lstsq(x[:, free] * sw[:, None], y_free * sw, rcond=None)
        coef = spec.full(coef_free)
        resid = y - x @ coef
        params = {"w": coef[:m].tolist(), "a": float(coef[m]), "b": float(coef[m + 1])}
        info = {"size_column": size_column, **refs, "rmse_log": float(np.sqrt(np.mean(resid**2))), "fit_seconds": time.perf_counter() - t0,
                "token_range": [float(table.tokens.min()), float(table.tokens.max())], "token_design": token_design(table, size_column),
                "size_range": size_range(table, size_column), "at_bounds": []}
        if fixed_all:
            info["fixed"], info["fixed_reason"] = fixed_all, reason
        return LawFit(self.name, domain, tuple(table.mix_domains), params, spec.size, info)

    def predict(self, fit, size_r, tokens_r, mix_rm):
        p = fit.params
        log_l = mix_rm @ np.asarray(p["w"]) + p["a"] * np.log(size_r / fit.info["n_ref"]) + p["b"] * np.log(tokens_r / fit.info["d_ref"])
        return np.exp(log_l)

    def predict_jax(self, fit):
        import jax.numpy as jnp

        p, n_ref, d_ref = fit.params, fit.info["n_ref"], fit.info["d_ref"]

        def f(size_r, tokens_r, mix_rm):
            return jnp.exp(jnp.asarray(mix_rm) @ jnp.asarray(p["w"]) + p["a"] * jnp.log(jnp.asarray(size_r) / n_ref) + p["b"] * jnp.log(jnp.asarray(tokens_r) / d_ref))

        return f
