"""Mixture laws: one file each, one line each in :data:`LAWS` (name -> law class).

=================  ========================================================================
``mixing_law``     Ye et al. 2024 data mixing law with nested scaling laws in N and D
``additive``       Shukor et al. 2025 additive law: E + A/N^a + B/D^b + 1/sum C_i r_i^g_i
``regmix``         RegMix LightGBM regressor on [mixture, log N, log D]
``regmix_linear``  linear regression on the same features
``camel``          capacity-aware law (our form, after CAMEL arXiv 2603.08022; see camel.py)
=================  ========================================================================
"""

from __future__ import annotations

from data_mixture.laws.additive import AdditiveLaw
from data_mixture.laws.base import REGISTRY, Law, LawFit, get_law
from data_mixture.laws.camel import CamelLaw
from data_mixture.laws.mixing_law import MixingLaw
from data_mixture.laws.regmix import RegMixLaw, RegMixLinearLaw

LAWS: dict[str, type[Law]] = {
    cls.name: cls
    for cls in (
        MixingLaw,
        AdditiveLaw,
        RegMixLaw,
        RegMixLinearLaw,
        CamelLaw,
    )
}

REGISTRY.update(LAWS)  # what get_law and LawFit look a law up in

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
