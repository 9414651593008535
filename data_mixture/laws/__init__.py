"""Mixture laws: one file each, one line each in :data:`LAWS` (name -> law class).

=================  ========================================================================
``mixing_law``     Ye et al. 2024 data mixing law with nested scaling laws in N and D
``additive``       Shukor et al. 2025 additive law: E + A/N^a + B/D^b + 1/sum C_i r_i^g_i
``regmix``         RegMix LightGBM regressor on [mixture, log N, log D]
``regmix_linear``  linear regression on the same features
``camel``          capacity-aware law (our form, after CAMEL arXiv 2603.08022; see camel.py)
``log_linear``     Olmix's default regression at one size: c + exp(sum_j t_j r_j)
=================  ========================================================================

Every parametric law (``mixing_law``, ``additive``, ``camel``) also has repetition-aware
variants for training domains with a fixed pool of unique tokens: ``<law>+rep`` (R* = 15.4,
Muennighoff et al. 2023) and ``<law>+repfit`` (R* fitted); see ``repeated.py``. They are made
on first use by :func:`get_law` and are not listed in :data:`LAWS`.
"""

from __future__ import annotations

import difflib

from data_mixture.laws.additive import AdditiveLaw
from data_mixture.laws.base import REGISTRY, RESOLVERS, Law, LawFit, get_law
from data_mixture.laws.camel import CamelLaw
from data_mixture.laws.log_linear import LogLinearLaw
from data_mixture.laws.mixing_law import MixingLaw
from data_mixture.laws.parametric import ParametricLaw
from data_mixture.laws.regmix import RegMixLaw, RegMixLinearLaw
from data_mixture.laws.repeated import SUFFIXES, repeated_law, split_name
from data_mixture.table import TableError

LAWS: dict[str, type[Law]] = {
    cls.name: cls
    for cls in (
        MixingLaw,
        AdditiveLaw,
        RegMixLaw,
        RegMixLinearLaw,
        CamelLaw,
        LogLinearLaw,
    )
}

REGISTRY.update(LAWS)  # what get_law and LawFit look a law up in


def _variant(name: str) -> type[Law] | None:
    """The repetition-aware variant class of ``<law>+rep`` / ``<law>+repfit`` (None for other
    names); a TableError naming the valid variants for a variant of no parametric law."""
    base, suffix = split_name(name)
    if suffix is None:
        return None
    parametric = [n for n, cls in LAWS.items() if issubclass(cls, ParametricLaw)]
    if base not in LAWS:
        near = difflib.get_close_matches(str(base), list(LAWS), n=1)
        hint = f" Did you mean {near[0] + suffix!r}?" if near else ""
        raise TableError(f"unknown law {name!r}.{hint} Valid laws: {', '.join(LAWS)}; repetition-aware variants of the "
                         f"parametric ones: {', '.join(p + s for p in parametric for s in SUFFIXES)}.")
    base_cls = LAWS[base]
    if not issubclass(base_cls, ParametricLaw):
        raise TableError(f"law {name!r}: {base!r} is not a parametric law, so it has no repetition-aware variant; "
                         f"variants exist for {', '.join(parametric)} (e.g. {parametric[0]}{suffix}).")
    return repeated_law(base_cls, suffix)


RESOLVERS.append(_variant)


def min_runs_table(domain_counts=(2, 3, 4, 5, 6, 8)) -> str:
    """What each law needs to be identified: distinct model sizes, and runs (distinct runs of the
    table, over all sizes) for M training domains, as a plain-text table (``data_mixture laws``,
    ``fit --help``). ``fit`` refuses a table with fewer; ``plan`` warns of a plan with fewer."""
    header = ["law", "sizes"] + [f"M={m}" for m in domain_counts]
    rows = [[name, str(get_law(name).min_sizes())] + [str(get_law(name).min_runs(m)) for m in domain_counts]
            for name in LAWS]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths)))
             for row in [header, *rows]]
    return "\n".join(lines)


__all__ = ["LAWS", "Law", "LawFit", "get_law", "min_runs_table"]
