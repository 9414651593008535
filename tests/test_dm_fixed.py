"""Fixed parameters, tables with one token budget per size, parameters at their bounds, and the
bootstrap interval of the optimal mixture (``docs/mixture/laws.md``, "Fitting", and ``docs/mixture/commands.md``, "Optimisation").

The one-budget tables are drawn from a known additive law (RegMix-style: one checkpoint per run,
so every run has its own single token count) with three sizes and ten mixtures per size; the
parametric fits use few starts and a handful of bootstrap members (the same shapes throughout,
so one compile serves every fit of the module).
"""

from __future__ import annotations

import dataclasses
import json
import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats

from data_mixture.__main__ import main
from data_mixture.fit import Fit, fit_table
from data_mixture.laws import get_law
from data_mixture.laws.base import TokenExtrapolationWarning, at_bounds_lines, token_design
from data_mixture.solver import FixedError, Param, ParamSpec
from data_mixture.synthetic import draw_design, synthetic_table
from data_mixture.table import TableError, write_runs

DOMS = ("code", "prose", "math")
SIZES = (1e7, 3e7, 1e8)
C, GAMMA = np.array([1.2, 1.5, 0.8]), np.array([0.5, 0.3, 0.6])


def truth(size_r, tokens_r, mix_rm):
    """L = 1.5 + 0.5 n^-0.35 + 0.6 d^-0.3 + 1 / sum_j C_j r_j^gamma_j, n = N / 1e8, d = D / 2e9."""
    n, d = np.asarray(size_r) / 1e8, np.asarray(tokens_r) / 2e9
    term = np.sum(C * np.where(mix_rm > 0, np.maximum(mix_rm, 1e-300) ** GAMMA, 0.0), axis=1)
    return 1.5 + 0.5 * n**-0.35 + 0.6 * d**-0.3 + 1.0 / term


def one_budget_table(kind: str):
    """``per_size``: 20 tokens per parameter, one checkpoint; ``single``: every run 2e9 tokens."""
    design = draw_design(mix_domains=DOMS, sizes=SIZES, runs_per_size=10, checkpoints=(1.0,), seed=0, concentration=0.7)
    if kind == "single":
        design["tokens"] = [2e9] * len(design["tokens"])
    return synthetic_table(lambda v, n, d, m: truth(n, d, m), design, DOMS, noise=0.002, seed=1)


_FITS: dict[str, Fit] = {}


def additive_fit(kind: str) -> Fit:
    if kind not in _FITS:
        _FITS[kind] = fit_table(one_budget_table(kind), "additive", bootstrap=3, starts=8, seed=0, progress=False,
                                fixed={"gamma[0]": 0.5})
    return _FITS[kind]


# -- the mechanism -----------------------------------------------------------------------------------


def test_fixed_spec_works_on_the_free_entries_only():
    """The optimisers get the free sub-vector; the loss gets it scattered into the full one."""
    spec = ParamSpec([Param("a", (), -5, 5, (-1, 1)), Param("s", (3,), 0.0, 2.0, (0, 1)), Param("k", (), 1e-3, 1e3, (0.1, 10), log=True)])
    fixed = spec.fix({"s[1]": 0.7, "k": 2.0})
    assert (fixed.total, fixed.size) == (5, 3)
    np.testing.assert_array_equal(fixed.free_index, [0, 1, 3])
    x = fixed.unpack(np.array([0.5, 0.1, 0.3]))
    np.testing.assert_allclose(x["s"], [0.1, 0.7, 0.3])
    assert x["k"] == pytest.approx(2.0) and x["a"] == 0.5
    # the free entries' random starts do not depend on what is fixed
    np.testing.assert_array_equal(fixed.sample(np.random.default_rng(3), 4), spec.sample(np.random.default_rng(3), 4)[:, [0, 1, 3]])
    assert fixed.init_width().shape == (3,)
    with jax.enable_x64(True):
        x_j = fixed.unpack(jnp.asarray([[0.5, 0.1, 0.3]]))  # the jnp path (inside the loss), with a batch axis
    np.testing.assert_allclose(np.asarray(x_j["s"]), [[0.1, 0.7, 0.3]])
    assert fixed.key != spec.key and fixed.fix({}).key == fixed.key  # a Fitter (compile) per set of fixed entries
    np.testing.assert_array_equal(fixed.pack(fixed.unpack(np.array([0.5, 0.1, 0.3]))), [0.5, 0.1, 0.3])


