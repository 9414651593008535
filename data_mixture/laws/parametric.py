"""Base class of the laws written in ``jax.numpy``: spec of parameters + log-loss function.

A subclass defines :meth:`spec` (named parameters with bounds and start ranges for M training
domains) and :meth:`log_loss` (jnp, ``(params, data) -> (R,) log L``), where ``data`` holds
``logn = log(N / n_ref)``, ``logd = log(D / d_ref)`` and ``mix`` (R, M). ``n_ref`` and
``d_ref`` are the geometric means of N and D over the fit table's rows, stored in
``LawFit.info`` (fixed, not fitted): they make coefficients O(1) (A is the size term's value at
N = n_ref) whatever the scale of the table, 1M or 100B parameters.
"""

from __future__ import annotations

import abc
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from data_mixture.fitting import FTOL, HUBER_DELTA, Fitter, ParamSpec, starts_rng
from data_mixture.laws.base import Law, LawFit
from data_mixture.table import RunsTable, TableError

_FITTERS: dict[tuple[str, int], Fitter] = {}
BOOT_STARTS = 2  # starts per bootstrap resample: the point fit + 1 perturbed copy (``bootstrap_starts``)
BOOT_JITTER = 0.05  # sd of a perturbed bootstrap start, as a fraction of each parameter's start range
_PREDICT: dict[str, Any] = {}


def safe_pow(r, g):
    """r ** g for r >= 0 with finite gradients at r = 0 (0 ** g = 0 for g > 0)."""
    pos = r > 0
    lr = jnp.log(jnp.where(pos, r, 1.0))
    return jnp.where(pos, jnp.exp(g * lr), 0.0)


