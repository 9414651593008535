"""Base class of the laws written in ``jax.numpy``: spec of parameters + log-loss function.

A subclass defines :meth:`spec` (named parameters with bounds and start ranges for M training
domains) and :meth:`log_loss` (jnp, ``(params, data) -> (R,) log L``), where ``data`` holds
``logn = log(N / n_ref)``, ``logd = log(D / d_ref)`` and ``mix`` (R, M). ``n_ref`` and
``d_ref`` are the geometric means of N and D over the fit table's rows, stored in
``LawFit.info`` (fixed, not fitted): they make coefficients O(1) (A is the size term's value at
N = n_ref) whatever the scale of the table, 1M or 100B parameters.

Fixed parameters (``fit(..., fixed={"beta": 0.28, "s[2]": 0})``): held constant, the optimisers
see only the free sub-vector (``ParamSpec.fix``). A table with one token budget per size
(:func:`data_mixture.laws.base.token_design` "single" or "per_size") cannot identify the token
term, so the law fixes it itself (:meth:`ParametricLaw.resolve_fixed`):

* the token exponent (``token_exponent``, "beta") at ``token_exponent_default`` = 0.28, the
  Chinchilla fit's (Hoffmann et al. 2022, approach 3: L = E + A N^-0.34 + B D^-0.28);
* then every remaining entry of ``token_params`` (e.g. "B") that multiplies nothing but a
  function of D (its column of the Jacobian d log L / d w, with every D set to d_ref, is a
  linear combination of the other free columns: additive's B merges into E, mixing_law's B_k
  into E_k) at its lower bound: the token term is dropped and the loss does not change with D.
  A coefficient whose term also carries the mixture or the size (camel's B (d S)^-beta) stays
  free.

``LawFit.info["fixed"]`` ({key: value}) and ``info["fixed_reason"]`` record what and why;
predictions at token counts outside the table's then warn (``base.warn_fixed_tokens``).
"""

from __future__ import annotations

import abc
import math
import time
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from data_mixture.laws.base import Law, LawFit, size_range, token_design
from data_mixture.solver import FTOL, HUBER_DELTA, Fitter, ParamSpec, _as_jax, starts_rng
from data_mixture.table import RunsTable, TableError

_FITTERS: dict[tuple[str, tuple], Fitter] = {}
BOOT_STARTS = 2  # starts per bootstrap resample: the point fit + 1 perturbed copy (``bootstrap_starts``)
BOOT_JITTER = 0.05  # sd of a perturbed bootstrap start, as a fraction of each parameter's start range
_PREDICT: dict[str, Any] = {}
TOKEN_EXPONENT_DEFAULT = 0.28  # Chinchilla (Hoffmann et al. 2022, approach 3): L = E + A N^-0.34 + B D^-0.28
COLLINEAR_TOL = 1e-6  # a unit Jacobian column whose least-squares residual on the others is below this is not identified
SURELY_MERGED = COLLINEAR_TOL / 2  # a candidate this close to one other column is in the others' span (margin for rounding)