@pytest.mark.parametrize("fixed, message", [
    ({"nope": 1.0}, r"fixed parameter 'nope': law 'additive' has no parameter 'nope'; its parameters: E, A, alpha, B, beta "
                    r"\(scalars\); C\[0\.\.2\], gamma\[0\.\.2\] \(vectors"),
    ({"gamma[3]": 0.5}, r"fixed parameter 'gamma\[3\]': index 3 out of range; indices 0\.\.2"),
    ({"beta[0]": 0.5}, r"index 0 out of range; beta is a scalar: write beta=VALUE"),
    ({"beta": 4.0}, r"fixed parameter beta=4: outside the bounds of beta, \[0, 3\]"),
    ({"B": 0.0}, r"fixed parameter B=0: outside the bounds of B, \[1e-08, 10000\] \(and > 0\)"),
    ({"gamma(1)": 0.5}, r"fixed parameter 'gamma\(1\)': expected NAME or NAME\[INDEX\]"),
])
def test_bad_fixed_parameters_are_refused_before_fitting(fixed, message):
    with pytest.raises(FixedError, match=message):
        fit_table(one_budget_table("per_size"), "additive", bootstrap=0, fixed=fixed, progress=False)


def test_regmix_cannot_fix_and_regmix_linear_names_its_coefficients():
    table = one_budget_table("per_size")
    with pytest.raises(TableError, match=r"law 'regmix' has no named parameters to fix; got --fix b"):
        fit_table(table, "regmix", bootstrap=0, fixed={"b": 0.0}, progress=False)
    with pytest.raises(FixedError, match=r"law 'regmix_linear' has no parameter 'beta'; its parameters: a, b \(scalars\); w\[0\.\.2\]"):
        fit_table(table, "regmix_linear", bootstrap=0, fixed={"beta": 0.3}, progress=False)


# -- one token budget per size -------------------------------------------------------------------------


@pytest.mark.parametrize("kind, why", [
    ("per_size", r"one token count per model size \(3 counts, D a function of N\).*cannot tell apart from the size term"),
    ("single", r"one token count \(D = 2e\+09\).*cannot tell apart from the constant E"),
])
def test_one_budget_table_fixes_the_token_term(kind, why):
    table = one_budget_table(kind)
    assert token_design(table, "params_total") == kind
    fit = additive_fit(kind)
    point = fit.point["valid"]
    assert point.info["fixed"] == {"gamma[0]": 0.5, "beta": 0.28, "B": 1e-08}
    assert point.info["fixed_reason"].startswith("gamma[0] fixed by the user.")
    assert "beta fixed at 0.28 (Chinchilla" in point.info["fixed_reason"]
    assert point.params["beta"] == 0.28 and point.params["B"] == 1e-08 and point.params["gamma"][0] == 0.5
    assert point.num_params == 2 * 3 + 5 - 3
    for member in fit.bootstrap:  # every member keeps the fixed values
        assert member["valid"].info["fixed"] == point.info["fixed"] and member["valid"].params["beta"] == 0.28
    assert fit.info["fixed"] == {"valid": point.info["fixed"]}
    assert re.search(why, point.info["fixed_reason"])
    # inside the table's token range: no warning; outside: one, naming the counts and the fixed values
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fit.predict_losses(table.params_total, table.tokens, table.mix_rm)
    with pytest.warns(TokenExtrapolationWarning) as record:
        fit.predict_losses(np.array([1e9, 1e9]), np.array([2e10, 4e10]), np.full((2, 3), 1 / 3))
    record = [w for w in record if w.category is TokenExtrapolationWarning]  # 1e9 also warns of its size
    assert len(record) == 1
    msg = str(record[0].message)
    assert "token count(s) 2e+10, 4e+10, outside the fitted table's token range" in msg and "beta = 0.28, B = 1e-08" in msg


