"""Mixture optimisation: exact constraints, the known optimum of a synthetic law, infeasible errors.

The law here is a closed-form stand-in with the Fit interface (``predict_losses``/``predict_bench``,
bootstrap members), so the optimum is known analytically: for
``L(w) = c + sum_m a_m (w_m - t_m)^2`` over the simplex, the unconstrained optimum is ``t`` when
``t`` lies on the simplex; a box that cuts ``t`` off moves it to the projection in the ``a``
metric, which for equal ``a`` is the Euclidean projection of ``t`` onto the box-simplex.
"""

from __future__ import annotations

import numpy as np
import pytest

from data_mixture.optimize import Constraints, OptimizeError, feasible_bounds, optimize_mixture, project

DOMAINS = ("code", "prose", "math", "knowledge")


class QuadraticFit:
    """Stand-in fit: one validation domain per training domain; loss_v = c + |w - t|^2 + 0.1*(1 - w_v)."""

    law = "quadratic"
    size_column = "params_total"
    mix_domains = DOMAINS
    loss_domains = ("all",)

    def __init__(self, target, members=0, seed=0, tasks=True):
        self.target = np.asarray(target, float)
        rng = np.random.default_rng(seed)
        self.member_targets = [project(self.target + rng.normal(0, 0.02, 4), np.zeros(4), np.ones(4))[0]
                               for _ in range(members)]
        self.bootstrap = [{} for _ in range(members)]
        self.bench = {"qa": None} if tasks else {}

    def predict_losses(self, size_r, tokens_r, mix_rm, *, member=None):
        t = self.target if member is None else self.member_targets[member]
        scale = 1.0 + 10.0 / np.asarray(size_r) ** 0.3
        return (scale * (1.0 + np.sum((np.asarray(mix_rm) - t) ** 2, axis=1)))[:, None]

    def predict_bench(self, loss_rv, *, member=None):
        return 1.0 / (1.0 + np.exp(5.0 * (np.asarray(loss_rv) - 1.5)))


TARGET = np.array([0.4, 0.1, 0.2, 0.3])


def test_finds_the_known_optimum():
    out = optimize_mixture(QuadraticFit(TARGET), size=1e8, tokens=1e9, bootstrap=False)
    w = np.array([out["weights"][d] for d in DOMAINS])
    np.testing.assert_allclose(w, TARGET, atol=2e-4)
    assert abs(w.sum() - 1) < 1e-12


def test_bench_objective_has_the_same_optimum_here():
    """Accuracy is monotone decreasing in the loss, so maximising it finds the loss minimum."""
    out = optimize_mixture(QuadraticFit(TARGET), size=1e8, tokens=1e9, objective="bench", bootstrap=False)
    w = np.array([out["weights"][d] for d in DOMAINS])
    np.testing.assert_allclose(w, TARGET, atol=2e-3)
    assert 0 < out["predicted"]["bench:qa"]["pred"] < 1


def test_honours_every_constraint_exactly():
    available = {"code": 2e8, "prose": 5e9, "math": 5e9, "knowledge": 5e9}  # cap code at 2e8 x 1.5 / 1e9 = 0.3
    c = Constraints(min_weight={"prose": 0.25}, max_weight={"knowledge": 0.2}, available_tokens=available, max_epochs=1.5)
    out = optimize_mixture(QuadraticFit(TARGET), size=1e8, tokens=1e9, constraints=c, bootstrap=False)
    w = np.array([out["weights"][d] for d in DOMAINS])
    assert w[0] <= 0.3 and w[1] >= 0.25 and w[3] <= 0.2 and np.all(w >= 0)
    assert abs(w.sum() - 1) < 1e-12
    # For equal curvature the constrained optimum is the Euclidean projection of the target.
    lo, hi, _ = feasible_bounds(DOMAINS, c, 1e9)
    np.testing.assert_allclose(w, project(TARGET, lo, hi)[0], atol=2e-4)
    np.testing.assert_allclose(w, [0.3, 0.25, 0.25, 0.2], atol=2e-4)
    assert out["constraints"]["binding_upper"]["code"] == "repetition cap"


