"""The mid-training study's committed results rebuild its report (no training, no fitting)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from experiments.studies import do_laws_pick_midtrain_mixtures as study

RESULTS = Path(__file__).resolve().parents[1] / "experiments" / "studies" / "results" / "midtrain_v1"


def test_committed_results_rebuild_the_report(tmp_path):
    out = tmp_path / "midtrain_v1"
    shutil.copytree(RESULTS, out, ignore=shutil.ignore_patterns("report.md", "report.json", "target.png"))
    shutil.copytree(RESULTS.parent / "midtrain_pilot", tmp_path / "midtrain_pilot")  # the reused bases' run times
    result = study.report(out)
    assert (out / "report.md").read_text() == (RESULTS / "report.md").read_text()
    assert (out / "target.png").stat().st_size > 0
    committed = json.loads((RESULTS / "report.json").read_text())
    assert result["comparisons"].keys() == committed["comparisons"].keys()
    # The decision rule is the plan's; it says it was written after the pilot's target runs had started.
    assert result["decision_rule"] == json.loads((RESULTS / "plan.json").read_text())["decision_rule"]
    assert "b01916d" in result["decision_rule"]["fixed"] and "not pre-registered" in result["decision_rule"]["fixed"]


def test_report_names_the_runs_that_predate_the_rule_and_states_the_limits():
    r = json.loads((RESULTS / "report.json").read_text())
    p = r["preregistration"]
    assert not p["pre_registered"]
    pilot = ["s2_base"] + [f"s2_{m}_s{s}" for m in ("uniform", "ladder_m1", "ladder_m2") for s in (0, 1, 2)]
    assert p["before_rule"] == sorted(pilot)  # the pilot's s2 runs, started 10:10-10:41 UTC, rule at 11:30:55
    assert p["started"]["s2_uniform_s0"] == {"time": "2026-12-03T10:23:01+00:00", "where": "pilot run s2_m0"}
    later = sorted(set(p["before_predictions"]) - set(pilot))
    assert later == ["s2_best_at_proxy_s0", "s2_best_at_proxy_s1", "s2_best_at_proxy_s2", "s2_camel_s0"]
    lm = r["limits"]
    assert lm["observed_order"][-1] == "camel" and lm["law_order"]["camel"]["pairs_right"] == 0
    assert lm["law_order"]["camel"]["order"] == lm["observed_order"][::-1]  # the exact reverse
    assert lm["law_order"]["closeness to uniform"]["pairs_right"] == 8
    assert len(lm["five_ties"]) == 10 and lm["span_five"] == pytest.approx(0.0062, abs=1e-4)
    md = (RESULTS / "report.md").read_text()
    assert "**Not pre-registered.**" in md and "## Limits and conclusions" in md
    assert "Decision rule (plan.json, **not pre-registered**" in md


def test_decision_rule_is_a_paired_interval_over_seeds():
    a = {0: {"loss:mean": 1.00}, 1: {"loss:mean": 1.01}, 2: {"loss:mean": 1.02}}
    b = {s: {"loss:mean": m["loss:mean"] + 0.05} for s, m in a.items()}  # worse by the same amount each seed
    assert study.compare(a, b)["verdict"] == "wins" and study.compare(b, a)["verdict"] == "loses"
    noisy = {0: {"loss:mean": 1.10}, 1: {"loss:mean": 0.95}, 2: {"loss:mean": 1.02}}
    got = study.compare(noisy, a)
    assert got["verdict"] == "tie" and got["lo"] < 0 < got["hi"] and got["method"] == "paired t over 3 seeds"


def test_decision_scores_count_pairs_within_the_seed_noise_apart():
    obs = [[1.00, 1.01], [1.002, 1.012], [1.50, 1.51]]  # mixtures 0 and 1 within the noise, 2 far
    got = study.decision_scores(np.array([1.0, 1.1, 1.5]), obs)
    assert got["pairs_within_noise"] == 1 and got["pairs_decided"] == 2 and got["accuracy"] == 1.0
    assert got["seed_sd"] == pytest.approx(np.std([1.00, 1.01], ddof=1))


def test_decision_gap_is_paired_over_the_same_resamples():
    obs = [[1.00, 1.01], [1.20, 1.21], [1.50, 1.51], [1.80, 1.80]]  # every pair decided
    right, wrong = np.array([1.0, 1.2, 1.5, 1.8]), np.array([1.8, 1.5, 1.2, 1.0])
    assert study.decision_gap(right, right, obs) == {"diff": 0.0, "lo": 0.0, "hi": 0.0}
    got = study.decision_gap(right, wrong, obs)
    assert got["diff"] == 1.0 and got["lo"] == got["hi"] == 1.0
