"""MergeMix search objective (data_mixture.mergemix.objective): weighted terms, losses negated, normalisation
over the seed design."""

from __future__ import annotations

import numpy as np
import pytest

from data_mixture.mergemix.objective import Objective, SearchError


def test_objective_weighted_terms_and_normalisation():
    m_lo = {"bench:t0": 0.5, "bench:t1": 0.2, "loss:code": 2.0, "seconds": 3.0}
    m_hi = {"bench:t0": 0.5, "bench:t1": 0.2, "loss:code": 3.0, "seconds": 3.0}
    obj = Objective(tasks={"t0": 3.0, "bench:t1": 1.0}, losses={"loss:code": 4.0}, normalise="none").calibrate([m_lo])
    assert obj.terms() == {"bench:t0": 0.375, "bench:t1": 0.125, "loss:code": 0.5}
    assert obj.score(m_lo) == pytest.approx(0.375 * 0.5 + 0.125 * 0.2 - 0.5 * 2.0)
    assert obj.score(m_hi) < obj.score(m_lo)  # a loss counts negatively
    # default: macro-average of every bench:* key; z-scores over the seeds average to 0 with unit spread
    seeds = [{"bench:a": a, "bench:b": 10 * b, "loss:x": 1.0} for a, b in [(0.1, 0.3), (0.2, 0.1), (0.3, 0.2)]]
    z = Objective().calibrate(seeds)
    assert set(z.terms()) == {"bench:a", "bench:b"}
    for key in ("bench:a", "bench:b"):
        vals = [z.normalised_terms(m)[key] for m in seeds]
        assert np.mean(vals) == pytest.approx(0) and np.std(vals) == pytest.approx(1)
    mm = Objective(normalise="seed_minmax").calibrate(seeds)
    assert [mm.normalised_terms(m)["bench:a"] for m in seeds] == pytest.approx([0, 0.5, 1])
    flat = Objective().calibrate([{"bench:a": 0.1, "bench:em": 0.0}, {"bench:a": 0.2, "bench:em": 0.0}])
    assert flat.flat_terms == ("bench:em",) and flat.stats["bench:em"] == (0.0, 1.0)
    with pytest.raises(SearchError, match="not calibrated"):
        Objective().score(seeds[0])