def nearest_column_residuals(u_rp: np.ndarray, j: int, others: np.ndarray) -> np.ndarray:
    """(len(others),) distance of unit column ``j`` of ``u_rp`` to the line of each column in
    ``others`` (unit columns): ``|u_j - (u_j . u_k) u_k|``. The distance to the span of all of
    them is at most the smallest, so a smallest one below :data:`SURELY_MERGED` settles that
    column j is collinear with the others without a least-squares solve over all of them (one
    token coefficient per mixture, mixing_law's B_k, each a copy of its E_k: on a 128-mixture
    table that was 128 least-squares solves of a 512 x 385 system)."""
    u_o = u_rp[:, others]
    g = u_rp[:, j] @ u_o
    return np.linalg.norm(u_rp[:, j, None] - u_o * g[None, :], axis=0)


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
    token_params: ClassVar[tuple[str, ...]] = ("B", "beta")  # the token term's parameters (subclasses with other names override)
    token_exponent: str | None = "beta"           # fixed at token_exponent_default on one-budget tables (None: never)
    token_exponent_default: float = TOKEN_EXPONENT_DEFAULT

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

    def check(self, table: RunsTable, domain: str, size_column: str, fixed: dict | None = None) -> None:
        """Law.check, plus: ``fixed`` names parameters of this law within their bounds, and the
        table has at least (free parameters + 2) rows (on a one-budget table after
        :meth:`resolve_fixed`, in :meth:`fit_domains`, still before any fitting)."""
        super().check(table, domain, size_column)
        spec = self.table_spec(table).fix(fixed or {}, law=self.name)
        if token_design(table, size_column) == "varied":
            self._check_rows(table, spec)

    def _check_rows(self, table: RunsTable, spec: ParamSpec) -> None:
        if len(table) < spec.size + 2:
            raise TableError(
                f"law {self.name!r} has {spec.size} free parameters for {len(table.mix_domains)} training domains"
                f"{f' ({len(spec.fixed)} fixed)' if spec.fixed else ''}; the table has only {len(table)} rows "
                f"(needs at least {spec.size + 2})."
            )

    # -- fixed parameters ---------------------------------------------------------------------
    def resolve_fixed(self, table: RunsTable, size_column: str, fixed: dict | None = None, refs: dict | None = None) -> tuple[dict, str]:
        """(fixed {key: natural value}, reason) for a fit of this table: the user's ``fixed``
        plus, on a one-budget table (``token_design`` "single" or "per_size"), the token
        exponent at its default and the token coefficients the table cannot tell apart from
        other terms at their lower bounds (see the module docstring). The user's values win."""
        spec = self.table_spec(table)
        user = dict(fixed or {})
        spec_user = spec.fix(user, law=self.name)
        parts = [f"{', '.join(user)} fixed by the user."] if user else []
        design = token_design(table, size_column)
        if design == "varied" or self.token_exponent not in spec.names:
            return user, " ".join(parts)
        auto: dict[str, float] = {}
        if not set(spec.fixed_entries({self.token_exponent: 1.0})) <= set(spec_user.fixed):
            auto[self.token_exponent] = self.token_exponent_default
        spec_auto = spec_user.fix(auto)
        refs = refs or self.references(table, size_column)
        dropped = self._merged_token_entries(spec_auto, self.table_features(table, size_column, refs))
        auto.update(dropped)
        tokens = np.unique(table.tokens)
        what = (f"The table has one token count (D = {tokens[0]:.4g}), so how the loss changes with D is not observed"
                if design == "single" else
                f"The table has one token count per model size ({len(tokens)} counts, D a function of N), so how the loss "
                f"changes with D cannot be told apart from how it changes with N")
        if self.token_exponent in auto:
            parts.append(f"{what}: {self.token_exponent} fixed at {self.token_exponent_default:g} (Chinchilla's token "
                         f"exponent, Hoffmann et al. 2022).")
        else:
            parts.append(f"{what}.")
        if dropped:
            into = "the constant E" if design == "single" else "the size term"
            parts.append(f"{', '.join(f'{k} = {v:g}' for k, v in dropped.items())} fixed at the lower bound: the term it scales "
                         f"depends on the rows only through D, which this table cannot tell apart from {into}, so the token "
                         f"term is dropped and predictions do not change with D.")
        return {**user, **auto}, " ".join(parts)

    def _merged_token_entries(self, spec: ParamSpec, data: dict) -> dict[str, float]:
        """{key: lower bound} of the free entries of ``token_params`` whose Jacobian column
        J_j = d log L / d w_j, at a random start over the table's rows with every D set to d_ref
        (``logd = 0``: the token term's dependence on D removed), lies in the span of the other
        free columns: ``|J_j / |J_j| - O c| < COLLINEAR_TOL`` with c the least-squares
        coefficients on the other (unit) columns O. Such a coefficient multiplies nothing but a
        function of D, which a one-budget table cannot tell apart from a constant (one token
        count: B merges into E) or from the size term (one count per size); a coefficient whose
        term also carries the mixture or the size (camel's B (d S)^-beta) stays free."""
        entries = spec.entries()
        cand = [j for j, i in enumerate(spec.free_index) if entries[i][0] in self.token_params and entries[i][0] != self.token_exponent]
        if not cand:
            return {}
        with jax.enable_x64(True):
            w0 = jnp.asarray(spec.sample(starts_rng(0, 3), 1)[0])
            data_j = _as_jax({**data, "logd": np.zeros_like(data["logd"])})
            jac = np.asarray(jax.jacfwd(lambda w: self.log_loss(spec.unpack(w), data_j))(w0), np.float64)
        jac = np.where(np.isfinite(jac), jac, 0.0)
        norm = np.linalg.norm(jac, axis=0)
        unit = jac / np.maximum(norm, 1e-300)
        merged: list[int] = []
        for j in cand:
            if norm[j] <= 1e-12 * max(norm.max(), 1e-300):
                merged.append(j)
                continue
            others = [k for k in range(spec.size) if k != j and k not in merged and norm[k] > 1e-12 * norm.max()]
            if others and nearest_column_residuals(unit, j, np.asarray(others)).min() < SURELY_MERGED:
                merged.append(j)  # a copy of one other column: in the span of them all (the solve below would agree)
                continue
            coef = np.linalg.lstsq(unit[:, others], unit[:, j], rcond=None)[0] if others else np.zeros(0)
            if np.linalg.norm(unit[:, j] - unit[:, others] @ coef) < COLLINEAR_TOL:
                merged.append(j)
        return self._entry_keys(spec, [int(spec.free_index[j]) for j in merged])

    @staticmethod
    def _entry_keys(spec: ParamSpec, flat: list[int]) -> dict[str, float]:
        """{NAME or NAME[i]: lower bound} for flat entries (NAME when all entries of a vector)."""
        entries, out = spec.entries(), {}
        by_name = {p.name: p for p in spec.params}
        for name in dict.fromkeys(entries[i][0] for i in flat):
            p = by_name[name]
            v = p.lo if math.isfinite(p.lo) else 0.0
            if p.log and v <= 0:
                continue
            idx = [entries[i][1] for i in flat if entries[i][0] == name]
            if not p.shape or len(idx) == p.size:
                out[name] = float(v)
            else:
                out.update({f"{name}[{k}]": float(v) for k in idx})
        return out

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
        key = (self.name, spec.key)
        if key not in _FITTERS:
            _FITTERS[key] = Fitter(spec, self.log_loss, delta=self.delta, iters=self.iters)
        return _FITTERS[key]

    # -- fitting ------------------------------------------------------------------------------
    def _make_fit(self, table, domain, spec, w, objective, info_extra, refs, size_column, weights=None, *, fixed=None, point=True) -> LawFit:
        """A LawFit of working vector ``w`` (free entries of ``spec``); ``fixed`` = (values, reason)."""
        info = {"size_column": size_column, **refs, **self.extra_info(table, weights), "objective": float(objective), "huber_delta": self.delta,
                "token_range": [float(np.min(table.tokens)), float(np.max(table.tokens))], "token_design": token_design(table, size_column),
                "size_range": size_range(table, size_column), **info_extra}
        if fixed and fixed[0]:
            info["fixed"], info["fixed_reason"] = dict(fixed[0]), fixed[1]
        if point:
            info["at_bounds"] = spec.at_bounds(w)
        return LawFit(self.name, domain, tuple(table.mix_domains), spec.to_dict(w), spec.size, info)

    def fit(self, table, domain, *, size_column="params_total", seed=0, starts=64, init=None, weights=None, progress=False, fixed=None):
        return self.fit_domains(table, [domain], size_column=size_column, seed=seed, starts=starts, init=init, weights=weights, progress=progress,
                                fixed=fixed)[domain]

    def fit_domains(self, table, domains, *, size_column="params_total", seed=0, starts=64, init=None, weights=None, progress=False, fixed=None):
        """Point fits of several validation domains in one solve (one stage-1 work queue for all
        their starts; per-domain polish). Each domain gets the same random starts as a fit of it
        alone, so ``fit_domains(t, [a, b])[a]`` equals ``fit(t, a)``. ``fixed``: parameters held
        constant ({NAME or NAME[i]: value}, :meth:`resolve_fixed` adds a one-budget table's);
        with ``init`` and no ``fixed``, the init fit's fixed values are kept."""
        domains = list(domains)
        for d in domains:
            self.check(table, d, size_column, fixed=fixed)
        t0 = time.perf_counter()
        refs = self.references(table, size_column) if init is None else {k: init.info[k] for k in ("n_ref", "d_ref")}
        if init is not None and fixed is None:
            fixed_all, reason = dict(init.info.get("fixed") or {}), init.info.get("fixed_reason", "")
        else:
            fixed_all, reason = self.resolve_fixed(table, size_column, fixed, refs)
        spec = self.table_spec(table).fix(fixed_all, law=self.name)
        self._check_rows(table, spec)
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
            d: self._make_fit(table, d, spec, w[i], v[i], {**infos[i], "fit_seconds": dt}, refs, size_column, weights, fixed=(fixed_all, reason))
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
        width = spec.init_width()
        jitter = w_point[None] + BOOT_JITTER * width[None] * rng.standard_normal((starts - 1, spec.size))
        return np.concatenate([w_point[None], spec.clip(jitter)])

    def fit_bootstrap_domains(self, table, points, weights_br, *, size_column="params_total", seed=0, starts=BOOT_STARTS, progress=None):
        """Every (domain, resample) in one solve, each warm-started by :meth:`bootstrap_starts`;
        up to ``boot_iters`` stage-1 iterations, no polish, then ``boot_refine`` iterations of
        Levenberg-Marquardt (:meth:`Fitter.refine`) from the better start, so that each resample
        ends at its own optimum (intervals as wide as fully converged ones). Every member keeps
        the point fits' fixed parameters. Returns {domain: [LawFit] * B}."""
        domains = list(points)
        if not domains:
            return {}
        point0 = points[domains[0]]
        fixed = (dict(point0.info.get("fixed") or {}), point0.info.get("fixed_reason", ""))
        spec = self.table_spec(table).fix(fixed[0], law=self.name)
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
                self._make_fit(table, d, spec, w[j * b + i], v[j * b + i], {**infos[j * b + i], "resample": i}, refs, size_column, weights_br[i],
                               fixed=fixed, point=False)
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
