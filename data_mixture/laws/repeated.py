"""Repetition-aware variants of every parametric law: ``<law>+rep`` and ``<law>+repfit``.

A training domain with a fixed pool of U_i unique tokens (runs-table column ``unique:<domain>``)
is repeated when the run gives it more tokens than that: D_i = r_i D > U_i. Each variant feeds
its base law (``mixing_law``, ``additive``, ``camel``) the *effective* tokens and shares instead
of the nominal ones (Muennighoff et al. 2023, :mod:`data_mixture.repetition`)::

    D'_i = min(D_i, U_i) + U_i R* (1 - exp(-R_i / R*)),   R_i = max(D_i / U_i - 1, 0)
    D'   = sum_i D'_i,   r'_i = D'_i / D'
    L_rep(N, D, r; U) = L_base(N, D', r')

(D'_i = D_i for a domain without a pool.) Upweighting a scarce domain past a few epochs thus
buys less and less: its effective share saturates at U_i (1 + R*) / D'. The base law's
parameters keep their meaning and bounds; one parameter is added:

* ``R_star`` in [0.5, 100] (repetitions; log scale): repetitions after which repeated tokens
  have lost 1 - 1/e of their value. ``<law>+rep`` holds it at Muennighoff et al.'s fit, 15.4
  (``--fix R_star=VALUE`` holds it elsewhere); ``<law>+repfit`` fits it (identifiable only when
  the table's runs repeat a pool by different amounts: several weights of the scarce domain,
  or pools subsampled per run by ``plan``).

Prediction needs each domain's pool at the query: a query table's ``unique:<domain>`` columns
(``LawFit.predict(..., unique_rm=)``), or by default the largest pool of each domain in the fit
table (``info["unique_tokens"]``; ``None`` = unlimited). ``mixing_law+rep`` applies the
effective tokens in its per-mixture stage-1 laws (its stage-2 interpolation is over the
nominal mixtures); ``additive`` and ``camel`` see both D' and r'.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax.numpy as jnp
import numpy as np

from data_mixture.laws.base import LawFit
from data_mixture.laws.parametric import ParametricLaw
from data_mixture.repetition import R_STAR_BOUNDS, R_STAR_DEFAULT, effective_mixture
from data_mixture.solver import Param, ParamSpec
from data_mixture.table import TableError

SUFFIXES = {"+rep": False, "+repfit": True}  # suffix -> R* fitted
_CACHE_KEYS = ("u_mix", "u_logn", "u_index")  # camel's per-(mixture, size) cache: not valid once r depends on D


def unique_to_json(u_m: np.ndarray) -> list:
    return [None if not np.isfinite(u) else float(u) for u in np.asarray(u_m, np.float64)]


def unique_from_json(values, m: int) -> np.ndarray:
    if values is None:
        return np.full(m, np.inf)
    return np.array([np.inf if v is None else float(v) for v in values], np.float64)


class RepeatedLaw(ParametricLaw):
    """Mixin behaviour of the variants (made by :func:`repeated_law`)."""

    base_law: ClassVar[type[ParametricLaw]]
    fit_r_star: ClassVar[bool]

    def spec(self, m: int) -> ParamSpec:
        base = self.base_law.spec(self, m)
        return ParamSpec([*base.params, Param("R_star", (), *R_STAR_BOUNDS, (3.0, 30.0), log=True,
                                              doc="repetitions after which repeated tokens lose 1 - 1/e of their value")])

    # -- data ------------------------------------------------------------------------------------
    def features(self, size_r, tokens_r, mix_rm, info, unique_rm=None):
        data = super().features(size_r, tokens_r, mix_rm, info)
        m = np.asarray(mix_rm).shape[1]
        u = unique_from_json(info.get("unique_tokens"), m)[None] if unique_rm is None else np.asarray(unique_rm, np.float64)
        u = np.broadcast_to(u, np.asarray(mix_rm).shape)
        data["ulog"] = np.where(np.isfinite(u), np.log(np.where(np.isfinite(u), u, 1.0) / info["d_ref"]), np.inf)
        return data

    def table_features(self, table, size_column, refs):
        data = super().table_features(table, size_column, refs)
        u = table.unique_rm()
        data["ulog"] = np.where(np.isfinite(u), np.log(np.where(np.isfinite(u), u, 1.0) / refs["d_ref"]), np.inf)
        return data

    def extra_info(self, table, weights):
        u = table.unique_rm()
        finite = np.where(np.isfinite(u), u, -np.inf).max(axis=0)
        return {**super().extra_info(table, weights), "unique_tokens": unique_to_json(np.where(finite > 0, finite, np.inf)),
                "repetition": {"r_star": "fitted" if self.fit_r_star else "fixed", "source": "Muennighoff et al. 2023"}}

    def check(self, table, domain, size_column, fixed=None):
        if not np.isfinite(table.unique_rm()).any():
            raise TableError(f"law {self.name!r} models repeated data, but the table has no unique:<domain> column (the unique "
                             f"tokens of a training domain's pool); its columns: {', '.join(table.extra) or 'no extra ones'}. Add "
                             f"unique:<domain> for the scarce domain(s) (collect writes them for runs with data.unique_tokens), "
                             f"or use {self.base_law.name!r}.")
        super().check(table, domain, size_column, fixed=fixed)

    def resolve_fixed(self, table, size_column, fixed=None, refs=None):
        user = dict(fixed or {})
        fixed_all, reason = super().resolve_fixed(table, size_column, user, refs)
        if not self.fit_r_star and "R_star" not in user:
            fixed_all["R_star"] = R_STAR_DEFAULT
            reason = (f"{reason} R_star fixed at {R_STAR_DEFAULT:g} (Muennighoff et al. 2023's fit; "
                      f"{self.base_law.name}+repfit fits it).").strip()
        return fixed_all, reason

    def extra_starts(self, spec, data, y, wts):
        """The base law's starts, with R* at its default (or its fixed value)."""
        base = ParamSpec(spec.params[:-1])
        starts = self.base_law.extra_starts(self, base, data, y, wts)
        if starts is None or not len(starts):
            return starts
        return np.stack([spec.pack({**base.unpack(w), "R_star": R_STAR_DEFAULT}) for w in starts])

    # -- prediction ------------------------------------------------------------------------------
    def predict(self, fit, size_r, tokens_r, mix_rm, unique_rm=None):
        if unique_rm is None:
            return super().predict(fit, size_r, tokens_r, mix_rm)
        u = np.broadcast_to(np.asarray(unique_rm, np.float64), np.shape(mix_rm))
        keys, inverse = np.unique(np.where(np.isfinite(u), u, -1.0), axis=0, return_inverse=True)
        out = np.empty(len(size_r))
        for k, row in enumerate(keys):
            sel = inverse.reshape(-1) == k
            out[sel] = super().predict(_with_unique(fit, np.where(row < 0, np.inf, row)), size_r[sel], tokens_r[sel], mix_rm[sel])
        return out

    def predict_jax(self, fit):
        if self.base_law.predict_jax is not ParametricLaw.predict_jax:
            return super().predict_jax(fit)  # mixing_law: stage 2 reads the fit's pools through features()
        info, params = fit.info, fit.params

        def f(size_r, tokens_r, mix_rm):
            x = {k: jnp.asarray(v) for k, v in params.items()}
            mix_rm = jnp.asarray(mix_rm)
            u = unique_from_json(info.get("unique_tokens"), mix_rm.shape[-1])
            data = {"logn": jnp.log(jnp.asarray(size_r) / info["n_ref"]), "logd": jnp.log(jnp.asarray(tokens_r) / info["d_ref"]),
                    "mix": mix_rm, "ulog": jnp.broadcast_to(jnp.asarray(np.log(u / info["d_ref"])), mix_rm.shape)}
            return jnp.exp(self.log_loss(x, data))

        return f


