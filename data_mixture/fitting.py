"""Robust multi-start fitting of parametric laws: Huber on residuals, vmapped L-BFGS, bounds, bootstrap.

Procedure (``docs/data_mixture.md``, "Fitting"):

1. The objective of one problem is ``sum_r w_r huber_delta(pred_r - y_r) / (delta * sum_r w_r)``.
   For loss laws ``pred`` and ``y`` are log losses (residuals are relative errors), with
   ``delta = 1e-3`` as in the Chinchilla replication of Besiroglu et al. 2024 (arXiv
   2404.10102): residuals beyond 0.1 % count linearly, so a few bad runs cannot drag the fit.
   Dividing by delta only rescales the objective (gradients O(1) for the optimisers' tolerances).
   ``w_r`` are row weights: 1 for a plain fit, a run's multiplicity in a bootstrap resample.
2. Each parameter has bounds in its working coordinate (``log`` parameters work in log space,
   e.g. the coefficients A, B spanning decades; exponents and weights in natural units). Stage 1
   runs all random starts of all problems at once: ``jax.vmap`` over starts of
   ``optax.lbfgs`` (zoom line search) in an unconstrained space (sigmoid / softplus maps onto
   the bounds, so bounds hold exactly), in a jitted ``jax.lax.while_loop`` that stops when a step
   improves the objective by less than ``FTOL`` (relative) or after ``iters`` iterations.
3. Stage 2 polishes the best few starts of each problem with ``scipy.optimize.minimize(method=
   "L-BFGS-B", bounds=...)`` in the working space, with the exact gradient from a jitted
   ``jax.value_and_grad``. The best value wins.
4. Everything runs in float64 inside ``jax.enable_x64(True)`` (a context manager: training code
   in the same process keeps its float32 default).

Determinism: starts come from ``numpy.random.default_rng(seed)``; XLA on CPU and scipy are
deterministic, so the same seed gives bit-identical parameters.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import scipy.optimize

HUBER_DELTA = 1e-3
CHUNK = 64  # problems per vmapped stage-1 call; every call is padded to it, so one compile serves point fits and bootstraps
FTOL = 1e-10  # stage 1 stops when a step improves the objective by less than this (relative)
LINESEARCH = lambda: optax.scale_by_backtracking_linesearch(max_backtracking_steps=20, decrease_factor=0.5, store_grad=True)  # noqa: E731


@dataclasses.dataclass(frozen=True)
class Param:
    """One named parameter: shape () or (k,), bounds in natural units, random-start range.

    ``log=True``: the working coordinate is log(x) (x > 0 spanning decades); bounds and ``init``
    are still given in natural units.
    """

    name: str
    shape: tuple[int, ...] = ()
    lo: float = -math.inf
    hi: float = math.inf
    init: tuple[float, float] = (0.0, 1.0)
    log: bool = False
    doc: str = ""

    @property
    def size(self) -> int:
        return int(np.prod(self.shape)) if self.shape else 1

    def wbounds(self) -> tuple[float, float]:
        if self.log:
            return (math.log(self.lo) if self.lo > 0 else -math.inf, math.log(self.hi) if math.isfinite(self.hi) else math.inf)
        return self.lo, self.hi


class ParamSpec:
    """An ordered set of :class:`Param`; packs natural dicts to working vectors and back."""

    def __init__(self, params: Sequence[Param]):
        self.params = tuple(params)
        self.size = sum(p.size for p in self.params)
        lo, hi = [], []
        for p in self.params:
            a, b = p.wbounds()
            lo += [a] * p.size
            hi += [b] * p.size
        self.lo = np.array(lo)
        self.hi = np.array(hi)
        self.is_log = np.concatenate([np.full(p.size, p.log) for p in self.params]) if self.params else np.zeros(0, bool)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)

    # working vector w (P,) <-> natural dict
    def unpack(self, w):
        """Working vector (..., P) -> {name: natural value} (jnp or np, following the input)."""
        xp = jnp if isinstance(w, jax.Array) else np
        out, i = {}, 0
        for p in self.params:
            v = w[..., i : i + p.size]
            if p.log:
                v = xp.exp(v)
            out[p.name] = v.reshape(w.shape[:-1] + p.shape)
            i += p.size
        return out

    def pack(self, x: Mapping[str, Any]) -> np.ndarray:
        parts = []
        for p in self.params:
            v = np.asarray(x[p.name], np.float64).reshape(-1)
            if v.size != p.size:
                raise ValueError(f"parameter {p.name!r} has {v.size} values; expected {p.size}.")
            parts.append(np.log(v) if p.log else v)
        return np.concatenate(parts) if parts else np.zeros(0)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """(n, P) random working vectors, uniform in each parameter's ``init`` range (log-uniform
        for log parameters), clipped inside the bounds."""
        cols = []
        for p in self.params:
            a, b = p.init
            if p.log:
                a, b = math.log(a), math.log(b)
            cols.append(rng.uniform(a, b, size=(n, p.size)))
        w = np.concatenate(cols, axis=1) if cols else np.zeros((n, 0))
        return self.clip(w)

    def clip(self, w: np.ndarray) -> np.ndarray:
        span = np.where(np.isfinite(self.hi - self.lo), self.hi - self.lo, 1.0)
        eps = 1e-6 * span
        return np.clip(w, self.lo + eps, self.hi - eps)

    def to_dict(self, w: np.ndarray) -> dict[str, Any]:
        """Working vector (P,) -> JSON-able {name: float | list}."""
        x = self.unpack(np.asarray(w, np.float64))
        return {k: (float(v) if np.ndim(v) == 0 else np.asarray(v).tolist()) for k, v in x.items()}


def _u_to_w(u, lo, hi):
    """Unconstrained u -> working w inside [lo, hi] (elementwise; jnp)."""
    lo_f, hi_f = jnp.isfinite(lo), jnp.isfinite(hi)
    lo0, hi0 = jnp.where(lo_f, lo, 0.0), jnp.where(hi_f, hi, 0.0)
    both = lo0 + (hi0 - lo0) * jax.nn.sigmoid(u)
    low = lo0 + jax.nn.softplus(u)
    high = hi0 - jax.nn.softplus(u)
    return jnp.where(lo_f & hi_f, both, jnp.where(lo_f, low, jnp.where(hi_f, high, u)))


def _w_to_u(w: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    lo_f, hi_f = np.isfinite(lo), np.isfinite(hi)
    with np.errstate(all="ignore"):
        frac = np.clip((w - np.where(lo_f, lo, 0)) / np.where(lo_f & hi_f, hi - lo, 1), 1e-9, 1 - 1e-9)
        both = np.log(frac) - np.log1p(-frac)
        d_lo = np.maximum(w - np.where(lo_f, lo, 0), 1e-12)
        d_hi = np.maximum(np.where(hi_f, hi, 0) - w, 1e-12)
        inv_sp = lambda d: np.where(d > 30, d, np.log(np.expm1(d)))  # noqa: E731
        out = np.where(lo_f & hi_f, both, np.where(lo_f, inv_sp(d_lo), np.where(hi_f, inv_sp(d_hi), w)))
    return out


PredictFn = Callable[[dict, dict], jax.Array]  # (natural params, data) -> (R,) prediction


class Fitter:
    """Fits one parametric form: ``predict(params, data) -> (R,)`` against targets ``y`` (R,).

    Build one per (spec, predict function); its jitted stage-1 and stage-2 functions are cached
    on it and retrace only for new shapes.
    """

    def __init__(self, spec: ParamSpec, predict: PredictFn, *, delta: float = HUBER_DELTA, iters: int = 200):
        self.spec = spec
        self.predict = predict
        self.delta = float(delta)
        self.iters = int(iters)
        self._stage1: dict[int, Callable] = {}
        self._vg = None

    def objective_w(self, w, data, y, wts):
        """Huber objective at working vector w (jnp)."""
        x = self.spec.unpack(w)
        pred = self.predict(x, data)
        res = pred - y
        h = optax.losses.huber_loss(res, jnp.zeros_like(res), delta=self.delta) / self.delta
        h = jnp.where(jnp.isfinite(h), h, 1e6)
        return jnp.sum(wts * h) / jnp.maximum(jnp.sum(wts), 1e-30)

    def _build_stage1(self, iters: int):
        lo, hi = jnp.asarray(self.spec.lo), jnp.asarray(self.spec.hi)
        opt = optax.lbfgs(memory_size=10, linesearch=LINESEARCH())

        def one(u0, y, wts, data):
            f = lambda u: self.objective_w(_u_to_w(u, lo, hi), data, y, wts)  # noqa: E731
            vg = optax.value_and_grad_from_state(f)

            def cond(carry):
                _, _, it, dv = carry
                return (it < iters) & (dv > FTOL)

            def step(carry):
                u, st, it, _ = carry
                v, g = vg(u, state=st)
                g = jnp.where(jnp.isfinite(g), g, 0.0)
                upd, st = opt.update(g, st, u, value=v, grad=g, value_fn=f)
                u_new = optax.apply_updates(u, upd)
                u_new = jnp.where(jnp.all(jnp.isfinite(u_new)), u_new, u)
                v_new = optax.tree_utils.tree_get(st, "value")
                dv = jnp.where(jnp.isfinite(v_new), (v - v_new) / (1.0 + jnp.abs(v)), jnp.inf)
                dv = jnp.where(it < 5, jnp.inf, jnp.abs(dv))  # a few steps before judging progress
                return u_new, st, it + 1, dv

            u, _, _, _ = jax.lax.while_loop(cond, step, (u0, opt.init(u0), jnp.asarray(0), jnp.asarray(jnp.inf)))
            v = f(u)
            return _u_to_w(u, lo, hi), jnp.where(jnp.isfinite(v), v, jnp.inf)

        return jax.jit(jax.vmap(one, in_axes=(0, 0, 0, None)))

    def _value_and_grad(self):
        if self._vg is None:
            self._vg = jax.jit(jax.value_and_grad(self.objective_w))
        return self._vg

    def solve(
        self,
        w0_qsp: np.ndarray,
        data: Mapping[str, np.ndarray],
        y_qr: np.ndarray,
        wts_qr: np.ndarray,
        *,
        polish: int = 3,
        iters: int | None = None,
        progress: Any = None,
    ) -> tuple[np.ndarray, np.ndarray, list[dict]]:
        """Minimises Q independent problems (target y_q, row weights wts_q) from S starts each.

        Returns (best working vectors (Q, P), best objective (Q,), per-problem info). Stage 1
        runs every (problem, start) at once, in chunks of :data:`CHUNK`; stage 2 polishes the
        ``polish`` best starts of each problem with scipy L-BFGS-B.
        """
        iters = self.iters if iters is None else int(iters)
        q, s, p = w0_qsp.shape
        t_start = time.perf_counter()
        with jax.enable_x64(True):
            if iters not in self._stage1:
                self._stage1[iters] = self._build_stage1(iters)
            stage1 = self._stage1[iters]
            data_j = {k: jnp.asarray(v, jnp.float64) for k, v in data.items()}
            lo, hi = self.spec.lo, self.spec.hi
            u0 = _w_to_u(self.spec.clip(w0_qsp.reshape(q * s, p)), lo, hi)
            y_all = np.repeat(y_qr, s, axis=0)
            wt_all = np.repeat(wts_qr, s, axis=0)
            n = q * s
            chunk = CHUNK
            w_out = np.empty((n, p))
            v_out = np.empty(n)
            for a in range(0, n, chunk):
                b = min(a + chunk, n)
                pad = chunk - (b - a)
                sl = lambda arr: np.concatenate([arr[a:b], np.repeat(arr[b - 1 : b], pad, axis=0)]) if pad else arr[a:b]  # noqa: E731
                w_c, v_c = stage1(jnp.asarray(sl(u0)), jnp.asarray(sl(y_all)), jnp.asarray(sl(wt_all)), data_j)
                w_out[a:b] = np.asarray(w_c)[: b - a]
                v_out[a:b] = np.asarray(v_c)[: b - a]
                if progress is not None:
                    progress.update(b - a)
            t_stage1 = time.perf_counter() - t_start
            w_out = w_out.reshape(q, s, p)
            v_out = v_out.reshape(q, s)
            best_w = np.empty((q, p))
            best_v = np.empty(q)
            infos = []
            vg = self._value_and_grad()
            bounds = list(zip(np.where(np.isfinite(lo), lo, None), np.where(np.isfinite(hi), hi, None)))
            for i in range(q):
                order = np.argsort(v_out[i], kind="stable")
                cand_w = [w_out[i, order[0]]]
                cand_v = [v_out[i, order[0]]]
                y_j, wt_j = jnp.asarray(y_qr[i]), jnp.asarray(wts_qr[i])

                def fun(w, y_j=y_j, wt_j=wt_j):
                    v, g = vg(jnp.asarray(w), data_j, y_j, wt_j)
                    return float(v), np.asarray(g, np.float64)

                n_polish = 0
                for k in order[: max(0, polish)]:
                    if not np.isfinite(v_out[i, k]):
                        continue
                    start = np.clip(w_out[i, k], np.where(np.isfinite(lo), lo, -np.inf), np.where(np.isfinite(hi), hi, np.inf))
                    r = scipy.optimize.minimize(
                        fun, start, jac=True, method="L-BFGS-B", bounds=bounds,
                        options={"maxiter": 300, "ftol": 1e-15, "gtol": 1e-10},
                    )
                    n_polish += int(r.nit)
                    if np.isfinite(r.fun):
                        cand_w.append(np.asarray(r.x))
                        cand_v.append(float(r.fun))
                j = int(np.argmin(cand_v))
                best_w[i], best_v[i] = cand_w[j], cand_v[j]
                tol = 1e-3 * (1.0 + abs(best_v[i]))
                infos.append(
                    {
                        "objective": float(best_v[i]),
                        "starts": int(s),
                        "starts_near_best": int(np.sum(v_out[i] <= best_v[i] + tol)),
                        "polished": j > 0,
                        "polish_iterations": n_polish,
                    }
                )
            t_total = time.perf_counter() - t_start
            for inf in infos:
                inf["stage1_seconds"], inf["polish_seconds"] = t_stage1 / q, (t_total - t_stage1) / q
        return best_w, best_v, infos


def resample_weights(run_index_r: np.ndarray, n_runs: int, resamples: int, seed: int) -> np.ndarray:
    """(B, R) row weights of ``resamples`` bootstrap resamples of runs (not rows).

    Each resample draws ``n_runs`` runs with replacement; a row's weight is its run's
    multiplicity, so a run's checkpoints stay together and shapes stay fixed (one compile).
    """
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 0xB007]))
    counts_bn = np.stack([np.bincount(rng.integers(0, n_runs, n_runs), minlength=n_runs) for _ in range(resamples)]) if resamples else np.zeros((0, n_runs))
    return counts_bn[:, run_index_r].astype(np.float64)


def starts_rng(seed: int, *tag: int) -> np.random.Generator:
    """A generator for random starts, independent per (seed, tag...)."""
    return np.random.default_rng(np.random.SeedSequence([int(seed), *[int(t) for t in tag]]))
