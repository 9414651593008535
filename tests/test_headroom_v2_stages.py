"""headroom_v2's later stages (fit, mergemix, register, target, report) on synthetic tables with
known answers: no training; the ``dm`` calls that would train or fit for minutes are intercepted,
and one module-scoped fixture runs the real ``evaluate``/``fit``/``optimize`` on a tiny ladder with
regmix_linear to prove the stage's flags."""

from __future__ import annotations

import csv
import json
import shutil

import numpy as np
import pytest

from data_mixture.decisions import holm
from experiments.studies import headroom_v2_setting as study
from experiments.studies import does_the_mixture_matter_with_headroom as v1
from experiments.studies import headroom_v2_picks as picks
from experiments.studies import headroom_v2_report as report

DOMAINS = study.DOMAINS
OPT = np.array([0.3, 0.1, 0.5, 0.1])  # the synthetic ladder's best mixture (code, prose, math, knowledge)


def _loss(w, n: float) -> dict[str, float]:
    """Per-domain losses of a mixture at size n: each domain's loss falls with its own weight; the
    target (math 0.6, code 0.4) is lowest near OPT."""
    w = np.asarray(w, np.float64)
    size = 0.2 * np.log(6e5 / n)
    base = {"code": 2.0 + 0.9 * (w[0] - OPT[0]) ** 2 - 0.3 * w[0], "math": 1.5 + 1.2 * (w[2] - OPT[2]) ** 2 - 0.2 * w[2]}
    return {"code": base["code"] + size, "prose": 3.0 - 0.5 * w[1] + size, "math": base["math"] + size,
            "knowledge": 3.2 - 0.4 * w[3] + size}


def _write(path, rows):
    fields = list(dict.fromkeys(k for r in rows for k in r))
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    return path


def _ladder_rows():
    rows = []
    for run in study.ladder_plan()["runs"]:
        w = [run["mixture"][d] for d in DOMAINS]
        for frac in (0.5, 1.0):
            loss = _loss(w, run["params_active"])
            row = {"run": run["name"], "params_total": run["params_total"], "params_active": run["params_active"],
                   "tokens": run["tokens"] * frac, "seed": run["seed"], "started_at": "2026-12-06T05:00:00+00:00",
                   "unique:math": study.POOL_TOKENS,
                   **{f"mix:{d}": v for d, v in run["mixture"].items()},
                   **{f"loss:{d}": v + (1 - frac) + 0.003 * run["seed"] for d, v in loss.items()},
                   **{f"loss_se:{d}": 0.004 for d in DOMAINS}}
            rows.append(row)
    return rows


def _out(tmp_path, passed=True):
    out = tmp_path / "out"
    (out / "gate").mkdir(parents=True)
    (out / "gate" / "gate.json").write_text(json.dumps({"passed": passed}))
    shutil.copyfile(study.OUT / "design.json", out / "design.json")
    _write(out / "ladder_runs.csv", _ladder_rows())
    return out


@pytest.fixture(autouse=True)
def _no_design_check(monkeypatch):
    monkeypatch.setattr(study, "registered", lambda out: {})


# ---- the real commands on a tiny ladder (one law) ----

@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """stage_fit with LAWS = (regmix_linear,): evaluate, fit and optimize run for real, in process;
    recommend's arguments are recorded (it fits every law) and its mixture written by hand."""
    from data_mixture.__main__ import main as dm_main

    out = _out(tmp_path_factory.mktemp("fit"))
    calls = []

    def fake_dm(*args):
        calls.append(args)
        if args[0] == "recommend":
            dest = out / "recommend"
            dest.mkdir()
            (dest / "mixture.json").write_text(json.dumps(
                {"weights": {"code": 0.5, "prose": 0.0, "math": 0.3331, "knowledge": 0.1669},
                 "source": "target_capped_16 (practitioner rule)"}))
            return
        assert dm_main(list(args)) == 0, args

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(study, "registered", lambda out: {})
        mp.setattr(picks, "LAWS", ("regmix_linear",))
        mp.setattr(picks, "dm", fake_dm)
        picks.stage_fit(out, out / "runs", 1)
    return out, calls