def test_bootstrap_spread_of_the_optimum():
    out = optimize_mixture(QuadraticFit(TARGET, members=20), size=1e8, tokens=1e9, seed=1)
    boot = out["bootstrap"]
    assert boot["members"] == 20 and len(boot["optima"]) == 20
    for j, d in enumerate(DOMAINS):
        spread = boot["weights"][d]
        assert 0 < spread["std"] < 0.05
        assert spread["lo"] <= TARGET[j] + 0.01 and spread["hi"] >= TARGET[j] - 0.01
    pred = out["predicted"]["loss:all"]
    # Members' losses at the point optimum: each member's own minimum is elsewhere, so they sit above it.
    assert pred["pred"] - 1e-9 <= pred["lo"] <= pred["hi"] < pred["pred"] + 0.05


@pytest.mark.parametrize(
    "constraints, tokens, message",
    [
        (Constraints(min_weight={"code": 0.6, "math": 0.5}), 1e9, "min weights sum to 1.1 > 1 (code 0.6, math 0.5)"),
        (Constraints(max_weight={d: 0.2 for d in DOMAINS}), 1e9, "largest shares allowed sum to 0.8 < 1"),
        (Constraints(min_weight={"math": 0.3}, available_tokens={"math": 1e8}, max_epochs=2), 1e9,
         "domain 'math' has min weight 0.3 above its repetition cap 0.2"),
        (Constraints(min_weight={"code": 0.5}, max_weight={"code": 0.4}), 1e9, "domain 'code' has min weight 0.5 above its max weight 0.4"),
        (Constraints(available_tokens={d: 1e8 for d in DOMAINS}), 1e9, "code <= 0.1 (repetition cap)"),
        (Constraints(min_weight={"web": 0.1}), 1e9, "--min-weight names domain(s) web"),
    ],
)
def test_infeasible_constraints_name_the_culprit(constraints, tokens, message):
    with pytest.raises(OptimizeError, match="infeasible|names") as e:
        optimize_mixture(QuadraticFit(TARGET), size=1e8, tokens=tokens, constraints=constraints, bootstrap=False)
    assert message in str(e.value)


def test_bench_objective_without_bench_laws_is_an_error():
    with pytest.raises(OptimizeError, match="has none"):
        optimize_mixture(QuadraticFit(TARGET, tasks=False), size=1e8, tokens=1e9, objective="bench")


def test_projection_is_exact():
    rng = np.random.default_rng(0)
    lo, hi = np.array([0.1, 0.0, 0.05, 0.0]), np.array([0.5, 0.3, 1.0, 0.25])
    w = project(rng.normal(0, 1, (500, 4)), lo, hi)
    assert np.all(w >= lo) and np.all(w <= hi)
    np.testing.assert_allclose(w.sum(axis=1), 1.0, atol=1e-12)


def test_per_domain_epoch_caps_need_a_pool_and_bind():
    fit = QuadraticFit(TARGET)  # wants code 0.4
    out = optimize_mixture(fit, size=1e6, tokens=1e9, bootstrap=False, unique_tokens={"code": 5e7},
                           constraints=Constraints(domain_epochs={"code": 4}))
    assert out["weights"]["code"] == pytest.approx(0.2)  # 5e7 unique tokens x 4 epochs / 1e9 tokens
    assert out["constraints"]["binding_upper"]["code"] == "repetition cap" and out["unique_tokens"]["code"] == 5e7
    with pytest.raises(OptimizeError, match="--max-epochs math=2 needs the unique tokens of 'math'"):
        optimize_mixture(fit, size=1e6, tokens=1e9, bootstrap=False, constraints=Constraints(domain_epochs={"math": 2}))
    with pytest.raises(OptimizeError, match="--max-epochs names domain"):
        optimize_mixture(fit, size=1e6, tokens=1e9, bootstrap=False, unique_tokens={"code": 5e7},
                         constraints=Constraints(domain_epochs={"cobol": 2}))
