"""Repeated data: the effective-token formula, and repetition-aware laws recovering a data-constrained truth."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from data_mixture import fit_table, from_columns, get_law
from data_mixture.fit import Fit
from data_mixture.repetition import R_STAR_DEFAULT, effective_mixture, effective_tokens
from data_mixture.table import TableError

from experiments.tools.example_tables import POOL, REPEATED_TRUTH, repeated_columns, repeated_loss


@jax.enable_x64(True)
def test_effective_tokens_formula():
    u, r_star = 100.0, 15.4
    # below one epoch every token counts; R repeats beyond the first epoch add U R* (1 - exp(-R / R*))
    assert float(effective_tokens(60.0, u, r_star)) == 60.0
    assert float(effective_tokens(100.0 * 5, u, r_star)) == pytest.approx(100 + 100 * 15.4 * (1 - np.exp(-4 / 15.4)), rel=1e-12)
    assert float(effective_tokens(1e9, u, r_star)) == pytest.approx(u * (1 + r_star), rel=1e-6)  # saturates
    # 4 epochs are worth nearly fresh data (Muennighoff et al.: about 4 epochs before returns fall)
    assert float(effective_tokens(400.0, u, r_star)) / 400 > 0.9
    grad = jax.grad(lambda r: effective_tokens(1000.0, u, r))(5.0)
    assert np.isfinite(float(grad)) and float(grad) > 0
    total, share = effective_mixture(jnp.array([[300.0, 50.0]]), jnp.array([[100.0, jnp.inf]]), r_star)
    assert float(total[0]) == pytest.approx(float(effective_tokens(300.0, u, r_star)) + 50.0)
    assert float(share.sum()) == pytest.approx(1.0)


def _truth(size_r, tokens_r, mix_rm):
    return repeated_loss(size_r, tokens_r, mix_rm)


def _table():
    """The data-constrained example table (code: a pool of 5e7 unique tokens; truth additive+repfit, R* = 4)."""
    return from_columns(repeated_columns())


@pytest.fixture(scope="module")
def constrained():
    return _table()


def _argmin(f, step=0.02):
    grid = np.array([(a, b, 1 - a - b) for a in np.arange(0, 1 + 1e-9, step) for b in np.arange(0, 1 - a + 1e-9, step)])
    return grid[np.argmin(f(grid))]


@pytest.mark.slow  # about 30 s on an idle 2-core machine (two 16-start fits)
def test_repfit_recovers_r_star_and_the_data_constrained_optimum(constrained):
    fit = fit_table(constrained, "additive+repfit", bootstrap=0, starts=16, progress=False)
    p = fit.point["valid"]
    assert p.params["R_star"] == pytest.approx(REPEATED_TRUTH["R_star"], rel=0.25)
    assert p.info["unique_tokens"] == [POOL, None, None]
    n, d = 3e8, 6e9  # the target repeats the code pool: up to 120 epochs at full weight
    true_opt = _argmin(lambda g: _truth(np.full(len(g), n), np.full(len(g), d), g))
    law_opt = _argmin(lambda g: fit.predict_losses(np.full(len(g), n), np.full(len(g), d), g)[:, 0])
    true_at = lambda w: float(_truth(np.array([n]), np.array([d]), w[None])[0])  # noqa: E731
    regret = true_at(law_opt) / true_at(true_opt) - 1
    assert abs(law_opt[0] - true_opt[0]) <= 0.02, (law_opt, true_opt)  # the scarce domain's share
    assert regret < 1e-3, (law_opt, true_opt, regret)
    # a law blind to repetition puts more weight on the scarce domain than the truth does
    blind = fit_table(constrained, "additive", bootstrap=0, starts=16, progress=False)
    blind_opt = _argmin(lambda g: blind.predict_losses(np.full(len(g), n), np.full(len(g), d), g)[:, 0])
    assert blind_opt[0] > true_opt[0] + 0.03, (blind_opt, true_opt)


def test_rep_fixes_r_star_at_muennighoff_and_round_trips(constrained, tmp_path):
    fit = fit_table(constrained, "additive+rep", bootstrap=0, starts=4, progress=False)
    assert fit.point["valid"].params["R_star"] == pytest.approx(R_STAR_DEFAULT)
    assert fit.info["fixed"]["valid"]["R_star"] == R_STAR_DEFAULT
    assert "Muennighoff" in fit.info["fixed_reason"]["valid"]
    fit.save(tmp_path / "fit.json")
    again = Fit.load(tmp_path / "fit.json")
    q = (np.array([1e8]), np.array([2e9]), np.array([[0.6, 0.2, 0.2]]))
    assert again.predict_losses(*q)[0, 0] == fit.predict_losses(*q)[0, 0]
    # a bigger pool at the query means less repetition: a lower predicted loss
    bigger = fit.predict_losses(*q, unique_rm=np.array([10 * POOL, np.inf, np.inf]))[0, 0]
    assert bigger < fit.predict_losses(*q)[0, 0]


@pytest.mark.slow
@pytest.mark.parametrize("law", ["camel+repfit", "mixing_law+rep"])
def test_every_parametric_law_has_a_repetition_variant(constrained, law):
    fit = fit_table(constrained, law, bootstrap=0, starts=4, progress=False)
    pred = fit.predict_losses(np.array([1e8]), np.array([2e9]), np.array([[0.3, 0.3, 0.4]]))
    assert np.isfinite(pred).all()
    assert "R_star" in fit.point["valid"].params


def test_repetition_variant_errors_name_the_fix():
    with pytest.raises(TableError, match="no repetition-aware variant"):
        get_law("regmix+rep")
    with pytest.raises(TableError, match=r"Did you mean 'camel\+rep'"):
        get_law("camle+rep")
    cols = _table().extra
    plain = from_columns({"run": ["a", "b"], "params_total": [1, 1], "params_active": [1, 1], "tokens": [1, 2],
                          "mix:x": [1, 1], "loss:v": [1, 1]})
    with pytest.raises(TableError, match="no unique:<domain> column"):
        get_law("additive+rep").check(plain, "v", "params_total")
    assert "unique:code" in cols


@pytest.mark.filterwarnings("ignore::data_mixture.laws.base.SizeExtrapolationWarning")  # the held-out size, by design
def test_evaluate_predicts_held_out_cells_at_their_own_pools():
    """``evaluate`` passes each held-out cell's unique:<domain> pools to a +rep law: here the held-out
    size has 4x the fit rows' code pool, and one of its mixtures no pool at all (unlimited)."""
    from data_mixture.baselines import build_cells
    from data_mixture.evaluate import evaluate_laws

    cols = repeated_columns()
    largest = max(cols["params_total"])
    cols["unique:code"] = ["" if run.endswith("_m0") and n == largest else (4 * POOL if n == largest else POOL)
                           for run, n in zip(cols["run"], cols["params_total"])]
    table = from_columns(cols)
    entry = evaluate_laws(table, ["additive+rep"], starts=4, resamples=100)["laws"]["additive+rep"]
    # the same fit by hand (the rows below the largest size), predicted at each held-out cell's pools
    rows = table.law_rows()
    size = rows.size("params_total")
    fit = get_law("additive+rep").fit_domains(rows.take(size < largest), ["valid"], size_column="params_total",
                                              seed=0, starts=4)["valid"]
    assert fit.info["unique_tokens"] == [POOL, None, None]
    held = build_cells(rows.take(size == largest), "params_total")
    pools_cm = np.array([[np.inf if runs[0].endswith("_m0") else 4 * POOL, np.inf, np.inf] for runs in held.runs])
    want = fit.predict(held.size_c, held.tokens_c, held.mix_cm, unique_rm=pools_cm)
    np.testing.assert_array_equal(np.array(entry["predictions"]["predicted"])[:, 0], want)
    at_fit_pools = fit.predict(held.size_c, held.tokens_c, held.mix_cm)  # what evaluate predicted before
    assert (want <= at_fit_pools).all() and (want < at_fit_pools - 1e-4).sum() >= 3  # bigger pools: less repetition
    # the optimum at the held-out size uses the decision cells' pools (code: one of them unlimited)
    w = np.array([[entry["optimal_mixture"][d] for d in ("code", "prose", "math")]])
    q = (np.array([largest]), np.array([max(held.tokens_c)]), w)
    assert entry["optimal_predicted_mean_loss"] == pytest.approx(fit.predict(*q, unique_rm=np.full(3, np.inf))[0], rel=1e-9)
    assert entry["optimal_predicted_mean_loss"] != pytest.approx(fit.predict(*q)[0], rel=1e-6)
