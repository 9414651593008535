"""Olmix's public swarms as runs tables, the log-linear law, and the out-of-fold benchmark's scoring."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import numpy as np
import pytest

from data_mixture.laws import get_law
from data_mixture.table import from_columns, read_runs
from experiments.benchmarks.olmix_swarms import fold_scores, folds, interval
from experiments.tools.olmix_swarms import COMMIT, DROPPED, MMLU_WEIGHTS, ConvertError, clean, convert, mmlu_column

RESULTS = Path(__file__).resolve().parents[1] / "experiments/benchmarks/results/olmix_swarms"


# -- the committed tables ----------------------------------------------------------------------------
@pytest.mark.parametrize("name,runs,domains", [("dclm", 127, 24), ("full_recomputation", 512, 64)])
def test_committed_tables_read_back_as_runs_tables(name, runs, domains):
    t = read_runs(RESULTS / f"{name}_runs.csv")
    assert (len(t), len(t.mix_domains), len(t.loss_domains)) == (runs, domains, 110 + 8)
    assert set(np.unique(t.params_total)) == {3e7} and set(np.unique(t.tokens)) == {3e9}
    np.testing.assert_allclose(t.mix_rm.sum(1), 1.0, atol=1e-12)
    # the aggregates are what the metadata says: mean_bpb = mean of the 52 objective metrics (7 + 19 + 26)
    fams = {f: [d for d in t.loss_domains if d == f"family_{f}"] for f in ("math", "code", "qa")}
    assert all(len(v) == 1 for v in fams.values())
    mean = (7 * t.loss("family_math") + 19 * t.loss("family_code") + 26 * t.loss("family_qa")) / 52
    np.testing.assert_allclose(t.loss("mean_bpb"), mean, rtol=2e-5)
    minerva = [d for d in t.loss_domains if d.startswith("minerva_math_")]
    np.testing.assert_allclose(t.loss("family_math"), np.mean([t.loss(d) for d in minerva], axis=0), rtol=2e-5)
    meta = json.loads((RESULTS / "metadata.json").read_text())
    assert meta["source"]["commit"] == COMMIT and meta["source"]["license"] == "Apache-2.0"
    assert "Apache License" in (RESULTS / "LICENSE").read_text()


def test_first_dclm_row_matches_the_source():
    """Row 0 of Olmix's dclm_ratios.csv / dclm_metrics.csv at the commit (values read from the files)."""
    t = read_runs(RESULTS / "dclm_runs.csv")
    assert t.run[0] == "dclm-datadelve-5xC-30m-62e7dc06-0000" and t.extra["olmix_run"][0] == "19g3guks"
    w = dict(zip(t.mix_domains, t.mix_rm[0]))
    assert w["entertainment"] == pytest.approx(0.2) and w["health"] == pytest.approx(0.1) and w["social_life"] == pytest.approx(0.7)
    assert sum(v > 0 for v in w.values()) == 3
    assert t.loss("arc_challenge.rc.olmes")[0] == pytest.approx(1.69303692503894, rel=5e-6)
    assert t.loss("codex_humaneval.3shot.none")[0] == pytest.approx(3.1864629614928432, rel=5e-6)


# -- the converter on hand-made files ----------------------------------------------------------------
def _csv(header, rows) -> str:
    s = io.StringIO()
    w = csv.writer(s)
    w.writerow(header)
    w.writerows(rows)
    return s.getvalue()


def _source(runs=("a", "b")):
    subjects = [mmlu_column(s) for w in MMLU_WEIGHTS.values() for s in w]
    tasks = ["minerva_math_algebra::olmes", "mbpp:3shot::none", "arc_easy:rc::olmes", *DROPPED, *subjects]
    meta = ["", "run", "name", "index"]
    ratios = _csv(meta + ["dclm:x", "wiki"], [[i, r, f"swarm-{r}", i, 0.25 + 0.5 * i, 0.75 - 0.5 * i] for i, r in enumerate(runs)])
    # BPB: minerva 1, mbpp 2, arc 3, dropped 50, every MMLU subject 4 (+ i per run)
    vals = {"minerva_math_algebra::olmes": 1.0, "mbpp:3shot::none": 2.0, "arc_easy:rc::olmes": 3.0, **{d: 50.0 for d in DROPPED}}
    metrics = _csv(meta + tasks, [[i, r, f"swarm-{r}", i] + [vals.get(t, 4.0) + i for t in tasks] for i, r in enumerate(runs)])
    return ratios, metrics