def test_fit_runs_evaluate_fit_and_a_robust_capped_optimize_with_real_flags(fitted):
    out, calls = fitted
    assert [c[0] for c in calls] == ["evaluate", "fit", "optimize", "recommend"]
    laws = json.loads((out / "evaluate_ladder" / "evaluation.json").read_text())["laws"]
    assert laws["regmix_linear"]["decision"]["accuracy"] is not None
    fit = json.loads((out / "fits" / "regmix_linear.json").read_text())
    assert fit["law"] == "regmix_linear"
    opt = json.loads((out / "optima" / "regmix_linear.json").read_text())
    size, tokens = picks.target_point()
    assert opt["robust"] and sum(opt["weights"].values()) == pytest.approx(1.0)
    assert opt["weights"]["math"] * tokens <= 16 * study.POOL_TOKENS * (1 + 1e-6)  # the 16-epoch cap on the pool
    assert "--max-epochs" in calls[2] and calls[2][calls[2].index("--max-epochs") + 1] == "math=16"
    assert calls[1][calls[1].index("--bootstrap") + 1] == "50"


def test_recommend_is_called_with_exactly_the_registered_options(fitted):
    out, calls = fitted
    text = json.loads((study.OUT / "design.json").read_text())["candidates"]["recommend"]
    size, tokens = picks.target_point()
    text = text.split(": its recommended")[0].removeprefix("data_mixture recommend ")
    text = text.replace("<ladder runs.csv>", str(out / "ladder_runs.csv")).replace("<s2 params_active>", repr(size))
    registered = text.replace("<s2 tokens>", repr(tokens)).split()
    got = list(calls[3][1:])
    assert got[:len(registered)] == registered
    assert got[len(registered):] == ["--out", str(out / "recommend"), "--no-progress", "--force"]
    assert tokens == study.run_entry("x", "s2", 0, {})["tokens"] and size == 600480.0
    from data_mixture.__main__ import build_parser

    args = build_parser().parse_args(list(calls[3]))
    assert (args.bootstrap, args.max_epochs, args.robust, args.starts, args.resamples) == (50, 16.0, "mean", 16, 1000)


def test_the_registered_predictions_come_from_the_stage_s_fits_at_the_target_point(fitted):
    out, _ = fitted
    mix = {"uniform": {d: 0.25 for d in DOMAINS}, "mathy": {"code": 0.3, "prose": 0.1, "math": 0.5, "knowledge": 0.1}}
    pred = v1.law_predictions(out, {"target_unique": {"math": study.POOL_TOKENS}}, mix, laws=("regmix_linear",),
                              point=picks.target_point())
    assert set(pred["regmix_linear"]) == set(mix) and all(np.isfinite(v) for v in pred["regmix_linear"].values())
    assert pred["regmix_linear"]["mathy"] < pred["regmix_linear"]["uniform"]  # the synthetic optimum is near mathy


def test_mergemix_continues_the_gate_s_s1_uniform_seed_20_run_with_the_registered_search(tmp_path, monkeypatch):
    from data_mixture.__main__ import build_parser

    out = _out(tmp_path)
    swept, calls = [], []
    monkeypatch.setattr(v1, "sweep", lambda sub, root, parallel, eval_args: swept.append(
        (json.loads(sub.read_text())["runs"], root, eval_args)))
    monkeypatch.setattr(picks, "dm", lambda *a: calls.append(a))
    picks.stage_mergemix(out, tmp_path / "runs", 2)
    (run,), root, eval_args = swept[0]
    assert run == next(r for r in study.gate_plan()["runs"] if r["name"] == "s1_uniform_s20")
    assert root == tmp_path / "runs" / "gate" and eval_args == study.EVAL_ARGS
    args = build_parser().parse_args(list(calls[0]))  # every flag is mergemix's
    assert args.base == str(tmp_path / "runs" / "gate" / "s1_uniform_s20")
    assert (args.budget, args.loss_batches, args.fractions, args.search, args.parallel) == (60, 16, "1", "mergemix", 2)
    assert args.loss_weights == ["math=0.6,code=0.4"] and args.task_weights is None
    assert float(args.expert_tokens) == pytest.approx(0.1 * run["tokens"])


