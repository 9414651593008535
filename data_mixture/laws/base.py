"""The law interface: a :class:`Law` fits one validation domain of a runs table into a :class:`LawFit`.

A law is one file in ``data_mixture/laws/`` plus one line in ``LAWS`` (``laws/__init__.py``).
Parametric laws (loss written in ``jax.numpy``) derive from :class:`ParametricLaw`
(``laws/parametric.py``); regressors implement :meth:`Law.fit` / :meth:`Law.predict` directly.
"""

from __future__ import annotations

import abc
import dataclasses
import warnings
from typing import Any, Callable, ClassVar

import numpy as np

from data_mixture.table import RunsTable, TableError


def untrained_note(table: RunsTable) -> str:
    """' mix:D is 0 in every run ...' naming the training columns no run trains on (a held-out
    target collected as a training domain), with the fix; '' when every column is trained."""
    idle = [d for j, d in enumerate(table.mix_domains) if not (table.mix_rm[:, j] > 0).any()]
    if not idle:
        return ""
    cols = ", ".join(f"mix:{d}" for d in idle)
    return (f" {cols} is 0 in every run: a domain no run trains on (a held-out target) is validation-only, not a "
            f"training domain. Collect the runs with --validation-only {','.join(idle)} (a sweep of a plan whose "
            f"--target is held out does it itself), or drop {cols} from the table; the law then needs "
            f"{len(table.mix_domains) - len(idle)} training domains' runs.")


@dataclasses.dataclass
class LawFit:
    """One law fitted to one validation domain.

    Fields:
        law: registry name of the law.
        domain: the validation domain (``loss:<domain>``) this fit predicts.
        mix_domains: training domains, in the column order predictions expect for ``mix_rm``.
        params: named parameters, JSON-able (floats and lists; for ``regmix`` the LightGBM model text).
        num_params: number of fitted parameters.
        info: fit diagnostics and fixed quantities the prediction needs: reference scales
            (``n_ref``, ``d_ref``), the size column, objective, fit time, starts, ...;
            ``token_range`` [min, max] tokens of the fit table; ``size_range`` [min, max] model
            sizes (predictions outside it warn, :func:`warn_size_extrapolation`); ``token_design`` ("single":
            one token count, "per_size": one per model size, "varied"); ``fixed`` {key: value}
            of parameters held constant, not fitted (keys NAME or NAME[i], natural units) and
            ``fixed_reason`` (why, one sentence); ``at_bounds`` [{param, index, value, bound,
            limit}] of fitted entries at or within 1 % of a bound (point fits; see
            :func:`at_bounds_lines`).
    """

    law: str
    domain: str
    mix_domains: tuple[str, ...]
    params: dict[str, Any]
    num_params: int
    info: dict[str, Any]
    _cache: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)

    def _law(self) -> "Law":
        return get_law(self.law)

    def predict(self, size_r: np.ndarray, tokens_r: np.ndarray, mix_rm: np.ndarray, unique_rm: np.ndarray | None = None) -> np.ndarray:
        """(R,) predicted loss for model sizes N (the fit's size column), tokens D, mixtures (R, M).
        ``unique_rm`` (R, M) or (M,): each training domain's pool of unique tokens (``inf``:
        unlimited), read by repetition-aware laws (``laws/repeated.py``; default: the pools
        recorded at fit time) and ignored by the others."""
        size_r, tokens_r, mix_rm = _check_inputs(self, size_r, tokens_r, mix_rm)
        warn_fixed_tokens(self, tokens_r)
        warn_size_extrapolation(self, size_r)
        if unique_rm is not None and "unique_tokens" in self.info:
            law: Any = self._law()  # a repetition-aware law (laws/repeated.py): it records unique_tokens
            return law.predict(self, size_r, tokens_r, mix_rm, unique_rm=np.broadcast_to(np.asarray(unique_rm, np.float64), mix_rm.shape))
        return self._law().predict(self, size_r, tokens_r, mix_rm)

    @property
    def predict_jax(self):
        """``f(size_r, tokens_r, mix_rm) -> jnp (R,)`` differentiable in its inputs (use
        ``jax.grad`` through it), or None for laws that are not written in jax (regmix*).
        Runs in the caller's precision; wrap in ``jax.enable_x64(True)`` for float64."""
        return self._law().predict_jax(self)

    def to_json(self) -> dict:
        return {
            "law": self.law,
            "domain": self.domain,
            "mix_domains": list(self.mix_domains),
            "params": self.params,
            "num_params": int(self.num_params),
            "info": self.info,
        }

    @classmethod
    def from_json(cls, d: dict) -> "LawFit":
        get_law(d["law"])  # unknown law names fail here, with the valid names
        return cls(
            law=d["law"],
            domain=d["domain"],
            mix_domains=tuple(d["mix_domains"]),
            params=d["params"],
            num_params=int(d["num_params"]),
            info=d["info"],
        )


