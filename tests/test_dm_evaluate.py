"""`evaluate` decides honestly: decision accuracy split by the seed noise, bootstrap intervals,
the seed noise floor, replicate averaging, the baselines, the verdict.

Every expected number is computed by hand in the test (comments show the arithmetic). Law fits
use ``regmix_linear`` (least squares, milliseconds), so the file runs in seconds.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from data_mixture import decisions as dec
from data_mixture.__main__ import main
from data_mixture.baselines import best_at_proxy, build_cells, rank_by_weight, trend, uniform
from data_mixture.evaluate import EvaluateError, evaluate_laws, format_report, verdict
from data_mixture.table import from_columns, write_runs

DOMS = ("code", "prose")


def _table(rows: list[dict]):
    """rows: {run, n, tokens, mix (code share), loss_code, loss_prose, seed}."""
    cols = {"run": [], "params_total": [], "params_active": [], "tokens": [], "mix:code": [], "mix:prose": [],
            "loss:code": [], "loss:prose": [], "seed": []}
    for r in rows:
        cols["run"].append(r["run"])
        cols["params_total"].append(r["n"])
        cols["params_active"].append(r["n"])
        cols["tokens"].append(r.get("tokens", 20 * r["n"]))
        cols["mix:code"].append(r["mix"])
        cols["mix:prose"].append(1 - r["mix"])
        cols["loss:code"].append(r["loss_code"])
        cols["loss:prose"].append(r["loss_prose"])
        cols["seed"].append(r.get("seed", 0))
    return from_columns(cols)


# --------------------------------------------------------------------------- decisions.py, by hand

OBS = np.array([1.00, 1.01, 1.20, 1.50])
PRED = np.array([1.10, 1.00, 1.30, 1.20])


def test_decision_accuracy_splits_pairs_inside_the_seed_noise():
    # sd 0.01, 2 seeds per cell: threshold 2 * 0.01 * sqrt(1/2 + 1/2) = 0.02 -> only (0, 1) (diff 0.01) is within.
    within = dec.noise_pairs(OBS, np.array([2, 2, 2, 2]), 0.01)
    assert within[0, 1] and within[1, 0] and within.sum() == 2
    out = dec.split_accuracy(dec.agreement_matrix(PRED, OBS), within)
    # pairs (0,2) (0,3) (1,2) (1,3) right, (2,3) wrong: 4 of 5 decided; (0,1) wrong, within the noise.
    assert out["pairs_decided"] == 5 and out["accuracy"] == pytest.approx(0.8)
    assert out["pairs_within_noise"] == 1 and out["accuracy_within_noise"] == 0.0
    assert out["pairs"] == 6 and out["accuracy_all"] == pytest.approx(4 / 6)
    assert dec.pairwise_accuracy(PRED, OBS) == pytest.approx(4 / 6)
    # noise not measured: no pair is within
    assert not dec.noise_pairs(OBS, np.array([1, 1, 1, 1]), None).any()


def test_resampled_accuracy_weights_pairs_by_multiplicity():
    agree = dec.agreement_matrix(PRED, OBS)
    keep = ~dec.noise_pairs(OBS, np.array([2, 2, 2, 2]), 0.01)
    counts = np.array([[2.0, 1, 0, 1], [1, 0, 2, 1], [4, 0, 0, 0]])
    acc = dec.resampled_accuracy(agree, keep, counts)
    # [2,1,0,1]: (0,1) within (dropped), (0,3) x2 right, (1,3) x1 right -> 3/3
    # [1,0,2,1]: (0,2) x2 right, (0,3) x1 right, (2,3) x2 wrong -> 3/5; [4,0,0,0]: no pair -> NaN
    assert acc[0] == pytest.approx(1.0) and acc[1] == pytest.approx(0.6) and np.isnan(acc[2])
    assert dec.percentile_interval(np.array([0.0, 1.0, np.nan]), 0.5) == (0.25, 0.75)


def test_pooled_sd_and_seed_difference_by_hand():
    # cell a: 1, 3 (ss 2); cell b: 2, 4, 6 (ss 8); cell c: one value. sqrt(10 / (1 + 2))
    got = dec.pooled_sd(np.array([1.0, 3, 2, 4, 6, 5]), np.array([0, 0, 1, 1, 1, 2]))
    assert got == {"sd": pytest.approx(np.sqrt(10 / 3)), "dof": 3, "cells": 2, "rows": 5}
    assert dec.pooled_sd(np.array([1.0, 2.0]), np.array([0, 1]))["sd"] is None
    # paired: d = 0.5, 1, 1; mean 5/6, sd sqrt(1/12); half width t(0.975, 2) sd / sqrt 3 = 4.302653 * 0.288675 / 1.732051
    diff = dec.seed_difference([(0, 1.0), (1, 2.0), (2, 3.0)], [(0, 0.5), (1, 1.0), (2, 2.0)])
    assert diff["diff"] == pytest.approx(5 / 6) and diff["method"] == "paired t over 3 seeds"
    assert diff["hi"] - diff["diff"] == pytest.approx(4.302653 * np.sqrt(1 / 12) / np.sqrt(3), rel=1e-5)
    assert dec.seed_difference([(0, 1.0)], [(0, 0.5)])["lo"] is None


# ---------------------------------------------------------------- a hand-made table with seeds

PROXY = {0.2: 2.00, 0.4: 2.10, 0.6: 2.20, 0.8: 2.30}  # mean loss at the proxy size: order 0.2 < 0.4 < 0.6 < 0.8
HELD = {0.2: 1.50, 0.4: 1.62, 0.6: 1.61, 0.8: 1.80}  # at the held-out size: 0.6 and 0.4 swap (0.01 apart)
DELTA = 0.003  # seed 0 is DELTA below the cell mean, seed 1 DELTA above (both domains)


def _seeds_table():
    rows = []
    for n, means in ((1e5, {m: v + 0.3 for m, v in PROXY.items()}), (2e5, PROXY), (4e5, HELD)):
        for m, v in means.items():
            for s, sign in ((0, -1), (1, 1)):
                # code carries the mixture signal plus 0.1 x (1 - share); prose the rest, so the mean is v
                code = v + 0.1 * (1 - m) + sign * DELTA
                rows.append({"run": f"n{n:g}_m{m}_s{s}", "n": n, "mix": m, "seed": s,
                             "loss_code": code, "loss_prose": 2 * v - code + 4 * sign * DELTA})
    return _table(rows)


@pytest.fixture(scope="module")
def seeds_report():
    return evaluate_laws(_seeds_table(), ["regmix_linear"], starts=2, resamples=400)


def test_noise_floor_is_the_pooled_seed_spread(seeds_report):
    floor = seeds_report["noise_floor"]["400000"]
    # each cell: code -+ DELTA, prose -+ 3 DELTA, so the mean loss -+ 2 DELTA
    # two values x -+ e: ss 2 e^2, one dof per cell -> pooled sd = e sqrt 2
    assert floor["measured"] and floor["cells_with_seeds"] == 4 and floor["dof"] == 4 and floor["rows"] == 8
    assert floor["sd_mean_loss"] == pytest.approx(2 * DELTA * np.sqrt(2))
    assert floor["sd"]["code"] == pytest.approx(DELTA * np.sqrt(2)) and floor["sd"]["prose"] == pytest.approx(3 * DELTA * np.sqrt(2))


def test_replicates_are_averaged_and_decisions_split_by_noise(seeds_report):
    r = seeds_report
    assert r["test_rows"] == 8 and r["test_cells"] == 4
    assert r["observed_best"]["mean_loss"] == pytest.approx(1.50) and r["observed_best"]["seeds"] == 2
    assert r["observed_best"]["run"] == "n400000_m0.2_s0+n400000_m0.2_s1"
    d = r["decision"]
    # threshold 2 sd sqrt(1/2 + 1/2) = 2 * 0.008485 = 0.017 > 0.01: the (0.4, 0.6) pair is within the noise
    assert d["noise_measured"] and d["pairs"] == 6 and d["pairs_within_noise"] == 1 and d["pairs_decided"] == 5
    base = r["baselines"]["best_at_proxy"]
    # best_at_proxy ranks by the proxy order 0.2 < 0.4 < 0.6 < 0.8: every decided pair right, the noisy one wrong
    assert base["decision"]["accuracy"] == 1.0 and base["decision"]["accuracy_within_noise"] == 0.0
    assert base["decision"]["lo"] == 1.0 and base["decision"]["hi"] == 1.0
    np.testing.assert_allclose(np.mean(base["predictions"]["observed"], axis=1), [HELD[m] for m in sorted(HELD)])
    np.testing.assert_allclose(np.mean(base["predictions"]["predicted"], axis=1), [PROXY[m] for m in sorted(PROXY)])
    # its pick (0.2) is the best: regret 0, paired interval over the 2 seeds [0, 0]
    assert base["pick_regret"] == 0 and base["pick_regret_interval"]["method"] == "paired t over 2 seeds"
    # uniform picks the most even mixture (0.4 or 0.6 tie on entropy; argmin takes 0.4): regret 0.12 +- t over seeds
    uni = r["baselines"]["uniform"]
    assert uni["pick_regret"] == pytest.approx(0.12) and uni["mean"]["mae"] is None
    assert uni["pick_regret_interval"]["lo"] == pytest.approx(0.12) and uni["pick_regret_interval"]["hi"] == pytest.approx(0.12)


def test_trend_and_rank_by_weight_baselines(seeds_report):
    tr = seeds_report["baselines"]["trend"]
    # mean loss per mixture: v + 0.3 at 1e5, v at 2e5 -> log-linear in N, extrapolated to 4e5 per domain
    pred = np.mean(tr["predictions"]["predicted"], axis=1)
    for k, m in enumerate(sorted(PROXY)):
        code = [PROXY[m] + 0.3 + 0.1 * (1 - m), PROXY[m] + 0.1 * (1 - m)]
        prose = [PROXY[m] + 0.3 - 0.1 * (1 - m), PROXY[m] - 0.1 * (1 - m)]
        want = np.mean([c[1] ** 2 / c[0] for c in (code, prose)])  # two sizes a factor 2 apart: L(4e5) = L2^2 / L1
        assert pred[k] == pytest.approx(want)
    rw = seeds_report["baselines"]["rank_by_weight"]
    assert "decision" not in rw and set(rw["domains"]) == {"code", "prose"}
    # held-out loss:code = v + 0.1 (1 - m): 1.58, 1.68, 1.65, 1.82 for m = 0.2, 0.4, 0.6, 0.8. Ranking by the code
    # share predicts it falling with m: only the (0.4, 0.6) pair is right -> 1 of 6, every pair outside the
    # code noise (threshold 2 x DELTA sqrt 2 = 0.0085 < 0.03)
    code = rw["domains"]["code"]["decision"]
    assert code["accuracy"] == pytest.approx(1 / 6) and code["pairs_decided"] == 6


def test_the_verdict_line_leads_the_report(seeds_report):
    text = format_report(seeds_report)
    assert text.splitlines()[0] == f"**{seeds_report['verdict']['text']}**"
    assert text.splitlines()[0].startswith("**Verdict: ")
    assert "| *trend* (baseline) |" in text and "| regmix_linear |" in text


def test_verdict_rule_on_resampled_accuracies():
    rng = np.random.default_rng(0)
    good, base = 0.9 + 0.02 * rng.standard_normal(500), 0.6 + 0.02 * rng.standard_normal(500)
    tied = 0.61 + 0.02 * rng.standard_normal(500)  # differences to base spread over 0 -> does not beat it
    won = verdict({"lawA": good, "lawB": tied}, {"uniform": base, "trend": base - 0.05},
                  {"lawA": 0.9, "lawB": 0.61}, {"uniform": 0.6, "trend": 0.55}, {"best_at_proxy": "no size below"})
    assert won["winners"] == ["lawA"] and won["laws"]["lawA"]["uniform"]["beats"]
    assert won["text"].startswith("Verdict: lawA beats every baseline (trend, uniform)") and "best_at_proxy skipped" in won["text"]
    lost = verdict({"lawB": tied}, {"uniform": base}, {"lawB": 0.61}, {"uniform": 0.6}, {})
    assert lost["winners"] == [] and lost["text"].startswith("Verdict: no law beats every baseline (uniform)")


# ------------------------------------------------------------------- baselines on tiny tables


def test_baselines_on_a_tiny_table_with_obvious_answers():
    rows = []
    for n in (1e5, 2e5, 4e5):
        for m, c in ((0.5, 3.0), (0.9, 4.0)):
            loss = c * (n / 1e5) ** -0.1  # a pure power law per mixture
            rows.append({"run": f"{n:g}_{m}", "n": n, "mix": m, "loss_code": loss, "loss_prose": loss})
    t = _table(rows)
    cells = build_cells(t, "params_total")
    train, held = (build_cells(t.take(t.params_total < 4e5), "params_total"),
                   build_cells(t.take(t.params_total == 4e5), "params_total"))
    assert len(cells) == 6
    np.testing.assert_allclose(trend(train, held)["pred_cv"][:, 0], held.obs_cv[:, 0], rtol=1e-12)  # exact power law
    np.testing.assert_allclose(best_at_proxy(train, held)["pred_cv"][:, 0], [3.0 * 2 ** -0.1, 4.0 * 2 ** -0.1])
    uni = uniform(held, DOMS)["rank_c"]
    assert uni[0] < uni[1]  # 0.5/0.5 is the uniform mixture
    rw = rank_by_weight(held, DOMS, DOMS)["rank_cv"]
    np.testing.assert_allclose(rw, [[-0.5, -0.5], [-0.9, -0.1]])


def test_held_out_mixtures_not_at_the_proxy_borrow_the_nearest_or_skip():
    rows = [{"run": f"a{k}", "n": 1e5, "mix": m, "loss_code": 3 + m, "loss_prose": 3 - m} for k, m in enumerate((0.1, 0.5, 0.9))]
    rows += [{"run": f"b{k}", "n": 2e5, "mix": m, "loss_code": 2 + m, "loss_prose": 2 - m} for k, m in enumerate((0.2, 0.6))]
    t = _table(rows)
    train, held = (build_cells(t.take(t.params_total < 2e5), "params_total"),
                   build_cells(t.take(t.params_total == 2e5), "params_total"))
    got = best_at_proxy(train, held)
    np.testing.assert_allclose(got["pred_cv"][:, 0], [3.1, 3.5])  # 0.2 -> 0.1, 0.6 -> 0.5
    assert "2 of 2 held-out cells borrow the nearest proxy mixture (L1 distance up to 0.200)" in got["notes"]
    report = evaluate_laws(t, [], resamples=100)
    assert "no mixture was run at 2 or more training sizes" in report["baselines"]["trend"]["skipped"]


# --------------------------------------------------------------------------------------- CLI


def test_cli_each_holdout_writes_reports_plots_and_the_verdict(tmp_path, capsys):
    rng = np.random.default_rng(1)
    rows = []
    for n in (1e5, 2e5, 4e5, 8e5):
        for k, m in enumerate(np.linspace(0.1, 0.9, 6)):
            for s in (0, 1):
                base = 2 + 0.5 * (n / 1e5) ** -0.2 + 0.2 * (m - 0.4) ** 2
                rows.append({"run": f"{n:g}_{k}_{s}", "n": n, "mix": m, "seed": s,
                             "loss_code": base * np.exp(0.004 * rng.normal()), "loss_prose": base * np.exp(0.004 * rng.normal())})
    runs = tmp_path / "runs.csv"
    write_runs(_table(rows), runs)
    out = tmp_path / "eval"
    main(["evaluate", "--runs", str(runs), "--laws", "regmix_linear", "--holdout", "each", "--starts", "2",
          "--resamples", "200", "--out-dir", str(out)])
    printed = capsys.readouterr().out
    report = json.loads((out / "evaluation.json").read_text())
    assert [r["held_out_size"] for r in report["holdouts"]] == [4e5, 8e5]
    assert report["holdouts"][1]["train_sizes"] == [1e5, 2e5, 4e5]
    assert report["verdict"]["text"].startswith("Verdict over 2 hold-outs:") and report["verdict"]["text"] in printed
    assert (out / "evaluation.md").read_text().startswith(f"**{report['verdict']['text']}**")
    for f in ("pred_vs_obs_4e+05.png", "pred_vs_obs_8e+05.png", "decision_accuracy.png"):
        assert (out / f).stat().st_size > 1000
    floor = report["noise_floor"]["800000"]
    assert floor["measured"] and floor["cells_with_seeds"] == 6 and 0.002 < floor["rel_sd_mean_loss"] < 0.008


def test_each_needs_three_sizes(tmp_path):
    t = _table([{"run": f"r{k}", "n": n, "mix": 0.5, "loss_code": 2.0, "loss_prose": 2.0} for k, n in enumerate((1e5, 2e5))])
    with pytest.raises(EvaluateError, match="--holdout each needs more than 2 sizes"):
        evaluate_laws(t, [], holdout="each")


def test_runs_files_are_concatenated_and_must_share_columns(tmp_path):
    from data_mixture.cli.evaluate import read_runs_files as _read_runs_files
    from data_mixture.table import TableError

    rows = [{"run": f"r{k}", "n": n, "mix": 0.5, "loss_code": 2.0, "loss_prose": 2.0} for k, n in enumerate((1e5, 2e5))]
    write_runs(_table(rows[:1]), tmp_path / "a.csv")
    write_runs(_table(rows[1:]), tmp_path / "b.csv")
    both = _read_runs_files([str(tmp_path / "a.csv"), str(tmp_path / "b.csv")])
    assert both.run.tolist() == ["r0", "r1"] and both.params_total.tolist() == [1e5, 2e5]
    (tmp_path / "c.csv").write_text("run,params_total,params_active,tokens,mix:code,mix:prose,loss:code\nx,1e5,1e5,2e6,0.5,0.5,2\n")
    with pytest.raises(TableError, match="has columns .* that .* has not"):
        _read_runs_files([str(tmp_path / "a.csv"), str(tmp_path / "c.csv")])


# --------------------------------------------------------------------- noise per pair, by hand

def test_one_noisy_cell_no_longer_decides_other_pairs():
    # Cells 0-3: seed sd 0.001 (3 seeds), means 0.004 apart; cell 4: sd 0.03. Pooled over all five cells the sd is
    # sqrt((4 * 0.001^2 + 0.03^2) / 5) = 0.0135, threshold 2 * 0.0135 * sqrt(2/3) = 0.022 > 0.004: every quiet pair
    # would be within the noise. Per pair: 2 * sqrt(2 * 0.001^2 / 3) = 0.0016 < 0.004: every quiet pair is decided.
    obs_k = np.array([1.000, 1.004, 1.008, 1.012, 1.016])
    sd_k = np.array([0.001, 0.001, 0.001, 0.001, 0.03])
    n_k = np.full(5, 3)
    pooled = float(np.sqrt(np.mean(sd_k ** 2)))
    assert dec.noise_pairs(obs_k, n_k, pooled)[:4, :4].sum() == 12  # the old rule: all 6 quiet pairs within
    within = dec.noise_pairs(obs_k, n_k, sd_k)
    assert not within[:4, :4].any()  # per pair: the quiet pairs are decided
    assert within[4, :4].all()  # the noisy cell's own pairs stay within its noise (2 * sqrt(0.03^2/3 + ...) = 0.035)
    # the noisy cell is flagged, and the robust pooled figure is the quiet cells' sd
    dof_k = n_k - 1
    assert dec.noisy_cells(sd_k, dof_k).tolist() == [False, False, False, False, True]
    robust = dec.robust_pooled_sd(sd_k, dof_k)
    assert robust["sd"] == pytest.approx(0.001) and robust["dof"] == 8 and robust["cells"] == 4
    # a cell with one seed takes the fallback: with 0.001 its pair with cell 0 (0.004 apart) is decided
    got = dec.noise_pairs(obs_k[:2], np.array([3, 1]), np.array([0.001, np.nan]), fallback=0.001)
    assert not got[0, 1]
    # no fallback: a cell without an sd cannot be judged within the noise
    assert not dec.noise_pairs(obs_k[:2], np.array([3, 1]), np.array([0.001, np.nan])).any()


def _noisy_table(unique: bool = False):
    """Two sizes, 5 mixtures; at the held-out size 3 seeds per mixture, mixture 0.9 very noisy."""
    rows = []
    mixes = (0.1, 0.3, 0.5, 0.7, 0.9)
    for n in (1e5, 2e5, 4e5):
        for i, m in enumerate(mixes):
            for s in (0, 1, 2):
                e = (s - 1) * (0.05 if m == 0.9 else 0.001) if n == 4e5 else (s - 1) * 0.001
                v = 2.0 + 0.004 * i + (0.3 if n == 1e5 else 0.0) + e
                rows.append({"run": f"n{n:g}_m{m}_s{s}", "n": n, "mix": m, "seed": s, "loss_code": v, "loss_prose": v})
    t = _table(rows)
    if unique:
        from data_mixture.table import from_columns, to_columns

        cols = to_columns(t)
        cols["unique:code"] = ["1000000"] * len(t)
        cols["unique:prose"] = ["9000000"] * len(t)
        t = from_columns(cols)
    return t


def test_evaluate_flags_the_noisy_cell_and_decides_the_quiet_pairs():
    r = evaluate_laws(_noisy_table(), ["regmix_linear"], starts=2, resamples=200, optimum=False)
    floor = r["noise_floor"]["400000"]
    noisy = [c["run"] for c in floor["per_cell"] if c["noisy"]]
    assert len(noisy) == 1 and "m0.9" in noisy[0]
    assert floor["sd_mean_loss"] == pytest.approx(0.001) and floor["sd_mean_loss_all"] > 0.02
    # 4 quiet mixtures 0.004 apart: their 6 pairs are decided; the noisy one's 4 pairs are within its noise
    d = r["decision"]
    assert d["pairs"] == 10 and d["pairs_decided"] == 6 and d["pairs_within_noise"] == 4
    md = format_report(r)
    assert "**noisy**" in md and "each cell's own seed sd" in md


def test_proportional_and_unimax_baselines_by_hand():
    from data_mixture.baselines import kl_score, unimax_weights

    # U = (1, 9), budget 10, cap 4 epochs: code (smaller) takes min(10/2, 4) = 4, prose the remaining 6 -> (0.4, 0.6)
    np.testing.assert_allclose(unimax_weights(np.array([1.0, 9.0]), 10.0, 4.0), [0.4, 0.6])
    # budget 4: nobody capped, uniform
    np.testing.assert_allclose(unimax_weights(np.array([1.0, 9.0]), 4.0, 4.0), [0.5, 0.5])
    np.testing.assert_allclose(kl_score(np.array([[0.1, 0.9]]), np.array([[0.1, 0.9]])), [0.0], atol=1e-12)
    # no unique:<domain> columns: skipped with the reason
    r = evaluate_laws(_noisy_table(), ["regmix_linear"], starts=2, resamples=200, optimum=False)
    assert "unique:<domain>" in r["baselines"]["proportional"]["skipped"]
    assert "unique:<domain>" in r["baselines"]["unimax"]["skipped"]
    # with them (code 1e6, prose 9e6 unique tokens): proportional = (0.1, 0.9) ranks mixture 0.1 first
    r = evaluate_laws(_noisy_table(unique=True), ["regmix_linear"], starts=2, resamples=200, optimum=False)
    prop = r["baselines"]["proportional"]
    assert "(0.100, 0.900)" in prop["notes"] and prop["picked_tested_run"].startswith("n400000_m0.1_")
    # budget 20 x 4e5 = 8e6 tokens: code takes min(4e6, 4 x 1e6) = 4e6, prose 4e6 -> uniform (0.5, 0.5) picks 0.5
    uni = r["baselines"]["unimax"]
    assert "(0.500, 0.500)" in uni["notes"] and uni["picked_tested_run"].startswith("n400000_m0.5_")