def test_ranking_mixtures_at_a_new_size_from_a_one_budget_table():
    """Fitted below 1e8 parameters with one budget per size, the law ranks 40 unseen mixtures at
    1e9 parameters (20 tokens per parameter) as the truth does."""
    fit = additive_fit("per_size")
    mix = np.random.default_rng(5).dirichlet(np.full(3, 0.7), 40)
    n, d = np.full(40, 1e9), np.full(40, 2e10)
    with pytest.warns(TokenExtrapolationWarning):
        pred = fit.predict_losses(n, d, mix)[:, 0]
    true = truth(n, d, mix)
    assert scipy.stats.spearmanr(pred, true).statistic > 0.97
    i, j = np.triu_indices(40, 1)
    assert np.mean(np.sign(pred[i] - pred[j]) == np.sign(true[i] - true[j])) > 0.93


def test_regressors_on_one_budget_tables():
    table = one_budget_table("per_size")
    lin = fit_table(table, "regmix_linear", bootstrap=3, progress=False)
    p = lin.point["valid"]
    assert p.params["b"] == 0.0 and p.info["fixed"] == {"b": 0.0} and p.num_params == 3 + 1
    assert "log D is a function of log N: b fixed at 0" in p.info["fixed_reason"]
    assert all(m["valid"].params["b"] == 0.0 for m in lin.bootstrap)
    mine = fit_table(table, "regmix_linear", bootstrap=0, fixed={"b": -0.02, "w[1]": 1.0}, progress=False).point["valid"]
    assert mine.params["b"] == -0.02 and mine.params["w"][1] == 1.0 and mine.info["fixed_reason"] == "b, w[1] fixed by the user."
    trees = fit_table(table, "regmix", bootstrap=0, progress=False).point["valid"]
    assert trees.info["token_design"] == "per_size" and "fixed" not in trees.info
    assert np.all(np.isfinite(trees.predict(np.full(3, 3e8), np.full(3, 6e9), np.eye(3))))


def test_mixing_law_on_a_single_budget_table_fixes_beta_and_every_b_k():
    """Every mixture has one token count: each B_k merges into its E_k and is dropped, so the
    table passes the law's checks; mixtures still need runs at >= 2 sizes (the per-mixture size
    law). (Resolution and checks only: a full fit is the same solver as any other.)"""
    law = get_law("mixing_law")
    design = draw_design(mix_domains=DOMS, sizes=SIZES, runs_per_size=6, checkpoints=(1.0,), seed=2, shared_mixtures=True)
    design["tokens"] = [2e9] * len(design["tokens"])
    table = synthetic_table(lambda v, n, d, m: truth(n, d, m), design, DOMS, noise=0.002)
    law.check(table, "valid", "params_total")
    fixed, reason = law.resolve_fixed(table, "params_total")
    assert fixed == {"beta": 0.28, "B": 1e-08} and "cannot tell apart from the constant E" in reason
    assert law.table_spec(table).fix(fixed).size == 3 * 6 + 2 - 7
    per_size = dict(design, tokens=[20 * n for n in design["params_total"]])
    table = synthetic_table(lambda v, n, d, m: truth(n, d, m), per_size, DOMS, noise=0.002)
    assert law.resolve_fixed(table, "params_total")[0] == {"beta": 0.28, "B": 1e-08}
    alone = draw_design(mix_domains=DOMS, sizes=SIZES, runs_per_size=6, checkpoints=(1.0,), seed=2)  # each mixture at one size
    with pytest.raises(TableError, match=r"every mixture needs runs at >= 2 model sizes .*1 size\(s\), 1 token count\(s\)"):
        fit_table(synthetic_table(lambda v, n, d, m: truth(n, d, m), alone, DOMS), "mixing_law", bootstrap=0, progress=False)


