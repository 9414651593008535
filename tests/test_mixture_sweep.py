"""experiments/studies/do_law_mixtures_win_at_scale.py: the pieces of the real sweep's study that run without training."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from data_mixture.sweep.targets import load_plan, targets_from_plan
from data_mixture.table import read_runs
from experiments.studies import do_law_mixtures_win_at_scale as ms

RESULTS = Path(__file__).resolve().parents[1] / "experiments" / "studies" / "results" / "builtin_v1"


def test_target_plan_is_a_valid_sweep_plan_with_equal_tokens(tmp_path):
    mixtures = {"camel": {"code": 0.4, "prose": 0.1, "math": 0.3, "knowledge": 0.2},
                "uniform": {d: 0.25 for d in ms.DOMAINS}}
    path = ms.target_plan(tmp_path, mixtures, seeds=2)
    plan = load_plan(path)
    targets = targets_from_plan(plan, tmp_path / "root")  # moejax's own config validation of every run
    assert [t.name for t in targets] == ["s2_camel_seed0", "s2_uniform_seed0", "s2_camel_seed1", "s2_uniform_seed1"]
    runs = plan["runs"]
    assert len({r["tokens"] for r in runs}) == 1 and len({r["steps"] for r in runs}) == 1
    assert {r["overrides"]["train.seed"] for r in runs} == {0, 1}
    n = ms.sizes_of((ms.TARGET,))[ms.TARGET]["params_active"]
    assert runs[0]["tokens"] <= ms.TOKENS_PER_PARAM * n < runs[0]["tokens"] + ms.BATCH * ms.SEQ_LEN
    every = runs[0]["overrides"]["checkpoint.every_steps"]
    assert len({min(k * every, runs[0]["steps"]) for k in range(1, runs[0]["steps"] + 1)}) == ms.CHECKPOINTS


def test_best_scale_independent_law_is_the_lower_loso_error():
    loso = {"params_active": {"laws": {"additive": {"mean": {"mae": 0.2}}, "regmix_linear": {"mean": {"mae": 0.1}},
                                       "camel": {"mean": {"mae": 0.01}}}}}
    assert ms.best_scale_independent(loso) == "regmix_linear"
    with pytest.raises(RuntimeError, match="none of"):
        ms.best_scale_independent({"params_active": {"laws": {"camel": {"mean": {"mae": 0.1}}}}})


@pytest.mark.skipif(not (RESULTS / "runs.csv").exists(), reason="the committed sweep table is missing")
def test_committed_sweep_table_matches_its_plan(tmp_path):
    plan = json.loads((RESULTS / "plan.json").read_text())
    table = read_runs(RESULTS / "runs.csv")
    assert sorted(set(table.run)) == sorted(r["name"] for r in plan["runs"])
    assert set(table.size("params_active")) == {r["params_active"] for r in plan["runs"]}
    ms.plot_observed_vs_size(table, tmp_path / "observed.png")
    assert (tmp_path / "observed.png").stat().st_size > 10_000
