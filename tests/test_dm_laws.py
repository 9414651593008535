"""Mixture laws: parameter recovery within bootstrap intervals, held-out-size prediction, moving optima.

Each parametric law is fitted on a synthetic table drawn from that law (log-normal noise
sigma = NOISE) and must recover every parameter within its bootstrap interval and predict a
held-out larger size within the noise. The design identifies every parameter of every law:
four fitted sizes over 30x and five checkpoints per run over 20x in tokens pin the irreducible
losses (E, and mixing_law's per-mixture E_k) apart from the power laws (with three sizes over
10x a common shift of E trades off against alpha), and 16 mixtures drawn from Dirichlet(0.7),
which puts runs near the edges and vertices of the simplex, separate the additive law's E from
its mixture term 1 / sum C_i r_i^gamma_i (with only central mixtures that term is nearly
constant and absorbs E).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats

from data_mixture.fit import Fit, fit_table
from data_mixture.laws import LAWS, LawFit, get_law
from data_mixture.laws.parametric import ParametricLaw
from data_mixture.synthetic import draw_design, synthetic_table
from data_mixture.table import from_columns

NOISE = 0.003
SIZES = (1e7, 3e7, 1e8, 3e8, 1.2e9)  # the last one is held out
CHECKPOINTS = (0.2, 0.5, 1.0, 2.0, 4.0)  # fractions of 20 tokens per parameter
MIXTURES, CONCENTRATION = 16, 0.7
DOMS = ("code", "prose", "knowledge")
STARTS, BOOT = 16, 40
INTERVAL = 0.95  # level of the bootstrap percentile intervals the truth must lie in

TRUTH = {
    # mixture term 1 / sum C_i r_i^g_i between ~0.5 and ~1.4 over the simplex: large and curved
    # against the noise, so E is identified apart from it (with C = 3, 2, 1.5 the term spans
    # only 0.26-0.67 and E trades off against C)
    "additive": {"E": 1.6, "A": 0.5, "alpha": 0.4, "B": 0.6, "beta": 0.35, "C": [1.5, 1.0, 0.75], "gamma": [0.5, 0.3, 0.7]},
    # knowledge gains value with size (s = 0.5), code loses relative value (s = 0); the
    # mixture-dependent floor 1 / sum C_i r_i^g_i is the additive truth's mixture term
    "camel": {"E": 1.6, "A": 0.5, "alpha": 0.4, "B": 0.8, "beta": 0.35, "rho": 0.5, "t": [0.2, -0.3], "s": [0.0, 0.15, 0.5],
              "C": [1.5, 1.0, 0.75], "gamma": [0.5, 0.3, 0.7]},
}


def _grid(step=0.05):
    pts = [(a, b, 1 - a - b) for a in np.arange(0, 1 + 1e-9, step) for b in np.arange(0, 1 - a + 1e-9, step)]
    return np.clip(np.array(pts), 0, 1)


def _design(shared):
    return draw_design(
        mix_domains=DOMS, sizes=SIZES, runs_per_size=MIXTURES, checkpoints=CHECKPOINTS, seed=1, shared_mixtures=shared, concentration=CONCENTRATION
    )


def _refs(design):
    n = np.array(design["params_total"])
    d = np.array(design["tokens"])
    keep = n < SIZES[-1]
    return {"n_ref": float(np.exp(np.mean(np.log(n[keep])))), "d_ref": float(np.exp(np.mean(np.log(d[keep]))))}


def _truth_fit(law, design):
    if law == "mixing_law":
        tab = from_columns({**design, "loss:valid": [1.0] * len(design["run"])})
        from data_mixture.laws.mixing_law import mixture_ids

        mixes, _ = mixture_ids(tab.take(tab.params_total < SIZES[-1]).mix_rm)
        t = np.array([0.0, 0.8, -0.6])
        params = {"E": (1.2 + 0.6 * np.exp(mixes @ t)).tolist(), "A": [0.5] * len(mixes), "B": (0.5 + 0.2 * mixes[:, 0]).tolist(), "alpha": 0.4, "beta": 0.35}
        info = {**_refs(design), "mixtures": mixes.tolist(), "mixture_present": [True] * len(mixes)}
        return LawFit(law, "valid", DOMS, params, 3 * len(mixes) + 2, info)
    return LawFit(law, "valid", DOMS, TRUTH[law], 0, _refs(design))


class Case:
    def __init__(self, law):
        self.law = law
        design = _design(shared=law == "mixing_law")
        truth = _truth_fit(law, design)
        if law == "mixing_law":  # stage 1 truth: per-mixture scaling laws
            tab = from_columns({**design, "loss:valid": [1.0] * len(design["run"])})
            fn = lambda v, n, d, m: _stage1_truth(truth, tab)  # noqa: E731  (rows in design order)
        else:
            fn = lambda v, n, d, m: truth.predict(n, d, m)  # noqa: E731
        self.truth = truth
        self.table = synthetic_table(fn, design, DOMS, noise=NOISE, seed=3)
        big = self.table.params_total == SIZES[-1]
        self.train, self.test = self.table.take(~big), self.table.take(big)
        self.clean_test = fn(0, self.table.params_total, self.table.tokens, self.table.mix_rm)[big]
        fitter = get_law(law).fitter(get_law(law).table_spec(self.train))
        before = dict(fitter.traces)
        self.fit = fit_table(self.train, law, bootstrap=BOOT, starts=STARTS, seed=0, progress=False)
        self.traces = {k: fitter.traces[k] - before[k] for k in before}


def _stage1_truth(truth, tab):
    from data_mixture.laws.mixing_law import mixture_ids

    law = get_law("mixing_law")
    mixes = np.asarray(truth.info["mixtures"])
    _, ids = mixture_ids(np.concatenate([mixes, tab.mix_rm]))
    ids = ids[len(mixes):]
    data = law.features(tab.params_total, tab.tokens, tab.mix_rm, truth.info)
    data["onehot"] = np.eye(len(mixes))[ids]
    with jax.enable_x64(True):
        x = {k: jnp.asarray(v) for k, v in truth.params.items()}
        return np.exp(np.asarray(law.log_loss(x, {k: jnp.asarray(v) for k, v in data.items()})))


_CASES: dict[str, Case] = {}


def get_case(law: str) -> Case:
    if law not in _CASES:
        _CASES[law] = Case(law)
    return _CASES[law]


@pytest.fixture(scope="module", params=["additive", "camel", "mixing_law"])
def case(request):
    return get_case(request.param)


@pytest.fixture(scope="module")
def camel_case():
    return get_case("camel")


def test_recovers_parameters_within_bootstrap_intervals(case):
    """The true parameters lie in the fit's 95 % bootstrap percentile intervals
    (``Fit.param_intervals``, unwidened), every parameter of every law included (additive's E,
    C and gamma; mixing_law's per-mixture E_k themselves, not their differences).

    One table is one draw: with n parameter components, a correctly calibrated 95 % interval
    still misses about 0.05 n of them by chance (additive and camel: 11 components, mixing_law:
    50). The components are pooled and may miss at most the 97th percentile of
    Binomial(n, 0.05) (2 of 11, 6 of 50), so a calibrated bootstrap fails this test with
    probability < 3 %, while one with 80 % coverage (too narrow, e.g. resamples stuck at the
    point fit, or stopped short along flat directions as camel's were before each resample
    ended with Levenberg-Marquardt, ``Fitter.refine``: 7 of 11 covered) fails it almost surely.
    The exponents must also be pinned down (intervals narrower than 0.1)."""
    iv = case.fit.param_intervals("valid", interval=INTERVAL)
    oks, report = [], []
    for name, true in case.truth.params.items():
        true = np.atleast_1d(np.asarray(true, np.float64))
        lo, hi = (np.atleast_1d(np.asarray(a, np.float64)) for a in iv[name])
        ok = (true >= lo) & (true <= hi)
        oks.append(ok)
        if not np.all(ok):
            report.append(f"{name}[{np.flatnonzero(~ok).tolist()}]: true {np.round(true[~ok], 4)} not in [{np.round(lo[~ok], 4)}, {np.round(hi[~ok], 4)}]")
    ok = np.concatenate(oks)
    allowed = int(scipy.stats.binom.ppf(0.97, ok.size, 1 - INTERVAL))
    assert np.sum(~ok) <= allowed, f"{np.sum(~ok)} of {ok.size} components outside their intervals (allowed {allowed}): {report}"
    for name in ("alpha", "beta"):
        assert iv[name][1] - iv[name][0] < 0.1, (name, iv[name])


# Mean |log(pred / obs)| at the held-out size, in units of the noise sigma. mixing_law
# extrapolates each mixture with its own 3-parameter law from 9 rows, so it is looser.
TOL = {"additive": (2.0, 1.5), "camel": (2.0, 1.5), "mixing_law": (3.0, 2.5)}


def test_predicts_held_out_larger_size_within_noise(case):
    pred = case.fit.predict(case.test)["pred:valid"]
    obs = case.test.loss_rv[:, 0]
    err_obs = np.abs(np.log(pred / obs))
    err_clean = np.abs(np.log(pred / case.clean_test))
    tol_obs, tol_clean = TOL[case.law]
    assert err_obs.mean() < tol_obs * NOISE, err_obs.mean()
    assert err_clean.mean() < tol_clean * NOISE, err_clean.mean()


def test_json_round_trip_gives_identical_predictions(case, tmp_path):
    case.fit.save(tmp_path / "fit.json")
    back = Fit.load(tmp_path / "fit.json")
    a, b = case.fit.predict(case.test), back.predict(case.test)
    assert set(a) == set(b) and {"pred:valid", "lo:valid", "hi:valid"} <= set(a)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])


def test_point_fit_and_bootstrap_share_one_compile(case):
    """The point fits and all BOOT resamples run through the same jitted stage-1 functions: each
    is traced at most once per (law, shape), never per domain or resample."""
    assert case.traces["run"] <= 1 and case.traces["init"] <= 1 and case.traces["final"] <= 1, case.traces
    assert len(case.fit.bootstrap) == BOOT


def _argmin_share(fit: LawFit, n, d=2e9):
    g = _grid()
    loss = fit.predict(np.full(len(g), n), np.full(len(g), d), g)
    return g[int(np.argmin(loss))]


def test_camel_optimum_moves_with_size_as_in_truth(camel_case):
    fit = camel_case.fit.point["valid"]
    small_t, big_t = _argmin_share(camel_case.truth, 1e7), _argmin_share(camel_case.truth, 1e10)
    small_f, big_f = _argmin_share(fit, 1e7), _argmin_share(fit, 1e10)
    assert big_t[2] - small_t[2] >= 0.1  # the truth moves towards knowledge
    assert big_f[2] - small_f[2] >= 0.1, (small_f, big_f)
    np.testing.assert_allclose(big_f, big_t, atol=0.1)


def test_additive_optimum_cannot_move_with_scale(camel_case):
    """argmin_r of the additive law is argmax_r sum C_i r_i^g_i: the same at every N, for any
    parameters: checked for the law fitted on camel's moving-optimum table and random ones."""
    law = get_law("additive")
    assert law.mixture_moves_with_scale is False and get_law("camel").mixture_moves_with_scale is True
    fitted = law.fit(camel_case.train, "valid", starts=STARTS)
    rng = np.random.default_rng(0)
    fits = [fitted]
    for _ in range(5):
        p = {k: (rng.uniform(0.2, 2.0, 3).tolist() if k in ("C", "gamma") else float(rng.uniform(0.1, 1.0))) for k in TRUTH["additive"]}
        fits.append(LawFit("additive", "valid", DOMS, p, 11, {"n_ref": 1e8, "d_ref": 1e9}))
    for f in fits:
        np.testing.assert_array_equal(_argmin_share(f, 1e6), _argmin_share(f, 1e11))
    # while camel, on the same table, moves
    c = camel_case.fit.point["valid"]
    assert not np.array_equal(_argmin_share(c, 1e6), _argmin_share(c, 1e11))


def test_same_seed_same_parameters(camel_case):
    law = get_law("additive")
    a = law.fit(camel_case.train, "valid", starts=8, seed=5)
    b = law.fit(camel_case.train, "valid", starts=8, seed=5)
    assert a.params == b.params
    # the batched work queue (point fits + perturbed bootstrap starts) is deterministic too
    ca = fit_table(camel_case.train, "camel", bootstrap=3, starts=4, seed=5, progress=False)
    cb = fit_table(camel_case.train, "camel", bootstrap=3, starts=4, seed=5, progress=False)
    assert ca.point["valid"].params == cb.point["valid"].params
    assert [m["valid"].params for m in ca.bootstrap] == [m["valid"].params for m in cb.bootstrap]
    assert ca.bootstrap[0]["valid"].params != ca.bootstrap[1]["valid"].params
    fa = fit_table(camel_case.train, "regmix_linear", bootstrap=5, seed=2, progress=False)
    fb = fit_table(camel_case.train, "regmix_linear", bootstrap=5, seed=2, progress=False)
    assert [m["valid"].params for m in fa.bootstrap] == [m["valid"].params for m in fb.bootstrap]
    fc = fit_table(camel_case.train, "regmix_linear", bootstrap=5, seed=3, progress=False)
    assert [m["valid"].params for m in fa.bootstrap] != [m["valid"].params for m in fc.bootstrap]


def test_predict_jax_gradient_matches_finite_differences(camel_case):
    fit = camel_case.fit.point["valid"]
    f = fit.predict_jax
    n, d = np.array([2e8]), np.array([3e9])
    with jax.enable_x64(True):
        g = jax.grad(lambda m: f(n, d, m[None])[0])(jnp.array([0.3, 0.3, 0.4]))
        eps = 1e-6
        fd = [(f(n, d, (np.array([0.3, 0.3, 0.4]) + eps * e)[None])[0] - f(n, d, (np.array([0.3, 0.3, 0.4]) - eps * e)[None])[0]) / (2 * eps) for e in np.eye(3)]
        np.testing.assert_allclose(np.asarray(g), np.asarray(fd), rtol=1e-5)
        np.testing.assert_allclose(np.asarray(f(n, d, np.array([[0.3, 0.3, 0.4]]))), fit.predict(n, d, np.array([[0.3, 0.3, 0.4]])), rtol=1e-12)


@pytest.mark.parametrize("law", ["regmix", "regmix_linear"])
def test_regressors_fit_round_trip_and_are_deterministic(law, camel_case, tmp_path):
    fit = fit_table(camel_case.train, law, bootstrap=3, seed=0, progress=False)
    again = fit_table(camel_case.train, law, bootstrap=3, seed=0, progress=False)
    assert fit.point["valid"].params == again.point["valid"].params
    fit.save(tmp_path / "f.json")
    text = (tmp_path / "f.json").read_text()
    if law == "regmix":
        assert "tree" in fit.point["valid"].params["model"] and "Tree=0" in text
    back = Fit.load(tmp_path / "f.json")
    np.testing.assert_array_equal(fit.predict(camel_case.train)["pred:valid"], back.predict(camel_case.train)["pred:valid"])
    # in-sample fit quality: trees fit the training sizes well (to ~1.2 % on this table, whose
    # losses span 30x in size and 20x in tokens per run), the linear model roughly
    pred = fit.predict(camel_case.train)["pred:valid"]
    err = np.mean(np.abs(np.log(pred / camel_case.train.loss_rv[:, 0])))
    assert err < (0.015 if law == "regmix" else 0.05), err
    assert fit.point["valid"].predict_jax is None if law == "regmix" else fit.point["valid"].predict_jax is not None


def test_size_column_params_active(camel_case):
    t = camel_case.train
    import dataclasses

    moe = dataclasses.replace(t, params_total=t.params_total * 4)  # MoE: 4x total, same active
    fa = fit_table(moe, "regmix_linear", size_column="params_active", bootstrap=0, progress=False)
    ft = fit_table(t, "regmix_linear", size_column="params_total", bootstrap=0, progress=False)
    np.testing.assert_allclose(fa.predict(moe)["pred:valid"], ft.predict(t)["pred:valid"], rtol=1e-10)
    assert fa.size_column == "params_active" and fa.point["valid"].info["size_column"] == "params_active"


def test_registry_lists_every_law():
    assert set(LAWS) == {"mixing_law", "additive", "regmix", "regmix_linear", "camel", "log_linear"}
    for name in LAWS:
        assert get_law(name).name == name
    assert all(isinstance(get_law(n), ParametricLaw) for n in ("mixing_law", "additive", "camel", "log_linear"))


def test_levenberg_marquardt_refine_reaches_the_polished_optimum():
    """``Fitter.refine`` (the bootstrap's last stage) ends where a tight scipy L-BFGS-B polish
    ends, never above where it began, with bounds held: on a flat valley (small b: a and c trade
    off) with one outlier row (Huber's linear regime)."""
    from data_mixture.solver import Fitter, Param, ParamSpec

    spec = ParamSpec([Param("a", lo=0.0, hi=10.0, init=(0.5, 2.0)), Param("b", lo=0.0, init=(0.01, 0.5)),
                      Param("c", init=(-1.0, 1.0))])
    fitter = Fitter(spec, lambda x, d: x["a"] * jnp.exp(-x["b"] * d["t"]) + x["c"], delta=1e-3)
    t = np.linspace(0.0, 2.0, 40)
    y = 3.0 * np.exp(-0.15 * t) - 1.0
    y[7] += 0.5
    data, y_qr, wts_qr = {"t": t}, y[None], np.ones((1, len(t)))
    w0 = spec.pack({"a": 1.0, "b": 0.5, "c": 0.0})[None, None]
    w_short, v_short, _ = fitter.solve(w0, data, y_qr, wts_qr, polish=0, iters=30)
    w_ref, v_ref, _ = fitter.solve(w0, data, y_qr, wts_qr, polish=1, iters=30)
    w, v, its = fitter.refine(w_short, data, y_qr, wts_qr)
    assert v[0] <= v_short[0] and 0 < its[0] <= 100
    assert v[0] <= v_ref[0] * (1 + 1e-9)
    np.testing.assert_allclose(w[0], w_ref[0], atol=1e-5)
    assert 0.0 <= w[0][0] <= 10.0 and w[0][1] >= 0.0