def test_log_linear_applies_to_the_multi_size_ladder(tmp_path):
    from data_mixture.recommendation import supported_laws
    from data_mixture.table import read_runs
    from data_mixture.target import parse_target

    table = parse_target(study.TARGET).apply(read_runs(str(_out(tmp_path) / "ladder_runs.csv")).law_rows())
    assert len(np.unique(table.params_active)) == 3
    ok, skipped = supported_laws(table, table.loss_domains[0], "params_active", picks.LAWS)
    assert "log_linear" in ok and "log_linear" in picks.LAWS, skipped


# ---- the candidates, the dedup, the registration ----

def _picks_files(out, acc):
    ev = out / "evaluate_ladder"
    ev.mkdir(exist_ok=True)
    (ev / "evaluation.json").write_text(json.dumps({"laws": {k: {"decision": {"accuracy": a}, "mean": {"mae": 0.01}}
                                                             for k, a in acc.items()}}))
    (out / "optima").mkdir(exist_ok=True)
    for i, law in enumerate(acc):
        w = np.roll([0.4, 0.3, 0.2, 0.1], i)
        (out / "optima" / f"{law}.json").write_text(json.dumps({"weights": dict(zip(DOMAINS, w.tolist()))}))
    (out / "recommend").mkdir(exist_ok=True)
    (out / "recommend" / "mixture.json").write_text(json.dumps({"weights": {"code": 0.4, "prose": 0.3, "math": 0.2,
                                                                            "knowledge": 0.1},
                                                                "source": "camel (robust pick)"}))
    (out / "mergemix" / "search_loss").mkdir(parents=True, exist_ok=True)
    (out / "mergemix" / "search_loss" / "summary.json").write_text(json.dumps(
        {"mixture": {"code": 0.25, "prose": 0.25, "math": 0.25, "knowledge": 0.25}, "flops": {"total": 1e12}}))


@pytest.fixture
def pools(monkeypatch):
    import data_mixture.optimize as opt

    monkeypatch.setattr(opt, "available_tokens", lambda **kw: {"code": 4e6, "prose": 5e6, "math": 1e6, "knowledge": 2e6})


def test_candidates_follow_the_registered_rules(tmp_path, pools):
    out = _out(tmp_path)
    _picks_files(out, {"camel": 0.99, "camel+repfit": 0.98, "regmix": 0.80, "log_linear": 0.85, "additive": 0.85})
    got = picks.candidates(out)
    assert tuple(got) == tuple(study.CANDIDATES)
    # best_at_proxy: the s1 ladder mixture (2 seeds) with the lowest mean target loss, known from _loss
    plan = [r for r in study.ladder_plan()["runs"] if r["preset"] == "s1" and r["seed"] == 0]
    target = [0.4 * _loss([r["mixture"][d] for d in DOMAINS], r["params_active"])["code"]
              + 0.6 * _loss([r["mixture"][d] for d in DOMAINS], r["params_active"])["math"] for r in plan]
    assert got["best_at_proxy"]["weights"] == plan[int(np.argmin(target))]["mixture"]
    derived = json.loads((study.OUT / "design.json").read_text())["derived"]
    tc = [round(got["target_capped_16"]["weights"][d], 4) for d in DOMAINS]
    assert tc == derived["target_capped_16 (code, prose, math, knowledge)"]["s2"]
    _, tokens = picks.target_point()
    assert got["proxy_capped_16"]["weights"]["math"] * tokens <= 16 * study.POOL_TOKENS * (1 + 1e-9)
    assert got["proportional"]["weights"]["math"] == pytest.approx(3e5 / (4e6 + 5e6 + 3e5 + 2e6))
    assert sum(got["unimax"]["weights"].values()) == pytest.approx(1.0)
    # CAMEL and its variants never count as "the other law"; a tie in accuracy goes to the lower MAE (equal: first)
    assert got["best_other_law_robust"]["law"] == "log_linear"
    assert got["repetition_law"]["weights"] == json.loads((out / "optima" / "camel+repfit.json").read_text())["weights"]


