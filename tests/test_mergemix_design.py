"""MergeMix seed design (data_mixture.mergemix.design): the priors in order, distinct, deterministic by seed."""

from __future__ import annotations

import numpy as np
import pytest

from data_mixture.mergemix.design import seed_design
from data_mixture.mergemix.objective import SearchError

DOMAINS = ("code", "prose", "math", "knowledge")


def test_seed_design_priors_and_determinism():
    x = seed_design(DOMAINS, 40, seed=0)
    assert x.shape == (40, 4)
    assert np.allclose(x.sum(1), 1) and (x >= 0).all()
    assert len({tuple(np.round(r, 9)) for r in x}) == 40  # distinct
    np.testing.assert_allclose(x[0], 0.25)
    np.testing.assert_allclose(x[1:5], np.eye(4))
    np.testing.assert_allclose(x[5:9], (1 - np.eye(4)) / 3)
    mids = {tuple(np.round((np.eye(4)[i] + np.eye(4)[j]) / 2, 9)) for i in range(4) for j in range(i + 1, 4)}
    assert mids <= {tuple(np.round(r, 9)) for r in x}
    np.testing.assert_array_equal(x, seed_design(DOMAINS, 40, seed=0))
    assert not np.array_equal(seed_design(DOMAINS, 60, seed=0), seed_design(DOMAINS, 60, seed=1))
    # small n: the priority order (uniform, vertices, then the most spread of the next group)
    small = seed_design(("a", "b", "c"), 5)
    np.testing.assert_allclose(small[:4], np.concatenate([np.full((1, 3), 1 / 3), np.eye(3)]))
    with pytest.raises(SearchError, match="n=0"):
        seed_design(DOMAINS, 0)