def test_convert_hand_made_files():
    ratios, metrics = _source()
    cols = convert(ratios, metrics)
    t = from_columns(cols)
    assert t.mix_domains == ("dclm.x", "wiki") and t.run.tolist() == ["swarm-a", "swarm-b"]
    assert t.extra["olmix_run"].tolist() == ["a", "b"]
    # objective: math {1}, code {2}, qa {3, 4 MMLU categories at 4}: the dropped tasks (50) never count
    np.testing.assert_allclose(t.loss("family_qa"), [(3 + 4 * 4) / 5, (4 + 4 * 5) / 5], rtol=5e-6)  # BPB written with 6 digits
    np.testing.assert_allclose(t.loss("mean_bpb"), [(1 + 2 + 3 + 16) / 7, (2 + 3 + 4 + 20) / 7], rtol=5e-6)
    np.testing.assert_allclose(t.loss("mmlu_humanities"), [4.0, 5.0])
    assert clean("arc_challenge:rc::olmes") == "arc_challenge.rc.olmes"


def test_convert_names_what_is_wrong():
    ratios, metrics = _source()
    _, other = _source(runs=("a", "c"))
    with pytest.raises(ConvertError, match="different runs"):
        convert(ratios, other)
    with pytest.raises(ConvertError, match="header starts"):
        convert(ratios.replace("index", "idx", 1), metrics)
    with pytest.raises(ConvertError, match="lacks task column"):
        convert(ratios, metrics.replace("mmlu_virology", "mmlu_virus"))


# -- the log-linear law -----------------------------------------------------------------------------
def test_log_linear_recovers_known_parameters():
    c, t = 0.8, np.array([0.5, -0.2, 0.1])
    mix = np.random.default_rng(0).dirichlet(np.ones(3), size=40)
    loss = c + np.exp(mix @ t)
    cols = {"run": [f"r{i}" for i in range(40)], "params_total": [3e7] * 40, "params_active": [3e7] * 40, "tokens": [3e9] * 40,
            **{f"mix:{d}": mix[:, j] for j, d in enumerate("abc")}, "loss:y": loss}
    table = from_columns(cols)
    law = get_law("log_linear")
    assert law.min_sizes() == 1 and law.num_params(3) == 4 and not law.mixture_moves_with_scale
    fit = law.fit(table, "y", starts=8)
    assert fit.params["c"] == pytest.approx(c, abs=1e-4)
    np.testing.assert_allclose(fit.params["t"], t, atol=1e-4)
    np.testing.assert_allclose(fit.predict(table.params_total, table.tokens, table.mix_rm), loss, rtol=1e-5)


# -- the benchmark's scoring ------------------------------------------------------------------------
def test_scoring_on_a_hand_checkable_case():
    # ranks of the score (3, 2, 1) against the truth's (3, 1, 2): d = (0, 1, -1), rho = 1 - 6 * 2 / (3 * 8) = 0.5;
    # the predicted best (lowest score) is run 2, true 2.0, the fold's best 1.0: regret 1.0
    s = fold_scores(np.array([3.0, 1.0, 2.0]), np.array([0.3, 0.2, 0.1]))
    assert s == {"spearman": pytest.approx(0.5), "regret": pytest.approx(1.0)}
    assert fold_scores(np.array([1.0, 2.0]), np.array([0.0, 5.0]))["regret"] == 0.0
    iv = interval([1.0, 2.0, 3.0])  # mean 2, sd 1, t_{0.975, 2} = 4.3027: half width 4.3027 / sqrt(3)
    assert iv["mean"] == 2.0 and iv["hi"] - 2.0 == pytest.approx(4.302653 / np.sqrt(3), rel=1e-5) and iv["n"] == 3
    parts = folds(11, 5, seed=0)
    assert sorted(np.concatenate(parts).tolist()) == list(range(11)) and sorted(map(len, parts)) == [2, 2, 2, 2, 3]
    assert all((a == b).all() for a, b in zip(parts, folds(11, 5, seed=0)))


def test_baseline_scores_follow_the_held_out_rows():
    """The baselines score cells (sorted by mixture), the benchmark scores rows: the mapping puts
    each score on its own run (uniform: sum r log r of the row's own mixture)."""
    from data_mixture.baselines import uniform_score
    from experiments.benchmarks.olmix_swarms import baseline_scores

    t = read_runs(RESULTS / "dclm_runs.csv")
    train, test = t.take(np.arange(20, 60)), t.take(np.arange(0, 20)[::-1])
    scores, skipped = baseline_scores(train, test, "mean_bpb")
    np.testing.assert_allclose(scores["uniform"][0], uniform_score(test.mix_rm))
    best = train.mix_rm[np.argmin(train.loss("mean_bpb"))]
    np.testing.assert_allclose(scores["proxy_capped_4"][0], 0.5 * np.abs(test.mix_rm - best).sum(1), atol=1e-12)
    assert "target_capped_4" in skipped and "best_at_proxy" in skipped