class ParametricLaw(Law):
    iters: int = 200          # stage-1 L-BFGS iterations of a point fit
    screen: int | None = 50   # ... after which only the best quarter of the starts go on (Fitter.solve)
    boot_iters: int = 30      # ... of a warm-started bootstrap resample (then boot_refine)
    boot_ftol: float = FTOL   # ... and its stopping tolerance (relative improvement per step)
    polish: int = 2           # best starts polished with scipy L-BFGS-B (point fit)
    boot_refine: int = 100    # Levenberg-Marquardt iterations (Fitter.refine) after a resample's stage 1
    delta: float = HUBER_DELTA
    needs_tokens: bool = True  # the form has a D term: the table needs >= 2 distinct token counts

    @abc.abstractmethod
    def spec(self, m: int) -> ParamSpec:
        """Parameters for M training domains."""

    @staticmethod
    @abc.abstractmethod
    def log_loss(x: dict, data: dict) -> jax.Array:
        """(R,) log of the predicted loss (jnp)."""

    def num_params(self, m: int) -> int:
        return self.spec(m).size

    def min_sizes(self) -> int:
        return 2

    def min_runs(self, m: int) -> int:
        return self.num_params(m) + 2

    def check(self, table: RunsTable, domain: str, size_column: str) -> None:
        super().check(table, domain, size_column)
        if self.needs_tokens and len(np.unique(table.tokens)) < 2:
            raise TableError(
                f"law {self.name!r} has a token term B / D^beta, but every row of the table has tokens = "
                f"{table.tokens[0]:g}; it needs at least 2 distinct token counts (several checkpoints per run, or runs of different lengths)."
            )
        p = self.table_spec(table).size
        if len(table) < p + 2:
            raise TableError(
                f"law {self.name!r} has {p} parameters for {len(table.mix_domains)} training domains; the table has "
                f"only {len(table)} rows (needs at least {p + 2})."
            )

    # -- data ---------------------------------------------------------------------------------
    @staticmethod
    def references(table: RunsTable, size_column: str) -> dict[str, float]:
        size = table.size(size_column)
        return {"n_ref": float(np.exp(np.mean(np.log(size)))), "d_ref": float(np.exp(np.mean(np.log(table.tokens))))}

    def features(self, size_r, tokens_r, mix_rm, info: dict) -> dict[str, np.ndarray]:
        return {
            "logn": np.log(np.asarray(size_r, np.float64) / info["n_ref"]),
            "logd": np.log(np.asarray(tokens_r, np.float64) / info["d_ref"]),
            "mix": np.asarray(mix_rm, np.float64),
        }

    def table_spec(self, table: RunsTable) -> ParamSpec:
        """The parameters for this table (default: from its number of training domains)."""
        return self.spec(len(table.mix_domains))

    def table_features(self, table: RunsTable, size_column: str, refs: dict) -> dict[str, np.ndarray]:
        return self.features(table.size(size_column), table.tokens, table.mix_rm, refs)

    def extra_info(self, table: RunsTable, weights: np.ndarray | None) -> dict:
        """Fixed quantities a fit stores in ``info`` besides the reference scales."""
        return {}

    def extra_starts(self, spec: ParamSpec, data: dict, y: np.ndarray, wts: np.ndarray) -> np.ndarray | None:
        """Data-driven starts (working vectors) added to the random ones; none by default."""
        return None

    def fitter(self, spec: ParamSpec) -> Fitter:
        key = (self.name, spec.size)
        if key not in _FITTERS:
            _FITTERS[key] = Fitter(spec, self.log_loss, delta=self.delta, iters=self.iters)
        return _FITTERS[key]

    # -- fitting ------------------------------------------------------------------------------
    def _make_fit(self, table, domain, w, objective, info_extra, refs, size_column, weights=None) -> LawFit:
        spec = self.table_spec(table)
        info = {"size_column": size_column, **refs, **self.extra_info(table, weights), "objective": float(objective), "huber_delta": self.delta, **info_extra}
        return LawFit(self.name, domain, tuple(table.mix_domains), spec.to_dict(w), spec.size, info)

    def fit(self, table, domain, *, size_column="params_total", seed=0, starts=64, init=None, weights=None, progress=False):
        return self.fit_domains(table, [domain], size_column=size_column, seed=seed, starts=starts, init=init, weights=weights, progress=progress)[domain]

    def fit_domains(self, table, domains, *, size_column="params_total", seed=0, starts=64, init=None, weights=None, progress=False):
        """Point fits of several validation domains in one solve (one stage-1 work queue for all
        their starts; per-domain polish). Each domain gets the same random starts as a fit of it
        alone, so ``fit_domains(t, [a, b])[a]`` equals ``fit(t, a)``."""
        domains = list(domains)
        for d in domains:
            self.check(table, d, size_column)
        t0 = time.perf_counter()
        spec = self.table_spec(table)
        refs = self.references(table, size_column) if init is None else {k: init.info[k] for k in ("n_ref", "d_ref")}
        data = self.table_features(table, size_column, refs)
        wts = np.ones(len(table)) if weights is None else np.asarray(weights, np.float64)
        rand = spec.sample(starts_rng(seed, 1), max(1, starts))
        y_qr, w0_q = [], []
        for d in domains:
            y = np.log(table.loss(d))
            w0 = rand
            extra = self.extra_starts(spec, data, y, wts)
            if extra is not None and len(extra):
                w0 = np.concatenate([spec.clip(extra), w0])
            if init is not None:
                w0 = np.concatenate([spec.pack(init.params)[None], w0])
            y_qr.append(y)
            w0_q.append(w0)
        w0_qsp = np.stack(w0_q)
        bar = tqdm(total=w0_qsp.shape[0] * w0_qsp.shape[1], desc=f"{self.name} {','.join(domains)}", disable=not progress, leave=False)
        w, v, infos = self.fitter(spec).solve(
            w0_qsp, data, np.stack(y_qr), np.repeat(wts[None], len(domains), 0), polish=self.polish, screen=self.screen, progress=bar
        )
        bar.close()
        dt = (time.perf_counter() - t0) / len(domains)
        return {
            d: self._make_fit(table, d, w[i], v[i], {**infos[i], "fit_seconds": dt}, refs, size_column, weights)
            for i, d in enumerate(domains)
        }

    def fit_bootstrap(self, table, domain, point, weights_br, *, size_column="params_total", seed=0, starts=BOOT_STARTS, progress=None):
        return self.fit_bootstrap_domains(table, {domain: point}, weights_br, size_column=size_column, seed=seed, starts=starts, progress=progress)[domain]

    def bootstrap_starts(self, spec: ParamSpec, w_point: np.ndarray, starts: int, seed: int, tag: int) -> np.ndarray:
        """(starts, P) working vectors of one resample: the point fit, then ``starts - 1``
        perturbed copies of it (Gaussian, sd = :data:`BOOT_JITTER` of each parameter's start
        range, clipped to the bounds), which let a resample leave the point fit along flat
        directions that a single warm start would barely move along."""
        if starts <= 1:
            return w_point[None]
        rng = starts_rng(seed, 2, tag)
        width = np.concatenate([np.full(p.size, (np.log(p.init[1]) - np.log(p.init[0])) if p.log else (p.init[1] - p.init[0])) for p in spec.params])
        jitter = w_point[None] + BOOT_JITTER * width[None] * rng.standard_normal((starts - 1, spec.size))
        return np.concatenate([w_point[None], spec.clip(jitter)])

    def fit_bootstrap_domains(self, table, points, weights_br, *, size_column="params_total", seed=0, starts=BOOT_STARTS, progress=None):
        """Every (domain, resample) in one solve, each warm-started by :meth:`bootstrap_starts`;
        up to ``boot_iters`` stage-1 iterations, no polish, then ``boot_refine`` iterations of
        Levenberg-Marquardt (:meth:`Fitter.refine`) from the better start, so that each resample
        ends at its own optimum (intervals as wide as fully converged ones). Returns
        {domain: [LawFit] * B}."""
        domains = list(points)
        if not domains:
            return {}
        spec = self.table_spec(table)
        point0 = points[domains[0]]
        refs = {k: point0.info[k] for k in ("n_ref", "d_ref")}
        data = self.table_features(table, size_column, refs)
        b = weights_br.shape[0]
        if b == 0:
            return {d: [] for d in domains}
        w0, y_qr, wts_qr = [], [], []
        for d in domains:
            w_point = spec.pack(points[d].params)
            y = np.log(table.loss(d))
            for i in range(b):
                w0.append(self.bootstrap_starts(spec, w_point, starts, seed, i))
                y_qr.append(y)
                wts_qr.append(weights_br[i])
        fitter, y_qr, wts_qr = self.fitter(spec), np.stack(y_qr), np.stack(wts_qr)
        w, v, infos = fitter.solve(
            np.stack(w0), data, y_qr, wts_qr, polish=0, iters=self.boot_iters, ftol=self.boot_ftol, progress=progress
        )
        if self.boot_refine:
            w, v, its = fitter.refine(w, data, y_qr, wts_qr, iters=self.boot_refine)
            infos = [{**inf, "objective": float(v[i]), "refine_iterations": int(its[i])} for i, inf in enumerate(infos)]
        out = {}
        for j, d in enumerate(domains):
            out[d] = [
                self._make_fit(table, d, w[j * b + i], v[j * b + i], {**infos[j * b + i], "resample": i}, refs, size_column, weights_br[i])
                for i in range(b)
            ]
        return out

    # -- prediction ---------------------------------------------------------------------------
    def _jitted(self):
        if self.name not in _PREDICT:
            _PREDICT[self.name] = jax.jit(lambda x, d: jnp.exp(self.log_loss(x, d)))
        return _PREDICT[self.name]

    def predict(self, fit, size_r, tokens_r, mix_rm):
        with jax.enable_x64(True):
            if "x64" not in fit._cache:
                fit._cache["x64"] = {k: jnp.asarray(v, jnp.float64) for k, v in fit.params.items()}
            data = {k: jnp.asarray(v) for k, v in self.features(size_r, tokens_r, mix_rm, fit.info).items()}
            return np.asarray(self._jitted()(fit._cache["x64"], data), np.float64)

    def predict_jax(self, fit):
        n_ref, d_ref = fit.info["n_ref"], fit.info["d_ref"]
        params = fit.params

        def f(size_r, tokens_r, mix_rm):
            x = {k: jnp.asarray(v) for k, v in params.items()}
            data = {"logn": jnp.log(jnp.asarray(size_r) / n_ref), "logd": jnp.log(jnp.asarray(tokens_r) / d_ref), "mix": jnp.asarray(mix_rm)}
            return jnp.exp(self.log_loss(x, data))

        return f