def test_dedup_shares_runs_within_001_total_variation_and_keeps_every_name():
    u = {d: 0.25 for d in DOMAINS}
    near = {"code": 0.26, "prose": 0.24, "math": 0.25, "knowledge": 0.25}  # TV 0.01
    far = {"code": 0.27, "prose": 0.23, "math": 0.25, "knowledge": 0.25}  # TV 0.02
    assert picks.total_variation(u, near) == pytest.approx(0.01)
    got = picks.dedup({"uniform": u, "a": near, "b": far, "c": dict(far)})
    assert got == {"uniform": "uniform", "a": "uniform", "b": "b", "c": "b"}


def test_the_registered_families_are_the_designs():
    fam = picks.comparisons()
    assert fam["primary"] == [list(p) for p in study.DECISION["primary_family"]]
    assert len(fam["secondary"]) == 5 * 6 - 4 + 2
    assert ["recommend", "target_capped_16"] not in fam["secondary"] and ["mergemix", "unimax"] in fam["secondary"]
    assert fam["secondary"][-2:] == [["camel_robust", "best_other_law_robust"], ["camel_robust", "repetition_law"]]


def test_register_writes_shared_mixtures_predictions_and_the_families(tmp_path, pools, monkeypatch):
    out = _out(tmp_path)
    _picks_files(out, {"camel": 0.9, "camel+repfit": 0.9, "regmix": 0.8})
    monkeypatch.setattr(v1, "law_predictions", lambda o, a, mix, laws, point: {"camel": {n: 1.0 for n in mix}})
    calls = []
    monkeypatch.setattr(picks, "dm", lambda *a: calls.append(a))
    (out / "fits").mkdir()
    for law in picks.LAWS[1:]:
        (out / "fits" / f"{law}.json").write_text("{}")
    with pytest.raises(SystemExit, match="fits of mixing_law missing"):  # regmix's forest is not committed
        picks.stage_register(out, out / "runs", 1)
    (out / "fits" / "mixing_law.json").write_text("{}")
    picks.stage_register(out, out / "runs", 1)
    cands = json.loads((out / "candidates.json").read_text())
    assert cands["mergemix"]["shares_runs_with"] == "uniform"  # the same mixture: one set of target runs
    assert cands["camel_robust"]["shares_runs_with"] == "recommend"  # _picks_files gives camel recommend's pick
    trained = json.loads((out / "candidate_mixtures.json").read_text())
    assert trained["mergemix"] == trained["uniform"] and len(trained) == 11
    from data_mixture.__main__ import build_parser

    args = build_parser().parse_args(list(calls[0]))  # every flag is register's
    assert (args.metric, args.size_column, args.size) == (study.TARGET, "params_active", picks.target_point()[0])
    assert args.comparisons == str(out / "comparison_pairs.json") and "Holm" in args.rule
    assert json.loads((out / "comparison_pairs.json").read_text())[:4] == picks.comparisons()["primary"]


def test_the_register_command_registers_the_given_comparisons(tmp_path):
    from data_mixture.__main__ import main as dm_main

    (tmp_path / "c.json").write_text(json.dumps({"a": {"x": 1.0, "y": 0.0}, "b": {"x": 0.5, "y": 0.5},
                                                 "c": {"x": 0.0, "y": 1.0}}))
    (tmp_path / "p.json").write_text(json.dumps([["a", "b"]]))
    assert dm_main(["register", "--rule", "r", "--candidates", str(tmp_path / "c.json"), "--comparisons",
                    str(tmp_path / "p.json"), "--out", str(tmp_path / "reg.json")]) == 0
    assert json.loads((tmp_path / "reg.json").read_text())["comparisons"] == [["a", "b"]]
    (tmp_path / "p.json").write_text(json.dumps([["a", "zz"]]))
    with pytest.raises(SystemExit) as bad:  # the command's exit status for bad input
        dm_main(["register", "--rule", "r", "--candidates", str(tmp_path / "c.json"), "--comparisons",
                 str(tmp_path / "p.json"), "--out", str(tmp_path / "reg2.json")])
    assert bad.value.code == 2 and not (tmp_path / "reg2.json").exists()


# ---- refusals ----

def test_every_later_stage_refuses_without_a_passing_gate(tmp_path):
    out = _out(tmp_path, passed=False)
    for stage in (picks.stage_fit, picks.stage_mergemix, picks.stage_register, report.stage_target):
        with pytest.raises(SystemExit, match="the gate has not passed"):
            stage(out, out / "runs", 1)


