"""plan: budgeted proxy-run allocation, validated on a synthetic ground truth.

The truth is the documented default prior (a Chinchilla-like law whose mixture term shrinks with
size). The planned law is ``regmix_linear`` (a linear model in mixture, log N and log D: fits in
milliseconds, so many simulated ladders stay fast); being misspecified, it extrapolates better
from sizes close to the target, which the plan must discover from its simulations alone.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from data_mixture.plan import (DEFAULT_PRESETS, PlanError, PlanSpec, checkpoint_fractions, default_prior, make_plan,
                               preset_sizes, simulate, space_filling_mixtures)

DOMAINS = "code,prose,math,knowledge"
PRESETS = {k: DEFAULT_PRESETS[k] for k in ("s1", "s2", "s3", "s4")}


def spec(**kw) -> PlanSpec:
    base = dict(budget_flops=2e16, target_size=2e7, target_tokens=4e8, law="regmix_linear", presets=PRESETS,
                domains=DOMAINS, simulations=2, min_runs_per_size=4, seed=0, max_weight={"math": 0.5},
                min_weight={"prose": 0.05})
    base.update(kw)
    return PlanSpec(**base)


@pytest.fixture(scope="module")
def plan():
    return make_plan(spec())


def test_plan_respects_the_budget_and_describes_every_run(plan):
    assert plan["total_flops"] <= plan["budget_flops"]
    sizes = preset_sizes(PRESETS)
    runs = plan["runs"]
    assert len(runs) == len(plan["chosen"]["sizes"]) * plan["chosen"]["runs_per_size"]
    for r in runs:
        assert r["flops"] == 6 * r["params_active"] * r["tokens"]
        assert r["tokens"] == r["steps"] * 16 * 256
        assert r["params_active"] == sizes[r["preset"]]["params_active"]
        assert r["overrides"]["train.steps"] == r["steps"] and r["overrides"]["data.mixture"] == r["mixture"]
        w = np.array(list(r["mixture"].values()))
        assert abs(w.sum() - 1) < 1e-9 and r["mixture"]["math"] <= 0.5 + 1e-12 and r["mixture"]["prose"] >= 0.05 - 1e-12
    assert sum(r["flops"] for r in runs) == pytest.approx(plan["total_flops"])
    assert all(r["overrides"]["checkpoint.every_steps"] == -(-r["steps"] // 2) for r in runs)  # default: 2 checkpoints
    json.dumps(plan)  # JSON-able as written


def test_checkpoints_per_run_space_the_evaluations_evenly():
    assert checkpoint_fractions(3) == (1 / 3, 2 / 3, 1.0)
    three = make_plan(spec(checkpoints=3, simulations=1, budget_flops=5e15))
    assert three["method"]["checkpoints"] == 3
    for r in three["runs"]:
        every = r["overrides"]["checkpoint.every_steps"]
        assert every == r["overrides"]["train.eval_every"] == -(-r["steps"] // 3)
        assert len({min(k * every, r["steps"]) for k in range(1, r["steps"] + 1)}) == 3  # no near-duplicate last one
    wide = make_plan(spec(min_sizes=4, simulations=1))
    assert wide["chosen"]["sizes"] == list(PRESETS) and all(len(c["sizes"]) == 4 for c in wide["candidates"])
    with pytest.raises(PlanError, match="--checkpoints 0"):
        make_plan(spec(checkpoints=0))


def test_chosen_allocation_is_the_best_simulated_one(plan):
    errors = [c["sim_error"] for c in plan["candidates"]]
    assert plan["chosen"]["sim_error"] == min(errors)
    assert len(plan["candidates"]) >= 3


def test_the_choice_holds_on_fresh_ground_truth_draws(plan):
    """Re-simulate the chosen and the worst candidate with other seeds (new noise, new mixtures):
    the chosen allocation extrapolates to the target better there too."""
    sizes = preset_sizes(PRESETS)
    truth = default_prior(DOMAINS.split(","))
    domains = tuple(DOMAINS.split(","))
    lo, hi = np.array([0, 0.05, 0, 0]), np.array([1, 1, 0.5, 1.0])
    worst = max(plan["candidates"], key=lambda c: c["sim_error"])
    chosen = next(c for c in plan["candidates"] if c["sizes"] == plan["chosen"]["sizes"]
                  and c["tokens_per_param"] == plan["chosen"]["tokens_per_param"])
    kw = dict(target_size=2e7, target_tokens=4e8, noise=0.01, simulations=3, starts=4, seed=123)
    fresh_best = simulate(truth, "regmix_linear", chosen, sizes, "params_active", domains, domains, lo, hi, **kw)
    fresh_worst = simulate(truth, "regmix_linear", worst, sizes, "params_active", domains, domains, lo, hi, **kw)
    assert fresh_best["sim_error"] < fresh_worst["sim_error"]
    # Here the closest sizes to the target win: the smallest-only window is not chosen.
    assert "s4" in plan["chosen"]["sizes"]


def test_space_filling_design_stays_in_bounds_and_starts_uniform():
    lo, hi = np.array([0.1, 0.0, 0.0]), np.array([0.6, 0.5, 0.5])
    mix = space_filling_mixtures(16, 3, lo, hi, seed=0)
    np.testing.assert_allclose(mix[0], [1 / 3] * 3)
    assert np.all(mix >= lo - 1e-12) and np.all(mix <= hi + 1e-12)
    np.testing.assert_allclose(mix.sum(axis=1), 1, atol=1e-12)
    assert len({tuple(np.round(m, 6)) for m in mix}) == 16


def test_budget_too_small_is_a_clear_error():
    with pytest.raises(PlanError, match="affords no allocation: the cheapest needs"):
        make_plan(spec(budget_flops=1e9))


def test_bad_preset_key_is_named():
    with pytest.raises(PlanError, match="preset 'x': override 'model.widht'"):
        make_plan(spec(presets={"x": {"model.widht": 3}, **PRESETS}))


def test_infeasible_bounds_are_reported():
    with pytest.raises(PlanError, match="min weights sum to 1.2"):
        make_plan(spec(min_weight={"code": 0.6, "knowledge": 0.6}))


def test_a_pool_without_match_repetition_is_every_runs_own_pool():
    """The data's pool is the data's: without --match-repetition every run trains on all U tokens
    (a proxy repeats it fewer times than the target will); with it, each proxy gets its share."""
    fixed = make_plan(spec(simulations=1, unique_tokens={"code": 2e6}))
    assert {r["overrides"]["data.unique_tokens"] for r in fixed["runs"]} == {"code=2000000"}
    assert all(r["unique_tokens"] == {"code": 2000000} for r in fixed["runs"])
    matched = make_plan(spec(simulations=1, unique_tokens={"code": 2e6}, match_repetition=True))
    assert all(r["unique_tokens"]["code"] == round(2e6 * r["tokens"] / 4e8) for r in matched["runs"])
