"""The law interface: a :class:`Law` fits one validation domain of a runs table into a :class:`LawFit`.

A law is one file in ``data_mixture/laws/`` plus one line in ``LAWS`` (``laws/__init__.py``).
Parametric laws (loss written in ``jax.numpy``) derive from :class:`ParametricLaw`
(``laws/parametric.py``); regressors implement :meth:`Law.fit` / :meth:`Law.predict` directly.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, ClassVar

import numpy as np

from data_mixture.table import RunsTable, TableError


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
            (``n_ref``, ``d_ref``), the size column, objective, fit time, starts, ...
    """

    law: str
    domain: str
    mix_domains: tuple[str, ...]
    params: dict[str, Any]
    num_params: int
    info: dict[str, Any]
    _cache: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)

    def _law(self) -> "Law":
        from data_mixture.laws import get_law

        return get_law(self.law)

    def predict(self, size_r: np.ndarray, tokens_r: np.ndarray, mix_rm: np.ndarray) -> np.ndarray:
        """(R,) predicted loss for model sizes N (the fit's size column), tokens D, mixtures (R, M)."""
        size_r, tokens_r, mix_rm = _check_inputs(self, size_r, tokens_r, mix_rm)
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
        from data_mixture.laws import get_law

        get_law(d["law"])  # unknown law names fail here, with the valid names
        return cls(
            law=d["law"],
            domain=d["domain"],
            mix_domains=tuple(d["mix_domains"]),
            params=d["params"],
            num_params=int(d["num_params"]),
            info=d["info"],
        )


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

    @abc.abstractmethod
    def min_sizes(self) -> int:
        """Distinct model sizes needed to identify the law."""

    @abc.abstractmethod
    def min_runs(self, num_mix_domains: int) -> int:
        """Runs needed to identify the law for M training domains."""

    def num_params(self, num_mix_domains: int) -> int:
        """Fitted parameters for M training domains (per validation domain)."""
        raise NotImplementedError

    def check(self, table: RunsTable, domain: str, size_column: str) -> None:
        """Raises :class:`TableError` (before any work) when the table cannot identify the law."""
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
            raise TableError(f"law {self.name!r} cannot be identified from this table: it has {' and '.join(problems)}.")

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
    ) -> LawFit:
        """Fits validation domain ``domain``. ``weights`` (R,): row weights (bootstrap multiplicities)."""

    def fit_domains(self, table: RunsTable, domains, *, size_column: str = "params_total", seed: int = 0, starts: int = 64, progress: bool = False) -> dict[str, LawFit]:
        """Point fits of several validation domains ({domain: LawFit}). Parametric laws solve
        them together (one work queue for all starts); this default loops over :meth:`fit`."""
        return {d: self.fit(table, d, size_column=size_column, seed=seed, starts=starts, progress=progress) for d in domains}

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
        for b in range(weights_br.shape[0]):
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