class TokenExtrapolationWarning(UserWarning):
    """A prediction at token counts outside the fit table's, where the token term was fixed."""


class SizeExtrapolationWarning(UserWarning):
    """A prediction at model sizes outside those the fit saw (its ``info["size_range"]``)."""


def size_range(table: RunsTable, size_column: str) -> list[float]:
    """[smallest, largest] model size of a fit table, recorded as ``info["size_range"]``."""
    size = np.asarray(table.size(size_column), np.float64)
    return [float(size.min()), float(size.max())]


def warn_size_extrapolation(fit: LawFit, size_r: np.ndarray) -> None:
    """One :class:`SizeExtrapolationWarning` when ``size_r`` leaves the sizes the fit saw: a fit
    on one size has no size trend at all (whatever its size term says is not from the data); a
    fit on several extrapolates its trend. Fits made before ``size_range`` was recorded are
    not checked."""
    span = fit.info.get("size_range")
    if span is None:
        return
    lo, hi = float(span[0]), float(span[1])
    outside = np.unique(size_r[(size_r < lo * (1 - 1e-9)) | (size_r > hi * (1 + 1e-9))])
    if not len(outside):
        return
    shown = ", ".join(f"{x:.4g}" for x in outside[:4]) + (f" and {len(outside) - 4} more" if len(outside) > 4 else "")
    column = fit.info.get("size_column", "params_total")
    if lo == hi:
        message = (f"{fit.law} fit: predicting at model size(s) {shown} ({column}), but the fit saw one size only "
                   f"({lo:.4g}): its size term is not identified by the data, so these predictions (and a mixture "
                   "optimised for them) carry no information about size. Fit on runs of at least two sizes "
                   "that bracket or approach the target.")
    else:
        far = max(float(outside.max()) / hi, lo / float(outside.min()))
        message = (f"{fit.law} fit: predicting at model size(s) {shown} ({column}), outside the sizes the fit saw "
                   f"[{lo:.4g}, {hi:.4g}] (up to {far:.3g}x beyond): the law's size trend is extrapolated. Check it "
                   "against a run at (or nearer) the target size before trusting the mixture.")
    warnings.warn(message, SizeExtrapolationWarning, stacklevel=3)


def token_design(table: RunsTable, size_column: str) -> str:
    """How the table's token counts vary: ``"single"`` (every row has the same D: the token
    term is a constant), ``"per_size"`` (one D per model size and several sizes: D is a function
    of N, so the token term is collinear with the size term; RegMix-style designs with one
    checkpoint per run) or ``"varied"`` (D varies at some size: the token term is identified)."""
    tokens = np.asarray(table.tokens, np.float64)
    if len(np.unique(tokens)) == 1:
        return "single"
    size = table.size(size_column)
    if all(len(np.unique(tokens[size == n])) == 1 for n in np.unique(size)):
        return "per_size"
    return "varied"


def fixed_base_name(key: str) -> str:
    """``"B[2]"`` -> ``"B"``."""
    return str(key).split("[", 1)[0].strip()