def _with_unique(fit: LawFit, u_m: np.ndarray) -> LawFit:
    """``fit`` predicting at pools ``u_m`` (a copy sharing nothing mutable; cached on ``fit``)."""
    key = ("unique", tuple(u_m.tolist()))
    if key not in fit._cache:
        fit._cache[key] = dataclasses.replace(fit, info={**fit.info, "unique_tokens": unique_to_json(u_m)}, _cache={})
    return fit._cache[key]


def repeated_law(base: type[ParametricLaw], suffix: str) -> type[ParametricLaw]:
    """The variant class ``<base.name><suffix>`` (suffix in :data:`SUFFIXES`)."""
    base_log_loss = base.log_loss

    def log_loss(x, data):
        x = dict(x)
        r_star = x.pop("R_star")
        d = {k: v for k, v in data.items() if k not in _CACHE_KEYS and k != "ulog"}
        d_rm = data["mix"] * jnp.exp(data["logd"])[:, None]  # tokens per domain, in units of d_ref
        total, share = effective_mixture(d_rm, jnp.exp(data["ulog"]), r_star)
        d["logd"], d["mix"] = jnp.log(total), share
        return base_log_loss(x, d)

    return type(f"{base.__name__}Repeated{'Fit' if SUFFIXES[suffix] else ''}", (RepeatedLaw, base), {
        "name": base.name + suffix, "base_law": base, "fit_r_star": SUFFIXES[suffix],
        "log_loss": staticmethod(log_loss), "__doc__": f"{base.name} on effective tokens (module docstring)."})


def split_name(name: str) -> tuple[str, str | None]:
    """``"camel+rep"`` -> ("camel", "+rep"); ``"camel"`` -> ("camel", None)."""
    for suffix in sorted(SUFFIXES, key=len, reverse=True):
        if str(name).endswith(suffix):
            return str(name)[: -len(suffix)], suffix
    return str(name), None

