"""Rank consistency and cost accounting of the MergeMix package (pure numpy, no model)."""

import math

import numpy as np
import pytest

from data_mixture.mergemix.cost import mergemix_cost, sweep_cost
from data_mixture.mergemix.rank import macro_z, rank_consistency


def _metrics(seed: int, n: int = 8, noise: float = 0.0):
    rng = np.random.default_rng(seed)
    quality_m = np.linspace(0.0, 1.0, n)
    out = {}
    for i in range(n):
        out[f"m{i}"] = {"bench:a": quality_m[i] + noise * rng.normal(), "bench:b": 10 * quality_m[i] + noise * rng.normal(),
                        "bench:flat": 1.0, "loss:x": 3.0 - quality_m[i] + noise * rng.normal()}
    return out


def test_identical_rankings_give_rho_one_with_a_tight_interval():
    proxy, trained = _metrics(0), _metrics(1)
    got = rank_consistency(proxy, trained, n_boot=200, seed=0)
    assert got["mixtures"] == sorted(proxy)
    for key in ("a", "b"):
        assert got["tasks"][key]["rho"] == pytest.approx(1.0)
    assert got["overall"]["rho"] == pytest.approx(1.0) and got["overall"]["lo"] == pytest.approx(1.0)
    assert got["mean_loss"]["rho"] == pytest.approx(1.0)
    assert math.isnan(got["tasks"]["flat"]["rho"])  # a saturated task ranks nothing


def test_reversed_proxy_gives_rho_minus_one_and_noise_widens_the_interval():
    proxy = {k: {m: -v for m, v in row.items()} for k, row in _metrics(0).items()}
    assert rank_consistency(proxy, _metrics(0), n_boot=50)["tasks"]["a"]["rho"] == pytest.approx(-1.0)
    noisy = rank_consistency(_metrics(0, n=12, noise=0.3), _metrics(1, n=12), n_boot=300, seed=1)["overall"]
    assert noisy["lo"] < noisy["rho"] < noisy["hi"] + 1e-12 and noisy["hi"] - noisy["lo"] > 0.05
    again = rank_consistency(_metrics(0, n=12, noise=0.3), _metrics(1, n=12), n_boot=300, seed=1)["overall"]
    assert again == noisy  # seeded bootstrap


def test_macro_z_weighs_tasks_equally_and_ignores_constant_ones():
    m = np.array([[0.0, 0.0, 5.0], [1.0, 100.0, 5.0], [2.0, 200.0, 5.0]])
    np.testing.assert_allclose(macro_z(m), macro_z(m[:, :1]) * 2 / 3)


def test_too_few_shared_mixtures_is_an_error():
    with pytest.raises(ValueError, match="at least 3 mixtures"):
        rank_consistency({"a": {"bench:x": 1.0}, "b": {"bench:x": 2.0}}, {"a": {"bench:x": 1.0}, "c": {"bench:x": 2.0}})


def test_cost_accounting():
    c = mergemix_cost(params_active=1e6, base_tokens=1e8, expert_tokens=1e7, num_experts=4, merges=50,
                      eval_tokens_per_merge=1e5)
    assert c["experts"] == 4 * 6e6 * 1e7 and c["merges"] == 50 * 2e6 * 1e5
    assert c["total"] == c["experts"] + c["merges"] and c["total_with_base"] == c["total"] + 6e6 * 1e8
    s = sweep_cost([{"params_active": 1e5, "tokens": 1e6, "checkpoints": 3}], eval_tokens_per_checkpoint=1e4)
    assert s == {"training": 6e11, "evaluation": 3 * 2e9, "total": 6e11 + 6e9}