def warn_fixed_tokens(fit: LawFit, tokens_r: np.ndarray) -> None:
    """One :class:`TokenExtrapolationWarning` when ``tokens_r`` leaves the fit table's token range
    and a token parameter (``Law.token_params``) of the fit was fixed rather than fitted."""
    fixed, span = fit.info.get("fixed") or {}, fit.info.get("token_range")
    if not fixed or span is None:
        return
    names = set(getattr(fit._law(), "token_params", ()))
    tok = {k: v for k, v in fixed.items() if fixed_base_name(k) in names}
    if not tok:
        return
    lo, hi = float(span[0]), float(span[1])
    outside = np.unique(tokens_r[(tokens_r < lo * (1 - 1e-9)) | (tokens_r > hi * (1 + 1e-9))])
    if not len(outside):
        return
    shown = ", ".join(f"{x:.4g}" for x in outside[:4]) + (f" and {len(outside) - 4} more" if len(outside) > 4 else "")
    values = ", ".join(f"{k} = {v:.4g}" for k, v in tok.items())
    reason = fit.info.get("fixed_reason", "")
    warnings.warn(
        f"{fit.law} fit of {fit.domain!r}: predicting at token count(s) {shown}, outside the fitted table's token range "
        f"[{lo:.4g}, {hi:.4g}], where the token term was fixed, not fitted ({values}). {reason} "
        f"These predictions follow the fixed values, not the data.",
        TokenExtrapolationWarning, stacklevel=3,
    )


def at_bounds_lines(fit: LawFit) -> list[str]:
    """Human-readable lines for ``fit.info["at_bounds"]``, e.g. ``"camel loss:code: E = 0 at its
    lower bound 0"`` (empty when no fitted parameter is at a bound, or for fits made before
    the listing existed)."""
    out = []
    for e in fit.info.get("at_bounds") or []:
        name = e["param"] if e.get("index") is None else f"{e['param']}[{e['index']}]"
        side = "lower" if e["bound"] == "lo" else "upper"
        out.append(f"{fit.law} loss:{fit.domain}: {name} = {e['value']:.4g} at its {side} bound {e['limit']:.4g}")
    return out


def _check_inputs(fit: LawFit, size_r, tokens_r, mix_rm):
    size_r = np.asarray(size_r, np.float64).reshape(-1)
    tokens_r = np.asarray(tokens_r, np.float64).reshape(-1)
    mix_rm = np.asarray(mix_rm, np.float64)
    if mix_rm.ndim != 2 or mix_rm.shape[1] != len(fit.mix_domains):
        raise TableError(
            f"mix_rm has shape {mix_rm.shape}; the {fit.law} fit of {fit.domain!r} expects (R, {len(fit.mix_domains)}) "
            f"with columns {', '.join(fit.mix_domains)}."
        )
    if not (size_r.shape[0] == tokens_r.shape[0] == mix_rm.shape[0]):
        raise TableError(f"size_r, tokens_r, mix_rm have {size_r.shape[0]}, {tokens_r.shape[0]}, {mix_rm.shape[0]} rows; they must agree.")
    return size_r, tokens_r, mix_rm


