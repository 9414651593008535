"""The second headroom study's design is registered before its first run and never changes after it.

``experiments/studies/results/headroom_v2/design.json`` is written once by the study's ``design``
stage and committed; these tests fail when the file was edited (its sha256) or when a constant in
the study module no longer matches what the file registered (a setting changed after the
registration).
"""

import json

import pytest

from experiments.studies import headroom_v2_setting as study

REGISTERED = ("code_commit", "registered_at", "sha256")


def _record() -> dict:
    return json.loads((study.OUT / "design.json").read_text())


def test_the_design_file_matches_its_sha256():
    record = _record()
    body = {k: v for k, v in record.items() if k not in REGISTERED}
    assert study.digest(body) == record["sha256"]


def test_the_study_module_still_has_the_registered_setting():
    record = _record()
    body = {k: v for k, v in record.items() if k not in REGISTERED}
    assert json.loads(json.dumps(study.design())) == body


def test_the_target_is_at_least_10x_the_largest_proxys_training_flops_and_the_cap_binds_only_there():
    derived = _record()["derived"]
    assert derived["target_over_largest_proxy_flops"] >= 10.0
    capped = derived["target_capped_16 (code, prose, math, knowledge)"]
    assert capped["s1"] == [0.4, 0.0, 0.6, 0.0]  # 16 epochs of the pool hold the target's math share at the proxy
    assert capped["s2"][2] < 0.6  # ... and not at the target


def test_the_design_stage_keeps_its_own_version_and_never_amends_after_a_run(tmp_path, capsys):
    path = tmp_path / "design.json"
    path.write_text(json.dumps({"version": study.DESIGN_VERSION, "sha256": "kept"}))
    study.stage_design(tmp_path)
    assert json.loads(path.read_text())["sha256"] == "kept"
    assert "exists (kept" in capsys.readouterr().out
    path.write_text(json.dumps({"version": study.DESIGN_VERSION - 1, "sha256": "older"}))
    (tmp_path / "gate").mkdir()
    with pytest.raises(SystemExit, match="never amended after the first run"):
        study.stage_design(tmp_path)
    assert json.loads(path.read_text())["sha256"] == "older"


# ---- the stages that run what the design registered ----

def _write_gate_table(path, gain_by_size, noise):
    """A gate runs table: every registered run at its final and mid checkpoint; the target loss of
    ``target_weights`` is uniform's minus ``gain_by_size[size]`` plus per-seed ``noise``."""
    import csv

    rows = []
    for run in study.gate_plan()["runs"]:
        p, name, seed = run["preset"], run["name"].split("_s")[0].split("_", 1)[1], run["seed"]
        base = {"s0": 3.0, "s1": 2.5}[p] - (gain_by_size[p] + noise[seed - 20] if name == "target_weights" else 0.0) \
            + (0.3 if name == "code_rich" else 0.0) + 0.01 * (seed - 20)
        for frac in (0.5, 1.0):
            row = {"run": run["name"], "params_total": run["params_total"], "params_active": run["params_active"],
                   "tokens": run["tokens"] * frac, "seed": seed}
            row.update({f"mix:{d}": w for d, w in run["mixture"].items()})
            row.update({f"loss:{d}": base + (1 - frac) for d in study.DOMAINS})
            row.update({f"loss_se:{d}": 0.01 for d in study.DOMAINS})
            rows.append(row)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return path


def test_the_gate_plan_runs_every_registered_cell_on_the_registered_evaluation():
    runs = study.gate_plan()["runs"]
    assert len(runs) == 2 * 3 * 3
    assert {(r["preset"], r["seed"]) for r in runs} == {(p, s) for p in ("s0", "s1") for s in (20, 21, 22)}
    for r in runs:
        o = r["overrides"]
        assert (o["train.eval_batches"], o["train.eval_windows"], o["data.unique_tokens"]) == (16, "sampled", "math=300000")
        assert r["tokens"] <= study.TOKENS_PER_PARAM[r["preset"]] * r["params_active"] < r["tokens"] + 16 * 256