def test_nearest_column_residuals_are_distances_to_each_line():
    from data_mixture.laws.parametric import nearest_column_residuals

    u = np.random.default_rng(0).standard_normal((30, 4))
    u /= np.linalg.norm(u, axis=0)
    u[:, 3] = u[:, 1]
    d = nearest_column_residuals(u, 0, np.array([1, 2]))
    for got, k in zip(d, (1, 2)):
        coef = np.linalg.lstsq(u[:, [k]], u[:, 0], rcond=None)[0]
        assert got == pytest.approx(np.linalg.norm(u[:, 0] - u[:, [k]] @ coef), rel=1e-12)
    assert nearest_column_residuals(u, 3, np.array([0, 1]))[1] < 1e-15


def test_the_collinearity_shortcut_changes_no_fixed_parameter(monkeypatch):
    """resolve_fixed with the one-column shortcut (the default) and without it (every candidate
    gets its own least-squares solve) fixes the same parameters, on one-budget tables of both
    kinds (mixing_law: one token coefficient per mixture, the law the shortcut is for)."""
    law = "mixing_law"
    import data_mixture.laws.parametric as parametric

    design = draw_design(mix_domains=DOMS, sizes=SIZES, runs_per_size=6, checkpoints=(1.0,), seed=2, shared_mixtures=True)
    tables = [synthetic_table(lambda v, n, d, m: truth(n, d, m), dict(design, tokens=tokens), DOMS, noise=0.002)
              for tokens in ([2e9] * len(design["tokens"]), [20 * n for n in design["params_total"]])]
    fast = [get_law(law).resolve_fixed(t, "params_total") for t in tables]
    monkeypatch.setattr(parametric, "SURELY_MERGED", -1.0)
    assert fast == [get_law(law).resolve_fixed(t, "params_total") for t in tables]


# -- parameters at their bounds ------------------------------------------------------------------------


def test_at_bounds_lists_entries_within_one_percent_of_the_range():
    spec = ParamSpec([
        Param("E", (), 0.0, 20.0), Param("A", (), 1e-8, 1e4, log=True), Param("s", (3,), 0.0, 2.0),
        Param("u", (), 0.0, np.inf), Param("beta", (), 0.0, 3.0),
    ]).fix({"beta": 0.0})  # fixed entries are never listed, even on a bound
    w = spec.pack({"E": 0.19, "A": 9.0e3, "s": [0.0, 1.0, 1.99], "u": 0.0, "beta": 0.0})
    found = spec.at_bounds(w)
    assert [(e["param"], e["index"], e["bound"]) for e in found] == [
        ("E", None, "lo"), ("A", None, "hi"), ("s", 0, "lo"), ("s", 2, "hi"), ("u", None, "lo")]
    assert found[0] == {"param": "E", "index": None, "value": pytest.approx(0.19), "bound": "lo", "limit": 0.0}
    assert found[1]["limit"] == pytest.approx(1e4)
    # 0.21 is more than 1 % of [0, 20] away from 0; a one-sided bound counts only when reached
    assert spec.at_bounds(spec.pack({"E": 0.21, "A": 1.0, "s": [0.5] * 3, "u": 1e-3, "beta": 0.0})) == []


def test_fit_lists_and_prints_parameters_at_bounds():
    fit = additive_fit("per_size")
    listed = fit.info["at_bounds"]["valid"]
    assert listed == fit.point["valid"].info["at_bounds"]
    assert all(e["param"] not in ("beta", "B") and not (e["param"] == "gamma" and e["index"] == 0) for e in listed)
    fake = dataclasses.replace(fit.point["valid"], info={**fit.point["valid"].info, "at_bounds": [{"param": "E", "index": None, "value": 0.0, "bound": "lo", "limit": 0.0},
        {"param": "gamma", "index": 2, "value": 3.0, "bound": "hi", "limit": 3.0}]})
    assert at_bounds_lines(fake) == ["additive loss:valid: E = 0 at its lower bound 0",
                                     "additive loss:valid: gamma[2] = 3 at its upper bound 3"]
    assert fit.at_bounds_lines() == at_bounds_lines(fit.point["valid"])