class Law(abc.ABC):
    """A mixture law. Subclasses set ``name``, ``mixture_moves_with_scale`` and implement the rest."""

    name: ClassVar[str]
    mixture_moves_with_scale: ClassVar[bool]
    """Can argmin_r L(N, D, r) depend on N? True where the form lets the mixture interact with N."""
    token_params: ClassVar[tuple[str, ...]] = ()
    """Parameters of the token term: when one of them is fixed, predictions at token counts
    outside the fit table's warn (:func:`warn_fixed_tokens`)."""

    @abc.abstractmethod
    def min_sizes(self) -> int:
        """Distinct model sizes needed to identify the law."""

    @abc.abstractmethod
    def min_runs(self, num_mix_domains: int) -> int:
        """Runs needed to identify the law for M training domains."""

    def num_params(self, num_mix_domains: int) -> int:
        """Fitted parameters for M training domains (per validation domain)."""
        raise NotImplementedError

    def check(self, table: RunsTable, domain: str, size_column: str, fixed: dict | None = None) -> None:
        """Raises :class:`TableError` (before any work) when the table cannot identify the law,
        or when ``fixed`` (parameters to hold constant) names what the law cannot fix."""
        if fixed:
            raise TableError(f"law {self.name!r} has no named parameters to fix; "
                             f"got --fix {', '.join(map(str, fixed))}. Fix parameters of a parametric law or regmix_linear.")
        table.loss(domain)
        size = table.size(size_column)
        names, _ = table.run_groups()
        m = len(table.mix_domains)
        n_sizes = len(np.unique(size))
        need_runs, need_sizes = self.min_runs(m), self.min_sizes()
        problems = []
        if len(names) < need_runs:
            problems.append(f"{len(names)} runs (needs at least {need_runs} for {m} training domains)")
        if n_sizes < need_sizes:
            problems.append(f"{n_sizes} distinct model size(s) in column {size_column!r} (needs at least {need_sizes})")
        if problems:
            raise TableError(f"law {self.name!r} cannot be identified from this table: it has {' and '.join(problems)}."
                             + untrained_note(table))

    @abc.abstractmethod
    def fit(
        self,
        table: RunsTable,
        domain: str,
        *,
        size_column: str = "params_total",
        seed: int = 0,
        starts: int = 64,
        init: LawFit | None = None,
        weights: np.ndarray | None = None,
        progress: bool = False,
        fixed: dict | None = None,
    ) -> LawFit:
        """Fits validation domain ``domain``. ``weights`` (R,): row weights (bootstrap
        multiplicities). ``fixed``: {NAME or NAME[i]: value} parameters held constant."""

    def fit_domains(self, table: RunsTable, domains, *, size_column: str = "params_total", seed: int = 0, starts: int = 64, progress: bool = False,
                    fixed: dict | None = None) -> dict[str, LawFit]:
        """Point fits of several validation domains ({domain: LawFit}). Parametric laws solve
        them together (one work queue for all starts); this default loops over :meth:`fit`."""
        kw: dict[str, Any] = {"fixed": fixed} if fixed else {}
        return {d: self.fit(table, d, size_column=size_column, seed=seed, starts=starts, progress=progress, **kw) for d in domains}

    def fit_bootstrap_domains(
        self, table: RunsTable, points: dict, weights_br: np.ndarray, *, size_column: str = "params_total", seed: int = 0, starts: int = 2, progress: Any = None
    ) -> dict[str, list[LawFit]]:
        """:meth:`fit_bootstrap` of every domain in ``points`` ({domain: point LawFit});
        parametric laws run all (domain, resample) problems in one solve."""
        return {
            d: self.fit_bootstrap(table, d, p, weights_br, size_column=size_column, seed=seed, starts=starts, progress=progress)
            for d, p in points.items()
        }

    def fit_bootstrap(
        self,
        table: RunsTable,
        domain: str,
        point: LawFit,
        weights_br: np.ndarray,
        *,
        size_column: str = "params_total",
        seed: int = 0,
        starts: int = 2,
        progress: Any = None,
    ) -> list[LawFit]:
        """One fit per bootstrap resample (rows weighted by ``weights_br[b]``), warm-started from
        ``point``. Parametric laws batch all resamples into one vmapped solve; this default loops."""
        out = []
        for b in range(weights_br.shape[0]):  # a fit from ``init`` keeps its fixed parameters
            out.append(
                self.fit(table, domain, size_column=size_column, seed=seed + 1 + b, starts=starts, init=point, weights=weights_br[b])
            )
            if progress is not None:
                progress.update(1)
        return out

    @abc.abstractmethod
    def predict(self, fit: LawFit, size_r: np.ndarray, tokens_r: np.ndarray, mix_rm: np.ndarray) -> np.ndarray:
        """(R,) predicted loss (inputs already checked)."""

    def predict_jax(self, fit: LawFit):
        return None


# name -> law class: ``LAWS`` (laws/__init__.py, which imports every law and fills this), kept here
# so a fit finds its law by name without this module importing the laws that build on it.
REGISTRY: dict[str, type[Law]] = {}
# Makers of law classes for names not in REGISTRY (the repetition-aware variants ``<law>+rep``,
# laws/__init__.py): each returns a class, or None when the name is not its kind.
RESOLVERS: list[Callable[[str], "type[Law] | None"]] = []
_INSTANCES: dict[str, Law] = {}


def get_law(name: str) -> Law:
    """The law registered under ``name`` (or made by a resolver); a clear error (with the valid names) otherwise."""
    if name not in REGISTRY:
        for resolve in RESOLVERS:
            cls = resolve(name)
            if cls is not None:
                REGISTRY[name] = cls
                break
    if name not in REGISTRY:
        import difflib

        near = difflib.get_close_matches(str(name), list(REGISTRY), n=1)
        hint = f" Did you mean {near[0]!r}?" if near else ""
        raise TableError(f"unknown law {name!r}.{hint} Valid laws: {', '.join(REGISTRY)}.")
    if name not in _INSTANCES:
        _INSTANCES[name] = REGISTRY[name]()
    return _INSTANCES[name]