def test_the_gate_passes_on_a_steady_gain_and_says_no_headroom_on_a_noisy_one(tmp_path):
    steady = study.gate_result(_write_gate_table(tmp_path / "a.csv", {"s0": 0.2, "s1": 0.1}, [0.0, 0.01, -0.01]))
    assert steady["passed"] and steady["complete"]
    assert steady["sizes"]["s1"]["best"] == "target_weights"
    assert steady["sizes"]["s1"]["gain"] == pytest.approx(0.1, abs=1e-9)
    assert steady["sizes"]["s1"]["sd_pair"] == pytest.approx(0.01, abs=1e-9)  # sd of the paired differences
    assert steady["best_differs_between_sizes"] is False  # reported, not gated
    noisy = study.gate_result(_write_gate_table(tmp_path / "b.csv", {"s0": 0.2, "s1": 0.05}, [0.0, 0.05, -0.05]))
    assert noisy["sizes"]["s1"]["gain_in_sd"] == pytest.approx(1.0, abs=1e-6) and not noisy["passed"]
    assert "no headroom in this setting" in study.gate_md(noisy)
    assert "| target_weights | 4.7 |" in study.gate_md(noisy)  # math epochs at s0


def test_the_ladder_is_the_registered_design_and_waits_for_a_passing_gate(tmp_path, monkeypatch):
    runs = study.ladder_plan()["runs"]
    assert len(runs) == 12 * (1 + 1 + 2)
    assert runs[0]["mixture"] == {d: 0.25 for d in study.DOMAINS}  # the design starts at uniform
    assert {r["name"] for r in runs if r["preset"] == "s1"} >= {"s1_m11", "s1_m11_s1"}
    monkeypatch.setattr(study, "registered", lambda out: {})
    (tmp_path / "gate").mkdir()
    (tmp_path / "gate" / "gate.json").write_text(json.dumps({"passed": False}))
    with pytest.raises(SystemExit, match="the gate has not passed"):
        study.stage_ladder(tmp_path, tmp_path / "runs", 1)


def test_a_stage_refuses_a_design_that_differs_from_the_module(tmp_path):
    record = _record()
    (tmp_path / "design.json").write_text(json.dumps({**record, "target_seeds": [0, 1]}))
    with pytest.raises(SystemExit, match="no longer matches"):
        study.registered(tmp_path)


def test_a_failed_gate_reports_no_headroom_and_the_registration_times(tmp_path):
    g = study.gate_result(_write_gate_table(tmp_path / "b.csv", {"s0": 0.3, "s1": 0.05}, [0.0, 0.05, -0.05]))
    g["registration"] = {"design_sha256": "ab" * 32, "design_registered_at": "2026-12-06T04:30:15Z",
                         "design_committed_at": "2026-12-06T04:31:38Z", "gate_plan_committed_at": "2026-12-06T06:09:01Z",
                         "first_run_started_at": "2026-12-06T06:37:41Z", "registered_before_the_first_run": True}
    text = study.stopped_report_md(g)
    assert "Not answered: the registered gate failed (at s1 the best mixture (target_weights) beats uniform by 1.00 sd" in text
    assert "no headroom in this setting and stops" in text and "registered before the first run: **True**" in text
    assert "at s0" not in text.split("**")[1]  # s0 passed its part of the gate: only the failing size is named


def test_the_committed_gate_rebuilds_from_its_runs_and_was_registered_before_them():
    committed = json.loads((study.OUT / "gate" / "gate.json").read_text())
    runs = study.OUT / "gate_runs.csv"
    assert json.loads(json.dumps(study.gate_result(runs))) == {k: v for k, v in committed.items() if k != "registration"}
    assert study.registration_proof(study.OUT, runs) == committed["registration"]
    assert committed["registration"]["registered_before_the_first_run"] is True
    assert (study.OUT / "gate" / "gate.md").read_text() == study.gate_md(committed)