def test_target_refuses_an_uncommitted_registration(tmp_path):
    out = _out(tmp_path)
    (out / "registration.json").write_text("{}")  # tmp_path is no git checkout: never committed
    with pytest.raises(SystemExit, match="not committed"):
        report.stage_target(out, out / "runs", 1)


# ---- the target plan and the report ----

def _registered(out, mixtures, shares=None, at="2026-12-06T07:00:00+00:00"):
    from data_mixture.register import register, write

    shares = shares or {}
    cands = {n: {"weights": w, "shares_runs_with": shares.get(n)} for n, w in mixtures.items()}
    (out / "candidates.json").write_text(json.dumps(cands))
    trained = {n: mixtures[shares.get(n) or n] for n in mixtures}
    fam = picks.comparisons()
    (out / "comparisons.json").write_text(json.dumps(fam))
    reg = register({"rule": picks.decision_rule(), "metric": study.TARGET}, trained,
                   predictions={"camel": {n: 2.0 + 0.01 * i for i, n in enumerate(trained)}},
                   comparisons=fam["primary"] + fam["secondary"],
                   target={"size_column": "params_active", "size": picks.target_point()[0]},
                   code_version={"commit": "x", "dirty": False}, registered_at=at)
    write(reg, out / "registration.json")
    return reg


def _mixtures():
    names = list(study.CANDIDATES)
    rng = np.random.default_rng(0)
    return {n: dict(zip(DOMAINS, rng.dirichlet(np.ones(4)).tolist())) for n in names}


def test_the_target_plan_runs_each_distinct_candidate_with_3_seeds_in_chunks_of_2(tmp_path, monkeypatch):
    out = _out(tmp_path)
    mix = _mixtures()
    _registered(out, mix, shares={"recommend": "target_capped_16"})
    plan = report.target_plan(out)
    names = [r["name"] for r in plan["runs"]]
    assert len(names) == 10 * 3 and "s2_recommend_s0" not in names
    assert names[:3] == ["s2_uniform_s0", "s2_uniform_s1", "s2_uniform_s2"]
    for r in plan["runs"]:
        o = r["overrides"]
        assert (o["train.eval_batches"], o["train.eval_windows"], o["data.unique_tokens"]) == (16, "sampled", "math=300000")
        assert r["preset"] == "s2" and o["train.steps"] == 3518 and o["train.seed"] == r["seed"]
    assert plan["runs"][3]["mixture"] == pytest.approx(mix["proportional"])
    monkeypatch.setattr(v1, "committed", lambda path: True)
    swept = []

    def fake_sweep(sub, root, parallel, eval_args):
        runs = json.loads(sub.read_text())["runs"]
        swept.append([r["name"] for r in runs])
        root.mkdir(parents=True, exist_ok=True)
        _write(root / "runs.csv", [{"run": r["name"], "params_total": 1, "params_active": 1, "tokens": 1,
                                    **{f"mix:{d}": v for d, v in r["mixture"].items()}, "loss:code": 1} for r in runs])
        (root / "sweep.log").write_text("")

    monkeypatch.setattr(v1, "sweep", fake_sweep)
    merged = report.stage_target(out, tmp_path / "runs", 1)
    assert [len(s) for s in swept] == [2] * 15 and sorted((out / "target").glob("*.csv"))[-1].name == "14.csv"
    assert len(list(csv.DictReader(merged.open()))) == 30
    (out / "target" / "plan.json").write_text(json.dumps({**plan, "runs": plan["runs"][:3]}))
    with pytest.raises(SystemExit, match="never edited"):
        report.stage_target(out, tmp_path / "runs", 1)
    reg = json.loads((out / "registration.json").read_text())
    reg["candidates"]["uniform"] = {"code": 1.0}
    (out / "registration.json").write_text(json.dumps(reg))
    with pytest.raises(SystemExit, match="no longer matches its sha256"):
        report.stage_target(out, tmp_path / "runs", 1)


