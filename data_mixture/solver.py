"""The solver every parametric law is fitted with: robust multi-start fitting (Huber on residuals,
vmapped L-BFGS, bounds, bootstrap). ``fit.py`` builds on it: the Fit bundle of a whole runs table.

Procedure (``docs/mixture/laws.md``, "Fitting"):

1. The objective of one problem is ``sum_r w_r huber_delta(pred_r - y_r) / (delta * sum_r w_r)``.
   For loss laws ``pred`` and ``y`` are log losses (residuals are relative errors), with
   ``delta = 1e-3`` as in the Chinchilla replication of Besiroglu et al. 2024 (arXiv
   2404.10102): residuals beyond 0.1 % count linearly, so a few bad runs cannot drag the fit.
   Dividing by delta only rescales the objective (gradients O(1) for the optimisers' tolerances).
   ``w_r`` are row weights: 1 for a plain fit, a run's multiplicity in a bootstrap resample.
2. Each parameter has bounds in its working coordinate (``log`` parameters work in log space,
   e.g. the coefficients A, B spanning decades; exponents and weights in natural units). Stage 1
   runs all random starts of all problems through one work queue: ``jax.vmap`` over
   ``optax.lbfgs`` (zoom line search) in an unconstrained space (sigmoid / softplus maps onto
   the bounds, so bounds hold exactly); a batch of :data:`CHUNK` lanes advances :data:`BLOCK`
   iterations per jitted call (a ``jax.lax.while_loop``), and a lane that has converged (a step
   improves its objective by less than ``ftol``, relative) or used its ``iters`` iterations is
   refilled with the next (problem, start) at once. Without the queue a chunk of starts ran
   until its slowest lane stopped. ``iters`` and ``ftol`` are traced, so one compile per
   (Fitter, shape) serves point fits and bootstraps.
3. Stage 2 polishes the best few starts of each problem with ``scipy.optimize.minimize(method=
   "L-BFGS-B", bounds=...)`` in the working space, with the exact gradient from a jitted
   ``jax.value_and_grad``. The best value wins. Bootstrap resamples instead end with
   :meth:`Fitter.refine`, a vmapped Levenberg-Marquardt (IRLS Gauss-Newton on the Huber
   objective), which converges along flat directions where L-BFGS stops short.
4. Everything runs in float64 inside ``jax.enable_x64(True)`` (a context manager: training code
   in the same process keeps its float32 default).

Determinism: starts come from ``numpy.random.default_rng(seed)``; the queue's schedule depends
only on the lanes' own convergence and a lane's arithmetic does not depend on its slot (vmap is
elementwise over lanes); XLA on CPU and scipy are deterministic, so the same seed gives
bit-identical parameters.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import scipy.optimize

from data_mixture.table import TableError

HUBER_DELTA = 1e-3
CHUNK = 64  # lanes (problem x start) of the vmapped stage-1 work queue; fixed, so one compile serves point fits and bootstraps
BLOCK = 16  # L-BFGS iterations per stage-1 call before finished lanes are refilled from the queue
AT_BOUND = 0.01  # a fitted entry within this fraction of its bounds' range width is listed as at its bound
FTOL = 1e-10  # stage 1 stops when a step improves the objective by less than this (relative)
# Zoom (strong Wolfe) line search, starting every iteration from the full L-BFGS step. Under
# vmap a line search runs until its slowest lane accepts, and every trial costs a value and a
# gradient of all lanes: on these Huber objectives backtracking (halving, sufficient decrease
# only) needed ~10 trials per iteration on average and often all 20 (the slowest lane), zoom
# about 1.3 on average and ~5 for the slowest (measured on the camel benchmark table), and
# reaches a lower objective in the same number of iterations. At most 4 trials: a lane whose
# search needs more (rare, and it holds up all 64) takes its best sufficient-decrease trial (or
# the last one) and goes on; on the benchmark table the best starts' objectives after 20 and 40
# iterations were identical to those with 20 trials allowed.
LINESEARCH = lambda: optax.scale_by_zoom_linesearch(max_linesearch_steps=4, initial_guess_strategy="one")  # noqa: E731
# The fits are long compute-bound loops: their jits keep XLA's full backend optimisation (level 3,
# XLA's default) even in a process that lowers it to compile faster (the test suite sets
# --xla_backend_optimization_level=0, tests/conftest.py, under which a fit ran 2.2x slower).
_jit = functools.partial(jax.jit, compiler_options={"xla_backend_optimization_level": 3})


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


class FixedError(TableError):
    """A bad fixed parameter (``fixed=`` / ``fit --fix``): unknown name, index or value out of bounds."""


_FIX_KEY = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(?:\[(-?[0-9]+)\])?$")


def parse_fixed_key(key: str) -> tuple[str, int | None]:
    """``"beta"`` -> ("beta", None) (a scalar, or every entry of a vector); ``"s[2]"`` -> ("s", 2)
    (entry 2 of vector s, 0-based). FixedError on anything else."""
    m = _FIX_KEY.match(str(key).replace(" ", ""))
    if not m:
        raise FixedError(f"fixed parameter {key!r}: expected NAME or NAME[INDEX] (0-based), e.g. beta or s[2].")
    return m.group(1), (int(m.group(2)) if m.group(2) is not None else None)


class ParamSpec:
    """An ordered set of :class:`Param`; packs natural dicts to working vectors and back.

    ``fixed``: {flat entry index: natural value} of entries held constant (see :meth:`fix`). A
    spec with fixed entries works on the *free* sub-vector: ``size``, ``lo``, ``hi``, ``pack``,
    ``sample`` and ``clip`` cover the free entries only, and ``unpack`` / ``to_dict`` scatter it
    into the full vector, ``w_full = w_fixed`` with ``w_full[free_index] = w``. The optimisers
    never see the fixed entries (no ``lo == hi`` bounds under the sigmoid map).
    """

    def __init__(self, params: Sequence[Param], fixed: Mapping[int, float] | None = None):
        self.params = tuple(params)
        self.total = sum(p.size for p in self.params)
        lo, hi = [], []
        for p in self.params:
            a, b = p.wbounds()
            lo += [a] * p.size
            hi += [b] * p.size
        self.lo_all, self.hi_all = np.array(lo), np.array(hi)
        self.is_log_all = np.concatenate([np.full(p.size, p.log) for p in self.params]) if self.params else np.zeros(0, bool)
        self.fixed = {int(i): float(v) for i, v in sorted((fixed or {}).items())}
        mask = np.ones(self.total, bool)
        mask[list(self.fixed)] = False
        self.free_index = np.flatnonzero(mask)
        self.w_fixed = np.zeros(self.total)
        for i, v in self.fixed.items():
            self.w_fixed[i] = math.log(v) if self.is_log_all[i] else v
        self.size = len(self.free_index)
        self.lo, self.hi = self.lo_all[self.free_index], self.hi_all[self.free_index]
        self.is_log = self.is_log_all[self.free_index]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)

    @property
    def key(self) -> tuple:
        """Identifies the compiled functions a spec needs: its size and its fixed entries."""
        return (self.total, tuple(self.fixed.items()))

    def entries(self) -> list[tuple[str, int | None]]:
        """(name, index or None for a scalar) of every flat entry of the full vector."""
        return [(p.name, None if not p.shape else k) for p in self.params for k in range(p.size)]

    # -- fixed entries ----------------------------------------------------------------------------
    def describe(self) -> str:
        """``E, A, alpha (scalars); t[0..1], s[0..2] (vectors)``: what ``fix`` accepts."""
        scal = [p.name for p in self.params if not p.shape]
        vec = [f"{p.name}[0..{p.size - 1}]" for p in self.params if p.shape]
        return "; ".join(x for x in (", ".join(scal) + " (scalars)" if scal else "",
                                     ", ".join(vec) + " (vectors: NAME for every entry, NAME[i] for one)" if vec else "") if x)

    def fixed_entries(self, fixed: Mapping[str, float], *, law: str = "") -> dict[int, float]:
        """{flat index: natural value} for ``fixed`` = {"beta": 0.28, "s": 0.1, "s[2]": 0} in
        natural units (NAME fixes a scalar or every entry of a vector, NAME[i] entry i). Values
        must lie within the parameter's bounds (inclusive; > 0 for log parameters). Raises
        FixedError naming the key, the value and what is allowed."""
        out: dict[int, float] = {}
        offsets = np.cumsum([0] + [p.size for p in self.params])
        by_name = {p.name: (p, int(offsets[i])) for i, p in enumerate(self.params)}
        who = f"law {law!r}" if law else "this law"
        for key, value in fixed.items():
            name, index = parse_fixed_key(key)
            if name not in by_name:
                raise FixedError(f"fixed parameter {key!r}: {who} has no parameter {name!r}; its parameters: {self.describe()}.")
            p, off = by_name[name]
            if index is not None and (not p.shape or not 0 <= index < p.size):
                allowed = f"{name} is a scalar: write {name}=VALUE" if not p.shape else f"indices 0..{p.size - 1}"
                raise FixedError(f"fixed parameter {key!r}: index {index} out of range; {allowed}.")
            try:
                v = float(value)
            except (TypeError, ValueError):
                raise FixedError(f"fixed parameter {key!r}: value {value!r} is not a number.") from None
            if not (math.isfinite(v) and p.lo <= v <= p.hi and (v > 0 or not p.log)):
                raise FixedError(f"fixed parameter {key}={v:g}: outside the bounds of {name}, [{p.lo:g}, {p.hi:g}]"
                                 f"{' (and > 0)' if p.log else ''}.")
            for k in ([index] if index is not None else range(p.size)):
                out[off + k] = v
        return out

    def fix(self, fixed: Mapping[str, float], *, law: str = "") -> "ParamSpec":
        """The same parameters with the entries of ``fixed`` (natural units, see
        :meth:`fixed_entries`) held constant; an empty mapping gives an equivalent free spec."""
        return ParamSpec(self.params, {**self.fixed, **self.fixed_entries(fixed, law=law)})

    def full(self, w):
        """Free working vector (..., size) -> full working vector (..., total) (jnp or np)."""
        if not self.fixed:
            return w
        if isinstance(w, jax.Array):
            base = jnp.broadcast_to(jnp.asarray(self.w_fixed, w.dtype), w.shape[:-1] + (self.total,))
            return base.at[..., self.free_index].set(w)
        out = np.broadcast_to(self.w_fixed, np.shape(w)[:-1] + (self.total,)).copy()
        out[..., self.free_index] = w
        return out

    # working vector w (P,) <-> natural dict
    def unpack(self, w):
        """Free working vector (..., P) -> {name: natural value} (jnp or np, following the input)."""
        w = self.full(w)
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
        """{name: natural value} -> free working vector (P,)."""
        parts = []
        for p in self.params:
            v = np.asarray(x[p.name], np.float64).reshape(-1)
            if v.size != p.size:
                raise ValueError(f"parameter {p.name!r} has {v.size} values; expected {p.size}.")
            parts.append(np.log(v) if p.log else v)
        return (np.concatenate(parts) if parts else np.zeros(0))[self.free_index]

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """(n, P) random free working vectors, uniform in each parameter's ``init`` range
        (log-uniform for log parameters), clipped inside the bounds. Draws every entry, fixed
        ones included, so the free entries' starts do not depend on what is fixed."""
        cols = []
        for p in self.params:
            a, b = p.init
            if p.log:
                a, b = math.log(a), math.log(b)
            cols.append(rng.uniform(a, b, size=(n, p.size)))
        w = np.concatenate(cols, axis=1) if cols else np.zeros((n, 0))
        return self.clip(w[:, self.free_index])

    def init_width(self) -> np.ndarray:
        """(P,) width of each free entry's start range (in working units)."""
        width = np.concatenate([np.full(p.size, (math.log(p.init[1]) - math.log(p.init[0])) if p.log else (p.init[1] - p.init[0]))
                                for p in self.params]) if self.params else np.zeros(0)
        return width[self.free_index]

    def clip(self, w: np.ndarray) -> np.ndarray:
        span = np.where(np.isfinite(self.hi - self.lo), self.hi - self.lo, 1.0)
        eps = 1e-6 * span
        return np.clip(w, self.lo + eps, self.hi - eps)

    def to_dict(self, w: np.ndarray) -> dict[str, Any]:
        """Free working vector (P,) -> JSON-able {name: float | list} of every parameter (fixed
        entries exactly as given, not through exp(log(x)))."""
        x = self.unpack(np.asarray(w, np.float64))
        entries = self.entries()
        for i, v in self.fixed.items():
            name, k = entries[i]
            if k is None:
                x[name] = np.float64(v)
            else:
                x[name][k] = v
        return {k: (float(v) if np.ndim(v) == 0 else np.asarray(v).tolist()) for k, v in x.items()}

    # -- degenerate fits ----------------------------------------------------------------------------
    def at_bounds(self, w: np.ndarray, tol: float = AT_BOUND) -> list[dict]:
        """Free entries of ``w`` (P,) at or near a bound: ``[{"param", "index", "value", "bound":
        "lo"|"hi", "limit"}]`` in natural units. Near means within ``tol`` (1 %) of the range
        width ``hi - lo`` in working units (log space for log parameters) when both bounds are
        finite; with one finite bound only equality (to 1e-9) counts. Fixed entries are not
        listed (they were not fitted)."""
        w_full = self.full(np.asarray(w, np.float64))
        out = []
        entries = self.entries()
        for i in self.free_index:
            a, b, x = self.lo_all[i], self.hi_all[i], w_full[i]
            width = b - a if np.isfinite(a) and np.isfinite(b) else None
            near = (lambda limit: abs(x - limit) <= tol * width) if width else (lambda limit: abs(x - limit) <= 1e-9 * max(1.0, abs(limit)))
            for side, limit in (("lo", a), ("hi", b)):
                if np.isfinite(limit) and near(limit):
                    log = bool(self.is_log_all[i])
                    name, index = entries[i]
                    out.append({"param": name, "index": index, "value": float(math.exp(x) if log else x), "bound": side,
                                "limit": float(math.exp(limit) if log else limit)})
                    break
        return out


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


