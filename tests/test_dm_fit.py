"""The Fit bundle: prediction columns and intervals, query checks, JSON files (fast: regmix_linear)."""

import dataclasses
import json

import numpy as np
import pytest

from data_mixture.fit import Fit, fit_table
from data_mixture.synthetic import draw_design, synthetic_table
from data_mixture.table import TableError, from_columns, write_runs, read_runs

DOMS = ("code", "prose")


@pytest.fixture(scope="module")
def table():
    design = draw_design(mix_domains=DOMS, sizes=(1e7, 1e8), runs_per_size=8, checkpoints=(0.5, 1.0), seed=0)

    def loss(v, n, d, m):
        return (2.0 + 0.3 * v) * (n / 1e8) ** -0.05 * (d / 1e9) ** -0.03 * np.exp(0.2 * m[:, 0])

    return synthetic_table(loss, design, DOMS, domains=("web", "math"), noise=0.002)


@pytest.fixture(scope="module")
def fit(table):
    return fit_table(table, "regmix_linear", bootstrap=20, seed=1, progress=False)


def test_predict_columns_and_intervals(fit, table):
    out = fit.predict(table, interval=0.9)
    assert set(out) == {"pred:web", "pred:math", "lo:web", "hi:web", "lo:math", "hi:math"}
    assert np.all(out["lo:web"] <= out["pred:web"] + 1e-9) and np.all(out["pred:web"] <= out["hi:web"] + 1e-9)
    np.testing.assert_allclose(out["pred:web"], table.loss_rv[:, 0], rtol=0.01)
    assert fit.predict_losses(table.params_total, table.tokens, table.mix_rm, member=3).shape == (len(table), 2)
    with pytest.raises(IndexError, match="bootstrap member 20 out of range; this fit has 20 members"):
        fit.predict_losses(table.params_total, table.tokens, table.mix_rm, member=20)
    wide = fit.predict(table, interval=0.98)
    assert np.all(wide["hi:web"] - wide["lo:web"] >= out["hi:web"] - out["lo:web"] - 1e-12)
    assert fit.info["n_runs"] == 16 and fit.info["bootstrap"] == 20 and fit.info["sizes"] == [1e7, 1e8]


def test_query_with_unseen_or_missing_domains_is_refused(fit, table, tmp_path):
    cols = {"run": ["q"], "params_total": [1e9], "params_active": [1e9], "tokens": [2e10], "mix:code": [0.5], "mix:math": [0.5]}
    with pytest.raises(TableError, match=r"training domain\(s\) the fit has never seen: mix:math; missing column\(s\) mix:prose"):
        fit.predict(from_columns(cols, query=True))
    # same domains in another column order: reordered, same prediction
    q1 = from_columns({"run": ["q"], "params_total": [1e9], "params_active": [1e9], "tokens": [2e10], "mix:code": [0.3], "mix:prose": [0.7]}, query=True)
    q2 = from_columns({"run": ["q"], "params_total": [1e9], "params_active": [1e9], "tokens": [2e10], "mix:prose": [0.7], "mix:code": [0.3]}, query=True)
    np.testing.assert_array_equal(fit.predict(q1)["pred:web"], fit.predict(q2)["pred:web"])
    # query CSV without losses, extra columns carried through by write_runs
    write_runs(dataclasses.replace(q1, extra={"note": np.array(["target"])}), tmp_path / "q.csv", extra=fit.predict(q1))
    back = read_runs(tmp_path / "q.csv", query=True)
    assert back.extra["note"][0] == "target" and float(back.extra["pred:web"][0]) == fit.predict(q1)["pred:web"][0]


def test_save_load_identical_and_format_checked(fit, table, tmp_path):
    fit.save(tmp_path / "fit.json")
    back = Fit.load(tmp_path / "fit.json")
    a, b = fit.predict(table), back.predict(table)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    iv = back.param_intervals("web")
    assert set(iv) == {"w", "a", "b"} and np.all(np.asarray(iv["w"][0]) <= np.asarray(iv["w"][1]))
    d = json.loads((tmp_path / "fit.json").read_text())
    d["format"] = "something/else"
    (tmp_path / "bad.json").write_text(json.dumps(d))
    with pytest.raises(ValueError, match="not a fit file: format 'something/else'"):
        Fit.load(tmp_path / "bad.json")
    d["format"] = "moejax.data_mixture.fit/1"
    d["point"]["web"]["law"] = "nolaw"
    (tmp_path / "bad.json").write_text(json.dumps(d))
    with pytest.raises(TableError, match="unknown law 'nolaw'"):
        Fit.load(tmp_path / "bad.json")


def test_fit_table_refuses_bad_arguments_before_fitting(table):
    with pytest.raises(TableError, match="size column 'flops' is not allowed"):
        fit_table(table, "regmix_linear", size_column="flops", progress=False)
    with pytest.raises(TableError, match="unknown law 'camle'. Did you mean 'camel'"):
        fit_table(table, "camle", progress=False)
    q = dataclasses.replace(table, loss_rv=None, loss_domains=())
    with pytest.raises(TableError, match="no loss:\\* columns to fit"):
        fit_table(q, "regmix_linear", progress=False)
