"""The second headroom study's design is registered before its first run and never changes after it.

``experiments/studies/results/headroom_v2/design.json`` is written once by the study's ``design``
stage and committed; these tests fail when the file was edited (its sha256) or when a constant in
the study module no longer matches what the file registered (a setting changed after the
registration).
"""

import json

import pytest

from experiments.studies import does_recommend_beat_the_practitioner as study

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
