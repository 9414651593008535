"""Loss-to-benchmark law: recovery of the sigmoid, choice of the loss combination, errors, JSON."""

import dataclasses

import numpy as np
import pytest

from data_mixture.bench_law import BenchFit, fit_bench, fit_bench_bootstrap
from data_mixture.fit import fit_table
from data_mixture.solver import resample_weights
from data_mixture.table import TableError, from_columns


def _table(acc_fn, n=80, seed=0, noise=0.01):
    rng = np.random.default_rng(seed)
    l1 = rng.uniform(1.5, 3.5, n)
    l2 = l1 * 0.8 + rng.uniform(-0.4, 0.4, n)
    acc = np.clip(acc_fn(l1, l2) + noise * rng.standard_normal(n), 0, 1)
    cols = {
        "run": [f"r{i}" for i in range(n)],
        "params_total": [1e6 * (1 + i % 4) for i in range(n)],
        "params_active": [1e6 * (1 + i % 4) for i in range(n)],
        "tokens": [1e8 * (1 + i % 3) for i in range(n)],
        "mix:a": [0.5] * n,
        "mix:b": [0.5] * n,
        "loss:web": l1,
        "loss:code": l2,
        "bench:qa": acc,
    }
    return from_columns(cols)


def sigmoid_acc(loss, floor=0.25, ceiling=0.85, k=4.0, l0=2.4):
    return floor + (ceiling - floor) / (1 + np.exp(k * (loss - l0)))


@pytest.fixture(scope="module")
def single():
    return _table(lambda l1, l2: sigmoid_acc(l1))


@pytest.fixture(scope="module")
def combo():
    return _table(lambda l1, l2: sigmoid_acc(0.5 * l1 + 0.5 * l2, l0=2.2), seed=1)


def test_recovers_single_domain_sigmoid_with_chance_floor(single):
    f = fit_bench(single, "qa", chance=0.25, starts=16)
    assert f.info["selected"] == "single:web"
    p = f.params
    assert p["floor"] == 0.25 and p["weights"] == {"web": 1.0, "code": 0.0}
    assert p["ceiling"] == pytest.approx(0.85, abs=0.03)
    assert p["k"] == pytest.approx(4.0, rel=0.2)
    assert p["L0"] == pytest.approx(2.4, abs=0.05)
    np.testing.assert_allclose(f.predict(single.loss_rv), sigmoid_acc(single.loss_rv[:, 0]), atol=0.02)


def test_chooses_fitted_combination_when_it_earns_its_parameters(combo):
    f = fit_bench(combo, "qa", starts=16)  # floor fitted
    assert f.info["selected"] == "combination", f.info["bic"]
    w = f.params["weights"]
    assert w["web"] == pytest.approx(0.5, abs=0.1) and sum(w.values()) == pytest.approx(1.0)
    assert f.params["floor"] == pytest.approx(0.25, abs=0.04)
    assert set(f.info["bic"]) == {"single:web", "single:code", "combination"}


def test_bootstrap_and_json_round_trip(single):
    f = fit_bench(single, "qa", chance=0.25, starts=8)
    _, inv = single.run_groups()
    boots = fit_bench_bootstrap(single, f, resample_weights(inv, inv.max() + 1, 10, 0))
    ks = np.array([b.params["k"] for b in boots])
    assert len(boots) == 10 and np.percentile(ks, 5) <= 4.0 * 1.15 and np.percentile(ks, 95) >= 4.0 * 0.85
    g = BenchFit.from_json(f.to_json())
    np.testing.assert_array_equal(g.predict(single.loss_rv), f.predict(single.loss_rv))


def test_errors_name_the_problem(single):
    with pytest.raises(TableError, match=r"column 'bench:qa': row 1 \(run 'r0', value 55\.0\); allowed: scores as fractions in \[0, 1\]"):
        bad = single.bench_rt.copy()
        bad[0, 0] = 55.0
        fit_bench(dataclasses.replace(single, bench_rt=bad), "qa")
    with pytest.raises(TableError, match=r"benchmark task 'mmlu' is not in the table.*its tasks: qa"):
        fit_bench(single, "mmlu")
    few = single.bench_rt.copy()
    few[3:, 0] = np.nan
    with pytest.raises(TableError, match=r"task 'qa' has scores in 3 rows; its law needs at least 5"):
        fit_bench(dataclasses.replace(single, bench_rt=few), "qa")
    with pytest.raises(TableError, match=r"chance level given for task\(s\) mmlu not in the table"):
        fit_table(single, "regmix_linear", chance={"mmlu": 0.25}, bootstrap=0, progress=False)
    with pytest.raises(TableError, match=r"chance level of task 'qa' is 1\.5"):
        fit_bench(single, "qa", chance=1.5)


def test_end_to_end_prediction_has_intervals(single):
    fit = fit_table(single, "regmix_linear", bootstrap=8, chance={"qa": 0.25}, starts=8, progress=False)
    out = fit.predict(single)
    for k in ("pred:web", "pred:code", "pred:bench:qa", "lo:bench:qa", "hi:bench:qa"):
        assert out[k].shape == (len(single),)
    assert np.all(out["lo:bench:qa"] <= out["hi:bench:qa"])
    np.testing.assert_allclose(out["pred:bench:qa"], fit.bench["qa"].predict(np.stack([out["pred:web"], out["pred:code"]], 1)))