def _target_table(out, mix, shares, gap, noise):
    """Final (and mid) rows of every distinct candidate's runs: uniform 2.0, recommend 2.0 + gap,
    the others 2.0 + 0.05 x their index; per-seed ``noise`` on recommend, +-0.002 on every run."""
    rows = []
    n, _ = picks.target_point()
    for i, name in enumerate(mix):
        if shares.get(name):
            continue
        for s in study.TARGET_SEEDS:
            base = 2.0 + 0.05 * i + 0.002 * ((i + s) % 3 - 1) + ((gap - 0.05 * i + noise[s]) if name == "recommend" else 0.0)
            for frac in (0.5, 1.0):
                rows.append({"run": report.run_name(name, s), "params_total": n, "params_active": n, "tokens": 1e7 * frac,
                             "seed": s, "started_at": "2026-12-06T08:00:00+00:00",
                             **{f"mix:{d}": v for d, v in mix[name].items()},
                             **{f"loss:{d}": base + (1 - frac) for d in DOMAINS},
                             **{f"loss_se:{d}": 0.003 for d in DOMAINS}})
    _write(out / "target_runs.csv", rows)


@pytest.mark.parametrize("gap, noise, verdict, opening", [
    (-0.2, [0.0, 0.004, -0.004], "beats", "Yes: recommend's pick beats"),
    (0.0, [0.0, 0.05, -0.05], "ties", "No: recommend's pick does not beat"),
    (0.3, [0.0, 0.004, -0.004], "loses", "No: recommend's pick loses to"),
])
def test_the_report_decides_with_holm_and_answers_plainly(tmp_path, gap, noise, verdict, opening):
    out = _out(tmp_path)
    mix = _mixtures()
    _registered(out, mix)
    _target_table(out, mix, {}, gap, noise)
    data = report.report_data(out)
    row = data["comparisons"]["primary"][0]
    assert (row["a"], row["b"]) == ("recommend", "target_capped_16") and row["verdict"] == verdict
    assert data["answer"].startswith(opening) and "11.9x" in data["answer"]
    assert data["pre_registered"], data["why_not"]
    p = [r["p"] for r in data["comparisons"]["primary"]]
    assert [r["p_holm"] for r in data["comparisons"]["primary"]] == pytest.approx(holm(p))
    assert row["lo"] < row["diff"] < row["hi"]
    assert data["cells"]["recommend"]["eval_se"] == pytest.approx(np.sqrt(0.6 ** 2 + 0.4 ** 2) * 0.003)
    md = report.report_md(data)
    assert data["answer"] in md and "| recommend vs target_capped_16 |" in md and "eval se" in md
    assert f"| recommend vs target_capped_16 | {row['diff']:+.4f} [" in md and "## Candidates" in md
    assert data["detectable"]["detectable"] > 0


def test_a_registration_after_the_runs_is_not_pre_registered_and_shared_runs_tie_by_construction(tmp_path):
    out = _out(tmp_path)
    mix = _mixtures()
    shares = {"recommend": "target_capped_16"}
    _registered(out, mix, shares=shares, at="2026-12-06T09:00:00+00:00")
    _target_table(out, mix, shares, 0.0, [0.0, 0.0, 0.0])
    data = report.report_data(out)
    row = data["comparisons"]["primary"][0]
    assert row["same_runs"] and row["p"] == 1.0 and row["verdict"] == "ties"
    assert "same target runs" in data["answer"]
    assert not data["pre_registered"] and "started before the registration" in data["why_not"][0]


def test_holm_matches_the_textbook_example():
    # Holm (1979) as Wikipedia's worked example: p = 0.01, 0.04, 0.03, 0.005 at alpha 0.05 rejects H1 and H4 only
    adj = holm([0.01, 0.04, 0.03, 0.005])
    assert adj == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert [a < 0.05 for a in adj] == [True, False, False, True]
    assert holm([0.5, 0.9]) == [1.0, 1.0] and holm([0.02, 0.04]) == pytest.approx([0.04, 0.04]) and holm([]) == []
    with pytest.raises(ValueError, match="p-values"):
        holm([0.1, float("nan")])


def test_the_committed_report_rebuilds_from_the_committed_files():
    """A failed gate's report from gate.json, a finished study's from report.json."""
    gate = json.loads((study.OUT / "gate" / "gate.json").read_text())
    path = study.OUT / "report.md"
    if not gate["passed"]:
        assert path.read_text() == study.stopped_report_md(gate)
        return
    if not path.exists():
        pytest.skip("the gate passed and the study has no report yet (its target runs are not committed)")
    assert report.report_md(report.report_data(study.OUT)) == path.read_text()


