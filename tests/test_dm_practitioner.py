"""The practitioner rules (target-capped, proxy-capped): numbers checked by hand, the held-out
target mapping, errors, and the rules beside every method in ``evaluate``."""

from __future__ import annotations

import numpy as np
import pytest

from data_mixture.baselines import (BaselineSkipped, build_cells, capped_mixture, practitioner_mixtures,
                                    practitioner_names, proxy_best, target_preference)
from data_mixture.evaluate import evaluate_laws
from data_mixture.table import from_columns
from data_mixture.target import parse_target

DOMS = ("code", "prose", "math", "knowledge")
INF = np.inf


def test_target_capped_by_hand():
    # target knowledge 0.75, prose 0.25; knowledge's pool 250k, budget 12M tokens:
    # cap 16 epochs -> 16 x 250e3 / 12e6 = 1/3; the excess 0.75 - 1/3 goes to prose (the only other target domain)
    w, note = capped_mixture([0, 0.25, 0, 0.75], [INF, INF, INF, 250e3], 12e6, 16)
    np.testing.assert_allclose(w, [0, 2 / 3, 0, 1 / 3])
    assert "1 domain(s) at the 16-epoch cap" in note
    # cap 4 epochs -> 1/12 knowledge, 11/12 prose
    w, _ = capped_mixture([0, 0.25, 0, 0.75], [INF, INF, INF, 250e3], 12e6, 4)
    np.testing.assert_allclose(w, [0, 11 / 12, 0, 1 / 12])
    # the excess is shared in proportion: weights (0.2, 0.3, 0.5), third capped at 0.1 -> 0.4 shared 2:3
    w, _ = capped_mixture([0.2, 0.3, 0.5], [INF, INF, 1.0], 40.0, 4)
    np.testing.assert_allclose(w, [0.2 + 0.4 * 0.4, 0.3 + 0.4 * 0.6, 0.1])
    # a second round: (0.5, 0.5) with caps (0.1, 0.3) -> both capped, the rest (0.6) to the untargeted third
    w, note = capped_mixture([0.5, 0.5, 0.0], [1.0, 3.0, INF], 40.0, 4)
    np.testing.assert_allclose(w, [0.1, 0.3, 0.6])
    assert "given to the others" in note
    # no mixture fills the budget: every pool capped
    with pytest.raises(BaselineSkipped, match="no mixture fills the budget"):
        capped_mixture([0.5, 0.5], [1.0, 1.0], 100.0, 4)


def test_practitioner_mixtures_and_the_held_out_target():
    got = practitioner_mixtures(DOMS, tokens=12e6, pools={"knowledge": 250e3}, target="knowledge=0.75,prose=0.25",
                                proxy=(np.array([0.1, 0.1, 0.1, 0.7]), "s1_m3"))
    assert list(got) == practitioner_names() == ["target_capped_4", "target_capped_16", "proxy_capped_4",
                                                 "proxy_capped_16"]
    assert got["target_capped_16"]["weights"]["knowledge"] == pytest.approx(1 / 3)
    assert got["target_capped_16"]["weights"]["code"] == 0.0
    # proxy-capped: knowledge 0.7 capped at 1/3, the excess 0.3667 to code/prose/math in proportion (equal)
    np.testing.assert_allclose(list(got["proxy_capped_16"]["weights"].values()), [2 / 9, 2 / 9, 2 / 9, 1 / 3])
    assert "s1_m3" in got["proxy_capped_4"]["why"]
    # a held-out target weights no training domain: only proxy-capped applies, and the reason says so
    held = practitioner_mixtures(DOMS, tokens=12e6, pools={"knowledge": 250e3}, target="heldout_qa",
                                 proxy=(np.array([0.25] * 4), "s1_m0"))
    assert "proxy-capped is the practitioner rule" in held["target_capped_4"]["skipped"]
    assert "weights" in held["proxy_capped_16"]
    # a target with a held-out part keeps the training-domain part, renormalised
    pref, note = target_preference(parse_target("heldout_qa=0.5,prose=0.25,code=0.25"), DOMS)
    np.testing.assert_allclose(pref, [0.5, 0.5, 0, 0])
    assert "heldout_qa dropped" in note
    # no target: equal weights over the validation domains that are trained
    pref, _ = target_preference(None, DOMS, ("code", "prose", "heldout_qa"))
    np.testing.assert_allclose(pref, [0.5, 0.5, 0, 0])


