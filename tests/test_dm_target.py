"""Targets that are not the training mix: one parser, used by fit, predict, optimize, evaluate and plan."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from data_mixture import fit_table, from_columns
from data_mixture.__main__ import main
from data_mixture.optimize import optimize_mixture
from data_mixture.plan import PlanError, proxy_pools, target_truth
from data_mixture.table import TableError, read_runs
from data_mixture.target import parse_target
from experiments.tools.example_tables import targets_columns

DOMAINS = ("code", "prose", "math")


def _columns(seed=0, bench=False):
    """experiments/tools/example_tables.py's targets table (3 sizes x 8 mixtures x 2 checkpoints;
    loss:code/prose/math each best on its own domain, loss:heldout_qa best on prose, logprob:qa),
    with a constant bench:qa_acc column only where a test needs it (a benchmark law takes a while to fit)."""
    cols = targets_columns(seed)
    if bench:
        cols["bench:qa_acc"] = [0.5] * len(cols["run"])
    return cols


@pytest.fixture(scope="module")
def table():
    return from_columns(_columns())


@pytest.fixture(scope="module")
def bench_table():
    return from_columns(_columns(bench=True))


def test_parse_forms_and_errors():
    assert dict(parse_target("heldout_qa").weights) == {"loss:heldout_qa": 1.0}
    assert parse_target("heldout_qa").domain == "heldout_qa"
    t = parse_target("code=0.6, prose=0.2")
    assert dict(t.weights) == pytest.approx({"loss:code": 0.75, "loss:prose": 0.25}) and t.domain == "target"
    assert dict(parse_target("logprob:qa").weights) == {"logprob:qa": 1.0}
    for bad, match in (("", "empty"), ("code=x", "not a number"), ("code=0.5,prose", "has no weight"),
                       ("code=0,prose=0", "all 0"), ("code=1,loss:code=1", "twice")):
        with pytest.raises(TableError, match=match):
            parse_target(bad)


def test_values_and_apply_on_a_hand_made_table(bench_table):
    table = bench_table
    t = parse_target("code=0.5,prose=0.5")
    assert np.allclose(t.values(table), 0.5 * table.loss("code") + 0.5 * table.loss("prose"))
    qa = parse_target("logprob:qa").apply(table)
    assert qa.loss_domains == ("target",) and np.allclose(qa.loss("target"), 8 * table.loss("heldout_qa"))
    with pytest.raises(TableError, match=r"no column loss:held_qa; its target columns: loss:code, .*loss:heldout_qa, "
                                         r"bench:qa_acc, logprob:qa"):
        parse_target("held_qa").apply(table)
    with pytest.raises(TableError, match="values >= 0.*accuracy is not continuous"):
        parse_target("bench:qa_acc").apply(table)


def test_fit_and_optimize_for_a_held_out_target(table):
    fit = fit_table(table, "regmix_linear", target="heldout_qa", bootstrap=0, progress=False)
    assert fit.loss_domains == ("heldout_qa",) and fit.target.text == "heldout_qa"
    best = optimize_mixture(fit, size=3e7, tokens=6e8, bootstrap=False)
    assert max(best["weights"], key=best["weights"].get) == "prose"  # the training mix would say uniform
    assert best["objective"]["target"]["domain"] == "heldout_qa"
    # a weighted set from a fit of every domain: the same optimum as a fit of the set itself
    every = fit_table(table, "regmix_linear", bootstrap=0, progress=False)
    code = optimize_mixture(every, size=3e7, tokens=6e8, bootstrap=False, target="code=0.9,prose=0.1")
    assert max(code["weights"], key=code["weights"].get) == "code"
    with pytest.raises(TableError, match="needs logprob:qa, which the fit does not predict"):
        optimize_mixture(every, size=3e7, tokens=6e8, bootstrap=False, target="logprob:qa")


def _write(cols, path):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(list(cols))
        for i in range(len(cols["run"])):
            w.writerow([cols[c][i] for c in cols])


def test_cli_fit_predict_optimize_evaluate_take_a_target(tmp_path, capsys):
    runs = tmp_path / "runs.csv"
    _write(_columns(), runs)
    fit = tmp_path / "fit.json"
    main(["fit", "--runs", str(runs), "--law", "regmix_linear", "--bootstrap", "0", "--target", "heldout_qa",
          "--out", str(fit), "--no-progress"])
    assert "target 'heldout_qa' as loss:heldout_qa" in capsys.readouterr().out
    main(["optimize", "--fit", str(fit), "--size", "3e7", "--tokens", "6e8", "--no-bootstrap", "--out", str(tmp_path / "m.json")])
    weights = json.loads((tmp_path / "m.json").read_text())["weights"]
    assert max(weights, key=weights.get) == "prose"
    every = tmp_path / "every.json"
    main(["fit", "--runs", str(runs), "--law", "regmix_linear", "--bootstrap", "0", "--out", str(every), "--no-progress"])
    main(["predict", "--fit", str(every), "--runs", str(runs), "--target", "code=0.5,math=0.5", "--out", str(tmp_path / "p.csv")])
    pred = read_runs(tmp_path / "p.csv", query=True)
    assert np.allclose(pred.numeric_extra("pred:target"), 0.5 * pred.numeric_extra("pred:code") + 0.5 * pred.numeric_extra("pred:math"))
    main(["evaluate", "--runs", str(runs), "--laws", "regmix_linear", "--target", "logprob:qa", "--no-plot",
          "--resamples", "100", "--out-dir", str(tmp_path / "ev")])
    report = json.loads((tmp_path / "ev" / "evaluation.json").read_text())
    assert report["target"]["weights"] == {"logprob:qa": 1.0} and report["loss_domains"] == ["target"]
    assert (tmp_path / "ev" / "evaluation.md").read_text().startswith("Target: logprob:qa")
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(["fit", "--runs", str(runs), "--law", "regmix_linear", "--target", "qa", "--out", str(tmp_path / "x.json")])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "no column loss:qa" in err and "logprob:qa" in err


def test_plan_simulates_the_target_and_gives_proxies_the_target_repetition():
    truth = lambda v, n, d, mix: np.full(len(n), [1.0, 2.0, 4.0][v])  # noqa: E731
    t = target_truth(truth, DOMAINS, parse_target("code=0.5,math=0.5"))
    assert t(0, np.ones(2), np.ones(2), None).tolist() == [2.5, 2.5]
    with pytest.raises(PlanError, match="needs heldout_qa, which the prior does not predict"):
        target_truth(truth, DOMAINS, parse_target("heldout_qa"))
    run = {"name": "s1_m0", "role": "scratch", "tokens": 1e6, "overrides": {"train.steps": 10}}
    out = proxy_pools(run, {"code": 2e7}, target_tokens=1e8, seq_len=256)
    # the proxy trains on 1/100 of the target's tokens, so it gets 1/100 of the pool: the same epochs at any weight
    assert out["unique_tokens"] == {"code": 200000} and out["overrides"]["data.unique_tokens"] == "code=200000"