# -- the command line and the optimum's interval ---------------------------------------------------------


def _varied_table():
    design = draw_design(mix_domains=DOMS, sizes=SIZES, runs_per_size=6, checkpoints=(0.5, 1.0), seed=3)
    return synthetic_table(lambda v, n, d, m: truth(n, d, m), design, DOMS, domains=("web", "math"), noise=0.002)


def test_cli_fix_prints_fixed_and_bounds_and_refuses_bad_items(tmp_path, capsys):
    write_runs(one_budget_table("per_size"), tmp_path / "runs.csv")
    base = ["fit", "--runs", str(tmp_path / "runs.csv"), "--out", str(tmp_path / "fit.json"), "--no-progress"]
    for args, message in [
        (["--law", "additive", "--fix", "beta"], r"--fix 'beta': expected NAME=NUMBER or NAME\[INDEX\]=NUMBER"),
        (["--law", "additive", "--fix", "beta=x"], r"--fix 'beta=x': expected NAME=NUMBER"),
        (["--law", "additive", "--fix", "bogus=1"], r"law 'additive' has no parameter 'bogus'; its parameters: E, A"),
        (["--law", "additive", "--fix", "alpha=-1"], r"fixed parameter alpha=-1: outside the bounds of alpha, \[0, 3\]"),
    ]:
        with pytest.raises(SystemExit) as e:
            main(base + args)
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err and re.search(message, err), err
    main(base + ["--law", "regmix_linear", "--bootstrap", "4", "--fix", "a=-0.05", "--fix", "w[2]=1.1"])
    out = capsys.readouterr().out
    assert "regmix_linear loss:valid: fixed a = -0.05, w[2] = 1.1, b = 0. a, w[2] fixed by the user. The table has one token count per model size" in out
    saved = json.loads((tmp_path / "fit.json").read_text())
    assert saved["point"]["valid"]["info"]["fixed"] == {"a": -0.05, "w[2]": 1.1, "b": 0.0}
    assert saved["info"]["at_bounds"] == {"valid": []}


def test_optimize_reports_the_interval_of_the_optimal_weights(tmp_path, capsys):
    fit = fit_table(_varied_table(), "regmix_linear", bootstrap=12, seed=0, progress=False)
    fit.save(tmp_path / "fit.json")
    main(["optimize", "--fit", str(tmp_path / "fit.json"), "--size", "3e8", "--tokens", "6e9", "--max-weight", "code=0.6",
          "--starts", "2", "--interval", "0.8", "--out", str(tmp_path / "mixture.json")])
    printed = capsys.readouterr().out
    result = json.loads((tmp_path / "mixture.json").read_text())
    boot = result["bootstrap"]
    assert boot["members"] == 12 and boot["interval"] == 0.8 and len(boot["optima"]) == 12
    optima = np.array([[o[d] for d in DOMS] for o in boot["optima"]])
    for j, d in enumerate(DOMS):
        lo, hi = np.quantile(optima[:, j], [0.1, 0.9])
        assert boot["weights"][d]["lo"] == pytest.approx(lo) and boot["weights"][d]["hi"] == pytest.approx(hi)
    assert boot["weights"]["code"]["hi"] <= 0.6 + 1e-12 and optima[:, 0].max() <= 0.6 + 1e-12
    line = "80% interval of the optimal weights over 12 bootstrap optima: " + ", ".join(
        f"{d} [{boot['weights'][d]['lo']:.3f}, {boot['weights'][d]['hi']:.3f}]" for d in DOMS)
    assert line in printed