def _ladder(held_out: bool = False):
    """Two sizes x 4 mixtures (code share), unique:code = 2e5; the loss falls with the code share."""
    cols: dict[str, list] = {k: [] for k in ("run", "params_total", "params_active", "tokens", "mix:code", "mix:prose", "loss:code",
                                             "loss:prose", "unique:code", "seed")}
    for n in (1e5, 2e5, 4e5):
        for m in (0.1, 0.3, 0.5, 0.7):
            for s in (0, 1):
                cols["run"].append(f"n{n:g}_m{m}_s{s}")
                cols["params_total"].append(n)
                cols["params_active"].append(n)
                cols["tokens"].append(20 * n)
                cols["mix:code"].append(m)
                cols["mix:prose"].append(1 - m)
                cols["loss:code"].append(3 - m - 0.1 * np.log10(n) + 0.001 * s)
                cols["loss:prose"].append(3 - 0.1 * np.log10(n) + 0.2 * m + 0.001 * s)
                cols["unique:code"].append(2e5)
                cols["seed"].append(s)
    if held_out:
        cols["loss:heldout"] = [a + 0.01 for a in cols["loss:code"]]
    return from_columns(cols)


def test_practitioner_rules_beside_every_method_in_evaluate():
    r = evaluate_laws(_ladder(), ["regmix_linear"], starts=2, resamples=200, optimum=False)
    for name in practitioner_names():
        assert name in r["baselines"] and "decision" in r["baselines"][name], r["baselines"][name]
    # no target: the mean of code and prose, equal weights; budget 20 x 4e5 = 8e6, code cap 4 x 2e5 / 8e6 = 0.1
    assert "(0.100, 0.900)" in r["baselines"]["target_capped_4"]["notes"]
    # cap 16: 0.4 allowed, the equal share 0.5 is capped
    assert "(0.400, 0.600)" in r["baselines"]["target_capped_16"]["notes"]
    # proxy: the best mean loss at 2e5 is the mixture 0.7 (loss falls 1.0 x m on code, rises 0.2 x m on prose)
    best, which = proxy_best(build_cells(_ladder().take(_ladder().size("params_total") < 4e5), "params_total"))
    np.testing.assert_allclose(best, [0.7, 0.3])
    assert "m0.7" in which and "m0.7" in r["baselines"]["proxy_capped_4"]["notes"]
    # a held-out target: target-capped skipped with the reason, proxy-capped scored
    t = parse_target("heldout")
    r = evaluate_laws(t.apply(_ladder(held_out=True)), ["regmix_linear"], starts=2, resamples=200, optimum=False,
                      target=t)
    assert "held-out target" in r["baselines"]["target_capped_16"]["skipped"]
    assert "decision" in r["baselines"]["proxy_capped_16"]
    assert "target_capped" not in r["verdict"]["text"]


def test_register_adds_the_practitioner_rules_as_candidates():
    from data_mixture.register import with_baselines

    got = with_baselines({"mine": {"code": 0.2, "prose": 0.8}}, _ladder(), metric="loss:mean", tokens=8e6,
                         size_column="params_total")
    assert got["mine"] == {"code": 0.2, "prose": 0.8}
    # budget 8e6, code's pool 2e5: cap 4 epochs -> 0.1, cap 16 -> 0.4 (the equal target weights 0.5 are capped)
    assert got["target_capped_4"]["code"] == pytest.approx(0.1) and got["target_capped_16"]["code"] == pytest.approx(0.4)
    assert got["proxy_capped_16"]["code"] == pytest.approx(0.4)  # the proxy's best, 0.7 code, capped at 0.4
    assert {"uniform", "best_at_proxy"} <= set(got) and "unimax" not in got  # prose has no pool: no UniMax
