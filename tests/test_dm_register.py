"""Pre-registration the tools check: a registration is hashed and timed, and a run that started
before it (or that no registration covers) is named; a report says "pre-registered" only when the
check passes."""

from __future__ import annotations

import json

import pytest

from data_mixture.__main__ import main
from data_mixture.register import RegistrationError, content_hash, register, verify
from data_mixture.table import from_columns, write_runs

WHEN = "2026-12-03T12:00:00+00:00"
CANDS = {"uniform": {"code": 0.5, "prose": 0.5}, "code_heavy": {"code": 0.8, "prose": 0.2}}


def _table(starts: dict[str, str], extra_mix: bool = False):
    """Target size 4e5: uniform and code_heavy, 3 seeds each (code_heavy 0.01 lower every seed);
    a proxy size 2e5 with one run; ``starts``: run -> started_at (absent: empty)."""
    rows = []
    for n, mixes in ((2e5, {"p": 0.5}), (4e5, {"uniform": 0.5, "code_heavy": 0.8, **({"other": 0.3} if extra_mix else {})})):
        for name, m in mixes.items():
            for s in ((0,) if n == 2e5 else (0, 1, 2)):
                run = f"{name}_s{s}"
                loss = 2.0 + 0.01 * s - (0.01 if name == "code_heavy" else 0.0) + (0.5 if n == 2e5 else 0.0)
                rows.append({"run": run, "params_total": n, "params_active": n, "tokens": 20 * n, "mix:code": m,
                             "mix:prose": 1 - m, "loss:code": loss, "loss:prose": loss, "seed": s,
                             "started_at": starts.get(run, "")})
    return from_columns({k: [r[k] for r in rows] for k in rows[0]})


def _reg(**kw):
    return register("a beats b when the 95% paired t-interval of loss(a) - loss(b) over 3 seeds lies below 0", CANDS,
                    predictions={"camel": {"uniform": 2.01, "code_heavy": 2.00}}, target={"size": 4e5},
                    code_version={"commit": "abc", "dirty": False}, registered_at=WHEN, **kw)


AFTER = {f"{n}_s{s}": "2026-12-03T12:30:00Z" for n in ("uniform", "code_heavy") for s in (0, 1, 2)}


def test_registration_is_hashed_and_an_edit_is_found():
    reg = _reg()
    assert reg["sha256"] == content_hash(reg) and reg["comparisons"] == [["uniform", "code_heavy"]]
    check = verify(reg, _table(AFTER))
    assert check["pre_registered"] and check["why_not"] == [] and check["target_runs"] == sorted(AFTER)
    comp = check["comparisons"][0]  # uniform - code_heavy = +0.01 every seed: paired interval of zero width
    assert comp["diff"] == pytest.approx(0.01) and comp["verdict"] == "b wins" and comp["pre_registered"]
    edited = {**reg, "predictions": {"camel": {"uniform": 2.0, "code_heavy": 2.01}}}
    check = verify(edited, _table(AFTER))
    assert not check["pre_registered"] and "edited after it was written" in check["why_not"][0]


def test_a_run_that_predates_the_registration_is_named():
    starts = {**AFTER, "uniform_s1": "2026-12-03T11:12:00Z"}  # 48 minutes before the registration
    check = verify(_reg(), _table(starts))
    assert not check["pre_registered"]
    assert check["predate"] == ["uniform_s1"]
    assert "started before the registration (2026-12-03T12:00:00+00:00): uniform_s1" in check["why_not"][0]
    assert check["comparisons"][0]["not_pre_registered_runs"] == ["uniform_s1"]


def test_unknown_start_and_uncovered_runs_are_named():
    starts = {k: v for k, v in AFTER.items() if k != "code_heavy_s2"}
    starts.update({f"other_s{s}": "2026-12-03T13:00:00Z" for s in (0, 1, 2)})
    check = verify(_reg(), _table(starts, extra_mix=True))
    assert check["start_unknown"] == ["code_heavy_s2"]
    assert check["not_covered"] == ["other_s0", "other_s1", "other_s2"]
    assert not check["pre_registered"] and len(check["why_not"]) == 2


