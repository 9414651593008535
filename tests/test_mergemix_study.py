"""experiments/studies/does_mergemix_beat_the_laws.py: the parts of the committed MergeMix study that run without training."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from experiments.studies import does_mergemix_beat_the_laws as mm

ROOT = Path(__file__).resolve().parents[1] / "experiments" / "studies" / "results"
RESULTS, SWEEP = ROOT / "mergemix_v1", ROOT / "builtin_v1"


def test_default_budget_and_router_follow_from_the_committed_rank_table():
    rank = json.loads((RESULTS / "rank.json").read_text())
    assert mm.choose_default(rank) == (0.5, "linear")
    # a treatment clearly better than linear (by more than the margin) replaces it
    rank["rank"]["0.5/harc"]["overall"]["rho"] = rank["rank"]["0.5/linear"]["overall"]["rho"] + 2 * mm.ROUTER_MARGIN
    assert mm.choose_default(rank) == (0.5, "harc")


def test_trained_metrics_are_the_sweeps_last_s1_checkpoints():
    metrics, mixtures, base = mm.trained_metrics(SWEEP)
    assert sorted(metrics) == sorted(f"s1_m{i}" for i in range(12)) and base.endswith("s1_m0")
    assert mixtures["s1_m0"] == {d: 0.25 for d in mm.DOMAINS}
    assert {k for k in metrics["s1_m3"] if k.startswith("loss:")} == {f"loss:{d}" for d in mm.DOMAINS}


def test_report_and_costs_rebuild_from_the_committed_results(tmp_path):
    out = tmp_path / "mergemix_v1"
    shutil.copytree(RESULTS, out)
    rank = json.loads((out / "rank.json").read_text())
    searches = {name: json.loads((out / f"search_{name}" / "summary.json").read_text()) for name in mm.OBJECTIVES}
    cost = mm.costs(SWEEP, out, searches, rank)
    assert cost == json.loads((RESULTS / "cost.json").read_text())
    assert cost["brute_force_target"] == 12 * cost["target_run"]
    mm.write_report(out, SWEEP, rank, mm.choose_default(rank), searches, cost)
    rebuilt = (out / "report.md").read_text().replace(str(out), "experiments/studies/results/mergemix_v1")
    assert rebuilt == (RESULTS / "report.md").read_text()