def _as_jax(data: Mapping[str, Any]) -> dict[str, jax.Array]:
    """Feature arrays on device: integer dtypes kept (index arrays), floats as float64 (call
    inside ``jax.enable_x64(True)``)."""
    return {k: jnp.asarray(v) if np.issubdtype(np.asarray(v).dtype, np.integer) else jnp.asarray(v, jnp.float64)
            for k, v in data.items()}


def _strong(tree):
    """The same pytree without weak types (opt.init makes some scalars weakly typed, the loop's
    outputs are not): without it the first call of ``run`` traces apart from all later ones."""
    return jax.tree.map(lambda a: jnp.asarray(a).astype(jnp.asarray(a).dtype), tree)


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
        self._stage1: tuple[Callable, Callable, Callable] | None = None
        self.traces = {"run": 0, "init": 0, "final": 0}  # times each stage-1 function was traced (tests: once per shape)
        self._vg = None
        self._refine = None

    def objective_w(self, w, data, y, wts):
        """Huber objective at working vector w (jnp)."""
        return self._huber_mean(self.predict(self.spec.unpack(w), data) - y, wts)

    def _huber_mean(self, res, wts):
        h = optax.losses.huber_loss(res, jnp.zeros_like(res), delta=self.delta) / self.delta
        h = jnp.where(jnp.isfinite(h), h, 1e6)
        return jnp.sum(wts * h) / jnp.maximum(jnp.sum(wts), 1e-30)

    def _build_refine(self):
        """Jitted, vmapped Levenberg-Marquardt on the Huber objective in the unconstrained space.

        Each iteration solves the damped Gauss-Newton system of iteratively reweighted least
        squares, ``(J' W J + lam diag(J' W J)) step = -J' W r`` with ``J`` the exact Jacobian of
        the residuals (``jax.jacfwd``) and ``W = wts * min(1, delta / |r|)`` (the Huber weights:
        ``J' W r`` is the exact gradient), and takes the step only if it lowers the objective
        (``lam`` / 3 if so, x 4 if not). A lane stops when an accepted step improves its objective
        by less than ``ftol`` (relative), when ``lam`` exceeds 1e10, or after ``iters`` iterations.
        Near an optimum it converges quadratically along every direction, flat ones included,
        where the first-order L-BFGS of stage 1 crawls.
        """
        lo, hi = jnp.asarray(self.spec.lo), jnp.asarray(self.spec.hi)

        def one(u, y, wts, data, iters, ftol):
            def res(u):  # (R,); non-finite entries cost 1e6 each in the objective (_huber_mean)
                return self.predict(self.spec.unpack(_u_to_w(u, lo, hi)), data) - y

            def cond(carry):
                _, _, lam, it, done = carry
                return (it < iters) & ~done & (lam < 1e10)

            def step(carry):
                u, v, lam, it, _ = carry
                r, jac = res(u), jax.jacfwd(res)(u)
                r, jac = jnp.where(jnp.isfinite(r), r, 0.0), jnp.where(jnp.isfinite(jac), jac, 0.0)
                om = wts * jnp.minimum(1.0, self.delta / jnp.maximum(jnp.abs(r), 1e-300))
                a = jac.T @ (om[:, None] * jac)
                d = jnp.diag(a)
                damp = jnp.diag(d + 1e-9 * jnp.max(d) + 1e-30)
                u_new = u - jnp.linalg.solve(a + lam * damp, jac.T @ (om * r))
                v_new = self._huber_mean(res(u_new), wts)
                ok = jnp.isfinite(v_new) & jnp.all(jnp.isfinite(u_new)) & (v_new < v)
                done = ok & ((v - v_new) / (1.0 + jnp.abs(v)) < ftol)
                return (jnp.where(ok, u_new, u), jnp.where(ok, v_new, v), jnp.where(ok, lam / 3.0, lam * 4.0),
                        it + 1, done)

            v0 = self._huber_mean(res(u), wts)
            u, v, _, it, _ = jax.lax.while_loop(cond, step, (u, v0, jnp.asarray(1e-3), jnp.asarray(0), jnp.asarray(False)))
            return _u_to_w(u, lo, hi), v, it

        return _jit(jax.vmap(one, in_axes=(0, 0, 0, None, None, None)))

    def refine(self, w_qp, data, y_qr, wts_qr, *, iters: int = 100, ftol: float = 1e-12):
        """Levenberg-Marquardt (:meth:`_build_refine`) from each working vector of ``w_qp``, for
        its own problem (target ``y_q``, row weights ``wts_q``); chunks of :data:`CHUNK` lanes,
        so one compile serves any number. Returns (w (Q, P), objective (Q,), iterations (Q,)).
        A lane only takes steps that lower its objective, so it never ends worse than it began."""
        if self._refine is None:
            self._refine = self._build_refine()
        q = len(w_qp)
        w_out, v_out, it_out = np.empty_like(w_qp, np.float64), np.empty(q), np.zeros(q, np.int64)
        with jax.enable_x64(True):
            data_j = _as_jax(data)
            u_all = _w_to_u(self.spec.clip(np.asarray(w_qp, np.float64)), self.spec.lo, self.spec.hi)
            y_qr, wts_qr = np.asarray(y_qr, np.float64), np.asarray(wts_qr, np.float64)
            it_max, tol = jnp.asarray(int(iters), jnp.int64), jnp.asarray(float(ftol), jnp.float64)
            for start in range(0, q, CHUNK):
                idx = np.minimum(np.arange(start, start + CHUNK), q - 1)  # the last chunk repeats its last lane
                w, v, it = self._refine(jnp.asarray(u_all[idx]), jnp.asarray(y_qr[idx]), jnp.asarray(wts_qr[idx]),
                                        data_j, it_max, tol)
                n = min(CHUNK, q - start)
                w_out[start:start + n], v_out[start:start + n], it_out[start:start + n] = (
                    np.asarray(w)[:n], np.asarray(v)[:n], np.asarray(it)[:n])
        return w_out, v_out, it_out

    def _build_stage1(self):
        """Jitted, vmapped functions of the stage-1 work queue (compiled once per Fitter and shape).

        ``run(u, st, it, dv, y, wts, data, iters, ftol)`` advances every lane by at most
        :data:`BLOCK` L-BFGS iterations (a lane stops at ``iters`` iterations or when a step
        improves its objective by less than ``ftol``, relative); ``init`` builds the optimiser
        state of new lanes with their value and gradient already in it, so the loop body never
        needs ``value_and_grad_from_state`` (whose ``lax.cond`` turns into "always evaluate"
        under ``vmap``, one wasted evaluation per iteration); ``final`` maps lanes back to the
        working space with their objective. ``iters`` and ``ftol`` are traced arguments, so the
        point fit and the bootstrap share one compile.
        """
        lo, hi = jnp.asarray(self.spec.lo), jnp.asarray(self.spec.hi)
        opt = optax.lbfgs(memory_size=10, linesearch=LINESEARCH())

        def f_of(y, wts, data):
            return lambda u: self.objective_w(_u_to_w(u, lo, hi), data, y, wts)  # noqa: E731

        def init_one(u0, y, wts, data):
            self.traces["init"] += 1
            v, g = jax.value_and_grad(f_of(y, wts, data))(u0)
            v = jnp.where(jnp.isfinite(v), v, 1e30)
            g = jnp.where(jnp.isfinite(g), g, 0.0)
            return _strong(optax.tree_utils.tree_set(opt.init(u0), value=v, grad=g))

        def run_one(u, st, it, dv, y, wts, data, iters, ftol):
            self.traces["run"] += 1
            f = f_of(y, wts, data)

            def cond(carry):
                _, _, it, dv, k = carry
                return (it < iters) & (dv > ftol) & (k < BLOCK)

            def step(carry):
                u, st, it, _, k = carry
                v = optax.tree_utils.tree_get(st, "value")
                g = optax.tree_utils.tree_get(st, "grad")
                g = jnp.where(jnp.isfinite(g), g, 0.0)
                upd, st = opt.update(g, st, u, value=v, grad=g, value_fn=f)
                u_new = optax.apply_updates(u, upd)
                ok = jnp.all(jnp.isfinite(u_new))
                u_new = jnp.where(ok, u_new, u)
                v_new = optax.tree_utils.tree_get(st, "value")
                dv = jnp.where(jnp.isfinite(v_new) & ok, (v - v_new) / (1.0 + jnp.abs(v)), 0.0)
                dv = jnp.where(it < 5, jnp.inf, jnp.abs(dv))  # a few steps before judging progress
                return u_new, st, it + 1, dv, k + 1

            u, st, it, dv, _ = jax.lax.while_loop(cond, step, (u, st, it, dv, jnp.asarray(0)))
            return u, _strong(st), it, dv

        def final_one(u, y, wts, data):
            self.traces["final"] += 1
            v = f_of(y, wts, data)(u)
            return _u_to_w(u, lo, hi), jnp.where(jnp.isfinite(v), v, jnp.inf)

        run = _jit(jax.vmap(run_one, in_axes=(0, 0, 0, 0, 0, 0, None, None, None)))
        init = _jit(jax.vmap(init_one, in_axes=(0, 0, 0, None)))
        final = _jit(jax.vmap(final_one, in_axes=(0, 0, 0, None)))
        return run, init, final

    def _value_and_grad(self):
        if self._vg is None:
            self._vg = _jit(jax.value_and_grad(self.objective_w))
        return self._vg

    def stage1(self, u0_np, y_nr, wts_nr, data_j, *, iters: int, ftol: float, progress: Any = None):
        """Stage 1 as a work queue over N lanes: (w (N, P), objective (N,), iterations (N,)).

        A batch of :data:`CHUNK` slots advances :data:`BLOCK` iterations per call; a slot whose
        problem has converged (or used its ``iters``) is refilled from the queue at once, so a
        few slow starts no longer hold up a whole chunk of finished ones. Only the last calls,
        when the queue is empty, run with idle slots. A lane's trajectory does not depend on
        its slot or neighbours (vmap is elementwise over lanes), so the result is deterministic.
        """
        if self._stage1 is None:
            self._stage1 = self._build_stage1()
        run, init, final = self._stage1
        n, p = u0_np.shape
        c = CHUNK  # fixed batch: one compile whatever the number of lanes (short queues run with idle slots)
        w_out = np.empty((n, p))
        v_out = np.empty(n)
        it_out = np.zeros(n, np.int64)
        # explicit dtypes: a weakly typed scalar here would make the first call trace apart from the rest
        it_max, tol = jnp.asarray(int(iters), jnp.int64), jnp.asarray(float(ftol), jnp.float64)
        first = np.minimum(np.arange(c), n - 1)
        slot_prob = first.copy()
        nxt = min(c, n)
        active = np.arange(c) < n
        u = jnp.asarray(u0_np[first])
        y, wts = jnp.asarray(y_nr[first]), jnp.asarray(wts_nr[first])
        st = init(u, y, wts, data_j)
        it = jnp.where(jnp.asarray(active), jnp.zeros(c, jnp.int64), it_max)
        dv = jnp.full(c, jnp.inf, jnp.float64)
        while active.any():
            u, st, it, dv = run(u, st, it, dv, y, wts, data_j, it_max, tol)
            it_np, dv_np = np.asarray(it), np.asarray(dv)
            done = active & ((it_np >= iters) | ~(dv_np > ftol))
            if not done.any():
                continue
            idx = np.flatnonzero(done)
            w_f, v_f = final(u, y, wts, data_j)
            w_f, v_f = np.asarray(w_f), np.asarray(v_f)
            probs = slot_prob[idx]
            w_out[probs], v_out[probs], it_out[probs] = w_f[idx], v_f[idx], it_np[idx]
            if progress is not None:
                progress.update(len(idx))
            take = idx[: max(0, n - nxt)]
            active[idx[len(take):]] = False
            if len(take):
                new = np.arange(nxt, nxt + len(take))
                nxt += len(take)
                slot_prob[take] = new
                mask = np.zeros(c, bool)
                mask[take] = True
                u_new, y_new, wt_new = np.asarray(u).copy(), np.asarray(y).copy(), np.asarray(wts).copy()
                u_new[take], y_new[take], wt_new[take] = u0_np[new], y_nr[new], wts_nr[new]
                u, y, wts = jnp.asarray(u_new), jnp.asarray(y_new), jnp.asarray(wt_new)
                st_new = init(u, y, wts, data_j)
                m = jnp.asarray(mask)
                st = jax.tree.map(lambda a, b: jnp.where(m.reshape((c,) + (1,) * (a.ndim - 1)), b, a), st, st_new)
                it = jnp.where(m, jnp.zeros(c, jnp.int64), it)
                dv = jnp.where(m, jnp.full(c, jnp.inf, jnp.float64), dv)
            if not active.any():
                break
            # idle slots (queue empty) stay frozen: their iteration count is at the limit
            it = jnp.where(jnp.asarray(active), it, it_max)
        return w_out, v_out, it_out

    def solve(
        self,
        w0_qsp: np.ndarray,
        data: Mapping[str, np.ndarray],
        y_qr: np.ndarray,
        wts_qr: np.ndarray,
        *,
        polish: int = 3,
        iters: int | None = None,
        ftol: float = FTOL,
        screen: int | None = None,
        progress: Any = None,
    ) -> tuple[np.ndarray, np.ndarray, list[dict]]:
        """Minimises Q independent problems (target y_q, row weights wts_q) from S starts each.

        Returns (best working vectors (Q, P), best objective (Q,), per-problem info). Stage 1
        runs every (problem, start) through one work queue (:meth:`stage1`); stage 2 polishes
        the ``polish`` best starts of each problem with scipy L-BFGS-B. ``data`` values keep
        integer dtypes (index arrays); floats become float64.

        ``screen``: successive halving. Every start first runs ``screen`` iterations; only the
        best quarter of each problem's starts (at least ``polish``, at least 1) then runs on to
        ``iters``. Most random starts of these laws settle in a visibly worse basin within a few
        dozen iterations, and running them on to ``iters`` was most of a point fit's stage 1.
        """
        iters = self.iters if iters is None else int(iters)
        q, s, p = w0_qsp.shape
        t_start = time.perf_counter()
        with jax.enable_x64(True):
            data_j = _as_jax(data)
            lo, hi = self.spec.lo, self.spec.hi
            u0 = _w_to_u(self.spec.clip(w0_qsp.reshape(q * s, p)), lo, hi)
            y_all = np.repeat(np.asarray(y_qr, np.float64), s, axis=0)
            wt_all = np.repeat(np.asarray(wts_qr, np.float64), s, axis=0)
            w_out, v_out, it_out = self._stage1_screened(u0, y_all, wt_all, data_j, (q, s, p), iters=iters, ftol=ftol,
                                                         screen=screen, keep=max(1, polish, -(-s // 4)),
                                                         progress=progress)
            t_stage1 = time.perf_counter() - t_start
            w_out = w_out.reshape(q, s, p)
            v_out = v_out.reshape(q, s)
            it_out = it_out.reshape(q, s)
            best_w = np.empty((q, p))
            best_v = np.empty(q)
            infos = []
            vg = self._value_and_grad()
            for i in range(q):
                best_w[i], best_v[i], info = self._polish(vg, w_out[i], v_out[i], it_out[i], y_qr[i], wts_qr[i], data_j,
                                                          polish)
                infos.append(info)
            t_total = time.perf_counter() - t_start
            for inf in infos:
                inf["stage1_seconds"], inf["polish_seconds"] = t_stage1 / q, (t_total - t_stage1) / q
        return best_w, best_v, infos

    def _stage1_screened(self, u0, y_all, wt_all, data_j, shape: tuple[int, int, int], *, iters: int, ftol: float,
                         screen: int | None, keep: int, progress: Any):
        """Stage 1 of :meth:`solve` over the Q x S flattened starts: with ``screen``, every start
        runs ``screen`` iterations and only the ``keep`` best of each problem (not yet converged)
        run on to ``iters``; flat (Q*S, P) weights, values and iteration counts."""
        q, s, p = shape
        lo, hi = self.spec.lo, self.spec.hi
        if not (screen is not None and 0 < screen < iters and s > 1):
            return self.stage1(u0, y_all, wt_all, data_j, iters=iters, ftol=ftol, progress=progress)
        w_out, v_out, it_out = self.stage1(u0, y_all, wt_all, data_j, iters=screen, ftol=ftol, progress=None)
        w_out, v_out, it_out = w_out.reshape(q, s, p), v_out.reshape(q, s), it_out.reshape(q, s)
        best_k = np.argsort(v_out, axis=1, kind="stable")[:, :keep]  # (q, keep)
        flat = (np.arange(q)[:, None] * s + best_k).reshape(-1)
        more = np.flatnonzero(it_out.reshape(-1)[flat] >= screen)  # converged starts are done
        if len(more):
            sel = flat[more]
            u1 = _w_to_u(self.spec.clip(w_out.reshape(q * s, p)[sel]), lo, hi)
            w2, v2, it2 = self.stage1(u1, y_all[sel], wt_all[sel], data_j, iters=iters - screen, ftol=ftol, progress=None)
            w_out.reshape(q * s, p)[sel], v_out.reshape(-1)[sel] = w2, v2
            it_out.reshape(-1)[sel] += it2
        if progress is not None:
            progress.update(q * s)
        return w_out, v_out, it_out

    def _polish(self, vg, w_sp: np.ndarray, v_s: np.ndarray, it_s: np.ndarray, y_r: np.ndarray, wts_r: np.ndarray,
                data_j, polish: int) -> tuple[np.ndarray, float, dict]:
        """Stage 2 of :meth:`solve` for one problem: scipy L-BFGS-B from its ``polish`` best stage-1
        starts; the best vector, its objective and the problem's info record."""
        lo, hi = self.spec.lo, self.spec.hi
        bounds = list(zip(np.where(np.isfinite(lo), lo, None), np.where(np.isfinite(hi), hi, None)))
        order = np.argsort(v_s, kind="stable")
        cand_w = [w_sp[order[0]]]
        cand_v = [v_s[order[0]]]
        y_j, wt_j = jnp.asarray(y_r, jnp.float64), jnp.asarray(wts_r, jnp.float64)

        def fun(w):
            v, g = vg(jnp.asarray(w), data_j, y_j, wt_j)
            return float(v), np.asarray(g, np.float64)

        n_polish = 0
        for k in order[: max(0, polish)]:
            if not np.isfinite(v_s[k]):
                continue
            start = np.clip(w_sp[k], np.where(np.isfinite(lo), lo, -np.inf), np.where(np.isfinite(hi), hi, np.inf))
            r = scipy.optimize.minimize(
                fun, start, jac=True, method="L-BFGS-B", bounds=bounds,
                options={"maxiter": 300, "ftol": 1e-15, "gtol": 1e-10},
            )
            n_polish += int(r.nit)
            if np.isfinite(r.fun):
                cand_w.append(np.asarray(r.x))
                cand_v.append(float(r.fun))
        j = int(np.argmin(cand_v))
        best_w, best_v = cand_w[j], float(cand_v[j])
        tol = 1e-3 * (1.0 + abs(best_v))
        info = {
            "objective": best_v,
            "starts": int(len(v_s)),
            "starts_near_best": int(np.sum(v_s <= best_v + tol)),
            "polished": j > 0,
            "polish_iterations": n_polish,
            "stage1_iterations": int(it_s.sum()),
        }
        return best_w, best_v, info


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
