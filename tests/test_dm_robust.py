"""The robust pick and its report on a fit whose bootstrap members disagree (hand-made members of
the additive law, whose optima are known in closed form)."""

from __future__ import annotations

import numpy as np
import pytest

from data_mixture.fit import Fit
from data_mixture.laws.base import LawFit
from data_mixture.optimize import optimize_mixture
from data_mixture.robust import RobustError, format_robust, parse_robust

DOMS = ("a", "b")
INFO = {"n_ref": 1.0, "d_ref": 1.0, "size_column": "params_active", "size_range": [1.0, 1e12],
        "token_range": [1.0, 1e15], "token_design": "varied"}


def _member(c_a: float, c_b: float, gamma: float) -> dict:
    # L = 1 + 1 / (c_a r_a^g + c_b r_b^g) at N = D = 1 (A = B = tiny). With g = 0.5 the optimum is
    # r_a = c_a^2 / (c_a^2 + c_b^2); with g = 1.5 (convex) it is the corner of the larger c.
    params = {"E": 1.0, "A": 1e-8, "alpha": 0.5, "B": 1e-8, "beta": 0.5, "C": [c_a, c_b], "gamma": [gamma, gamma]}
    return {"target": LawFit("additive", "target", DOMS, params, 9, dict(INFO))}


MEMBERS = [(2.0, 1.0, 0.5)] * 6 + [(1.0, 2.0, 0.5)] * 4 + [(2.0, 1.0, 1.5)] * 2
OPT_A = np.array([0.8] * 6 + [0.2] * 4 + [1.0] * 2)  # each member's own optimum (closed form)


def _fit() -> Fit:
    return Fit("additive", "params_active", DOMS, ("target",), _member(1.5, 1.5, 0.5), [_member(*m) for m in MEMBERS],
               {}, [], {})


def _objective(member, r_a):
    c_a, c_b, g = member
    return 1.0 + 1.0 / (c_a * r_a ** g + c_b * (1 - r_a) ** g)


@pytest.fixture(scope="module")
def robust():
    return optimize_mixture(_fit(), size=1.0, tokens=1.0, baselines={"uniform": {"a": 0.5, "b": 0.5},
                                                                     "all_b": {"a": 0.0, "b": 1.0}})


def test_the_pick_minimises_the_members_mean_and_the_point_is_kept(robust):
    grid = np.linspace(0, 1, 2001)
    mean = np.mean([_objective(m, grid) for m in MEMBERS], axis=0)
    assert robust["weights"]["a"] == pytest.approx(grid[np.argmin(mean)], abs=2e-3)
    # the point fit (equal values of both domains) would pick 0.5: the robust pick moves towards a
    assert robust["point"]["a"] == pytest.approx(0.5, abs=1e-3) and robust["weights"]["a"] > 0.55
    r = robust["robust"]
    assert r["members"] == 12 and r["robust"] == "mean"
    np.testing.assert_allclose([o["a"] for o in r["member_optima"]], OPT_A, atol=2e-3)


def test_agreement_odds_and_corner_warning(robust):
    r, pick = robust["robust"], robust["weights"]["a"]
    # share of members' own optima within 0.05 total variation (|r_a - pick| for two domains)
    assert r["agreement"]["share"] == pytest.approx(np.mean(np.abs(OPT_A - pick) <= 0.05))
    for name, base_a in (("uniform", 0.5), ("all_b", 0.0)):
        diff = np.array([_objective(m, pick) - _objective(m, base_a) for m in MEMBERS])
        o = r["odds"][name]
        assert o["p_beats"] == pytest.approx(np.mean(diff < 0))
        assert o["median"] == pytest.approx(np.median(diff), rel=1e-3, abs=1e-6)
        assert o["lo"] == pytest.approx(np.quantile(diff, 0.05), rel=1e-3, abs=1e-6)
    assert set(r["corner_members"]) == {"10", "11"}
    assert r["corner_members"]["10"] == ["a = 1", "b = 0"]
    text = "\n".join(format_robust(r))
    assert "2 of 12 members' own optimum sits on a corner: members 10, 11 (a = 1; b = 0)" in text
    assert "only 12 bootstrap members" in text
    # the 4 members that value b twice as much prefer all of b to the pick: the pick beats it in 8 of 12
    assert r["odds"]["all_b"]["p_beats"] == pytest.approx(8 / 12) and "vs all_b: beats it in 67% of members" in text


def test_a_quantile_pick_and_errors():
    r = optimize_mixture(_fit(), size=1.0, tokens=1.0, robust="q90", baselines={})["robust"]
    grid = np.linspace(0, 1, 2001)
    q90 = np.quantile([_objective(m, grid) for m in MEMBERS], 0.9, axis=0)
    assert r["weights"]["a"] == pytest.approx(grid[np.argmin(q90)], abs=3e-3)
    assert parse_robust("q90") == 0.9 and parse_robust("mean") is None
    with pytest.raises(RobustError, match="allowed: mean, or a quantile qNN"):
        parse_robust("median")
    # robust=None: the point fit's optimum, no report
    plain = optimize_mixture(_fit(), size=1.0, tokens=1.0, robust=None, bootstrap=False)
    assert "robust" not in plain and plain["weights"]["a"] == pytest.approx(0.5, abs=1e-3)


def test_optimize_command_prints_the_robust_report(tmp_path, capsys):
    import json

    from data_mixture.__main__ import main

    fit_path, out = tmp_path / "fit.json", tmp_path / "mix.json"
    _fit().save(fit_path)
    main(["optimize", "--fit", str(fit_path), "--size", "1", "--tokens", "1", "--robust", "q90", "--out", str(out)])
    text = capsys.readouterr().out
    assert "robust pick (q90 over 12 bootstrap members)" in text and "(the point fit's optimum: a 0.500" in text
    assert "vs uniform: beats it in" in text and "members 10, 11 (a = 1; b = 0)" in text
    saved = json.loads(out.read_text())
    assert saved["robust"]["robust"] == "q90" and saved["weights"] == saved["robust"]["weights"]
    with pytest.raises(SystemExit):
        main(["optimize", "--fit", str(fit_path), "--size", "1", "--tokens", "1", "--robust", "median",
              "--out", str(tmp_path / "x.json")])