def test_bad_registrations_are_refused():
    with pytest.raises(RegistrationError, match="at least 2"):
        register("rule", {"a": {"code": 1.0}})
    with pytest.raises(RegistrationError, match="summing to 1"):
        register("rule", {"a": {"code": 0.5}, "b": {"code": 1.0}})
    with pytest.raises(RegistrationError, match="decision rule is empty"):
        register("  ", CANDS)


def test_cli_register_then_evaluate_names_the_early_run(tmp_path, capsys):
    cands = tmp_path / "candidates.json"
    cands.write_text(json.dumps(CANDS))
    reg_path = tmp_path / "registration.json"
    main(["register", "--rule", "paired 95% t-interval over 3 seeds", "--candidates", str(cands), "--size", "4e5",
          "--out", str(reg_path)])
    reg = json.loads(reg_path.read_text())
    assert reg["sha256"] == content_hash(reg) and reg["code_version"]["commit"]
    # every target run started a day before this registration was written
    runs = tmp_path / "runs.csv"
    early = {k: "2026-01-01T00:00:00Z" for k in AFTER}
    write_runs(_table(early), runs)
    out = tmp_path / "eval"
    main(["evaluate", "--runs", str(runs), "--laws", "regmix_linear", "--starts", "2", "--resamples", "200",
          "--registration", str(reg_path), "--out-dir", str(out), "--no-plot"])
    md = (out / "evaluation.md").read_text()
    assert "**Not pre-registered**" in md and "6 target run(s) started before the registration" in md
    assert "code_heavy_s0, code_heavy_s1, code_heavy_s2, uniform_s0" in md
    assert "**Pre-registered**" not in md
    # a bad --candidates file: exit 2 with the flag named
    cands.write_text("[1, 2]")
    with pytest.raises(SystemExit) as e:
        main(["register", "--rule", "r", "--candidates", str(cands), "--out", str(tmp_path / "r2.json")])
    assert e.value.code == 2 and "--candidates" in capsys.readouterr().err


def test_a_weighted_target_decides_the_registered_comparisons():
    rule = {"rule": "paired 95% t-interval over 3 seeds", "metric": "code=0.6,prose=0.4"}
    reg = register(rule, CANDS, target={"size": 4e5}, code_version={"commit": "abc", "dirty": False}, registered_at=WHEN)
    comp = verify(reg, _table(AFTER))["comparisons"][0]  # both losses 0.01 lower for code_heavy: so is their blend
    assert comp["diff"] == pytest.approx(0.01) and comp["verdict"] == "b wins"
    bad = register({**rule, "metric": "code=0.6,maths=0.4"}, CANDS, target={"size": 4e5},
                   code_version={"commit": "abc", "dirty": False}, registered_at=WHEN)
    with pytest.raises(RegistrationError, match="decision rule metric 'code=0.6,maths=0.4'"):
        verify(bad, _table(AFTER))


def test_cli_evaluate_with_a_weighted_target_checks_the_registration_on_the_table_as_read(tmp_path):
    """--target makes the target the table's one validation domain for the fits; the registration's
    rule names its own metric (here the same weighted target), so it is checked on the columns as read."""
    rule = {"rule": "paired 95% t-interval over 3 seeds", "metric": "code=0.6,prose=0.4"}
    reg = register(rule, CANDS, target={"size": 4e5}, code_version={"commit": "abc", "dirty": False}, registered_at=WHEN)
    reg_path = tmp_path / "registration.json"
    reg_path.write_text(json.dumps(reg))
    runs = tmp_path / "runs.csv"
    write_runs(_table(AFTER), runs)
    out = tmp_path / "eval"
    main(["evaluate", "--runs", str(runs), "--laws", "regmix_linear", "--starts", "2", "--resamples", "200",
          "--target", "code=0.6,prose=0.4", "--registration", str(reg_path), "--out-dir", str(out), "--no-plot"])
    check = json.loads((out / "evaluation.json").read_text())["registration"]
    assert check["pre_registered"] and check["comparisons"][0]["verdict"] == "b wins"
    assert "**Pre-registered**" in (out / "evaluation.md").read_text()