def test_register_target_and_report_end_to_end_with_the_real_commands(fitted, tmp_path, pools, monkeypatch):
    """After the fixture's real fit: register (real command, --comparisons), the target plan swept
    by a stand-in that writes the runs' table, and report with the real evaluate --registration."""
    import datetime as dt

    from data_mixture.__main__ import main as dm_main

    out = tmp_path / "out"
    shutil.copytree(fitted[0], out)
    for law in ("camel", "camel+repfit"):  # the fixture fitted regmix_linear only
        shutil.copyfile(out / "optima" / "regmix_linear.json", out / "optima" / f"{law}.json")
    (out / "mergemix" / "search_loss").mkdir(parents=True)
    (out / "mergemix" / "search_loss" / "summary.json").write_text(json.dumps(
        {"mixture": {"code": 0.3, "prose": 0.2, "math": 0.3, "knowledge": 0.2}, "flops": {"total": 5e12}}))
    real = lambda *args: dm_main(list(args))  # noqa: E731
    monkeypatch.setattr(picks, "LAWS", ("regmix_linear",))
    monkeypatch.setattr(picks, "dm", real)
    monkeypatch.setattr(report, "dm", real)
    picks.stage_register(out, tmp_path / "runs", 1)
    reg = json.loads((out / "registration.json").read_text())
    assert len(reg["comparisons"]) == 4 + 28 and set(reg["predictions"]) == {"regmix_linear"}
    later = (dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=1)).isoformat(timespec="seconds")
    rng = np.random.default_rng(1)

    def fake_sweep(sub, root, parallel, eval_args):
        rows = []
        for r in json.loads(sub.read_text())["runs"]:
            loss = _loss([r["mixture"][d] for d in DOMAINS], r["params_active"])
            jitter = rng.normal(0, 0.01)
            rows += [{"run": r["name"], "params_total": r["params_total"], "params_active": r["params_active"],
                      "tokens": r["tokens"] * frac, "seed": r["seed"], "started_at": later, "unique:math": study.POOL_TOKENS,
                      **{f"mix:{d}": v for d, v in r["mixture"].items()},
                      **{f"loss:{d}": v + jitter + (1 - frac) for d, v in loss.items()},
                      **{f"loss_se:{d}": 0.004 for d in DOMAINS}} for frac in (0.5, 1.0)]
        root.mkdir(parents=True, exist_ok=True)
        _write(root / "runs.csv", rows)
        (root / "sweep.log").write_text("")

    monkeypatch.setattr(v1, "committed", lambda path: True)
    monkeypatch.setattr(v1, "sweep", fake_sweep)
    (out / "target_runs.csv").write_bytes(report.stage_target(out, tmp_path / "runs", 1).read_bytes())
    data = report.stage_report(out, tmp_path / "runs", 1)
    assert data["pre_registered"], data["why_not"]
    assert json.loads((out / "evaluate_target" / "evaluation.json").read_text())["registration"]["pre_registered"]
    row = data["comparisons"]["primary"][0]
    assert row["verdict"] in ("beats", "ties", "loses") and data["answer"].split(":")[0] in ("Yes", "No")
    assert (out / "report.md").read_text() == report.report_md(json.loads((out / "report.json").read_text()))


def test_a_partial_family_is_corrected_as_the_whole_registered_family():
    """A comparison not yet run counts as p = 1 in Holm: the one that ran is adjusted for 2, not 1."""
    cell = {"a": {"values": [(0, 1.0), (1, 1.1), (2, 1.3)], "runs_of": "a"},
            "b": {"values": [(0, 1.2), (1, 1.4), (2, 1.5)], "runs_of": "b"},
            "c": {"values": [(0, 1.0)], "runs_of": "c"}}
    rows = report.decide({"primary": [["a", "b"], ["a", "c"]]}, cell)["primary"]
    assert rows[1]["verdict"] == "not run"
    assert rows[0]["p_holm"] == pytest.approx(min(1.0, 2 * rows[0]["p"]))
