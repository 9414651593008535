"""The headroom study's gate: computed from a runs table, reproduced from the committed attempts."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from experiments.studies import does_the_mixture_matter_with_headroom as study

RESULTS = Path(__file__).resolve().parents[1] / "experiments" / "studies" / "results" / "headroom_v1"


def write_table(path: Path, plan: dict, loss: dict[str, float]) -> None:
    """A runs table of ``plan``'s runs, one final checkpoint each, target loss from ``loss`` (run name ->)."""
    domains = study.DOMAINS
    cols = ["run", "params_total", "params_active", "tokens", "flops", *[f"mix:{d}" for d in domains],
            *[f"loss:{d}" for d in domains], f"loss:{study.TARGET_SET}", "seed"]
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cols)
        for r in plan["runs"]:
            if r["name"] in loss:
                w.writerow([r["name"], r["params_total"], r["params_active"], r["tokens"], r["flops"],
                            *[r["mixture"][d] for d in domains], *[2.0] * len(domains), loss[r["name"]], r["seed"]])


def hand_losses(plan: dict, best: dict[str, str], gain: float, noise: float) -> dict[str, float]:
    """Uniform at 3.0, ``best[size]`` ``gain`` below it, the others 0.5 above; seeds +-``noise``."""
    out = {}
    for r in plan["runs"]:
        size, mix = r["preset"], r["name"][len(r["preset"]) + 1:].rsplit("_s", 1)[0]
        base = 3.0 - gain if mix == best[size] else 3.0 if mix == "uniform" else 3.5
        out[r["name"]] = base + (noise if r["seed"] % 2 else -noise)
    return out


def test_gate_passes_only_with_headroom_at_both_sizes_and_a_moving_optimum(tmp_path):
    plan = study.pilot_plan(1)
    small, large = plan["gate"]["sizes"]
    moving = {small: "prose_math", large: "knowledge_heavy"}
    # seeds at +-0.01: each cell's sd is 0.01 * sqrt(2), so the per-pair sd is 0.0141; a gain of 0.1 is 7.1 sd
    write_table(tmp_path / "runs.csv", plan, hand_losses(plan, moving, gain=0.1, noise=0.01))
    g = study.gate(tmp_path / "runs.csv", plan)
    assert g["passed"] and g["complete"] and g["best_moves"]
    row = g["sizes"][large]
    assert row["best"] == "knowledge_heavy" and row["gain"] == pytest.approx(0.1)
    assert row["sd_pair"] == pytest.approx(0.01 * 2 ** 0.5) and row["gain_in_sd"] == pytest.approx(0.1 / (0.01 * 2 ** 0.5))
    # the same best mixture at both sizes: no moving optimum, the gate fails
    write_table(tmp_path / "runs.csv", plan, hand_losses(plan, {small: "prose_math", large: "prose_math"}, 0.1, 0.01))
    g = study.gate(tmp_path / "runs.csv", plan)
    assert not g["passed"] and g["headroom_at_every_size"] and not g["best_moves"]
    # a gain of 0.05 at seed noise 0.01 is 3.5 per-pair sd: below the gate's 4
    write_table(tmp_path / "runs.csv", plan, hand_losses(plan, moving, gain=0.05, noise=0.01))
    g = study.gate(tmp_path / "runs.csv", plan)
    assert g["sizes"][small]["gain_in_sd"] == pytest.approx(3.54, abs=0.01) and not g["headroom_at_every_size"]
    assert not g["passed"] and "**FAIL**" in study.gate_md(plan, g)


def test_gate_with_missing_runs_is_incomplete(tmp_path):
    plan = study.pilot_plan(1)
    losses = hand_losses(plan, {s: "prose_math" for s in plan["gate"]["sizes"]}, 0.1, 0.01)
    losses.pop(next(iter(losses)))  # one seed of one cell never finished
    write_table(tmp_path / "runs.csv", plan, losses)
    g = study.gate(tmp_path / "runs.csv", plan)
    assert not g["complete"] and not g["passed"] and "INCOMPLETE" in study.gate_md(plan, g)


def test_committed_plans_are_the_study_s_attempts():
    for k in study.ATTEMPTS:
        path = RESULTS / "pilot" / f"attempt{k}" / "plan.json"
        assert json.loads(path.read_text()) == json.loads(json.dumps(study.pilot_plan(k)))


@pytest.mark.parametrize("attempt", sorted(study.ATTEMPTS))
def test_committed_gate_reproduces_from_the_committed_runs_table(attempt):
    d = RESULTS / "pilot" / f"attempt{attempt}"
    if not (d / "gate.json").exists():
        pytest.skip(f"gate attempt {attempt} has not run yet (no gate.json)")
    plan = json.loads((d / "plan.json").read_text())
    g = study.gate(d / "runs.csv", plan)
    assert json.loads(json.dumps(g)) == json.loads((d / "gate.json").read_text())
    assert study.gate_md(plan, g) == (d / "gate.md").read_text()


def test_committed_report_rebuilds_from_the_committed_results():
    if not (RESULTS / "report.md").exists():
        pytest.skip("no report.md committed yet")
    md = study.report_md(RESULTS)
    assert md == (RESULTS / "report.md").read_text()
    assert "## Gate attempts" in md and "## Limits" in md


def test_sweeps_run_in_committed_chunks_and_skip_the_chunks_already_there(tmp_path, monkeypatch):
    """Each chunk's runs table (and its part of the sweep log) lands in out/<name>/ as it finishes;
    a rerun, even on another machine (no run directories), sweeps only the missing chunks."""
    plan = {"version": 1, "runs": [{"name": f"r{i}", "x": i, "seed": i % 2} for i in range(5)]}
    plan["runs"][4]["seed"] = 0
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    swept = []

    def fake_sweep(sub: Path, root: Path, parallel: int, eval_args: str) -> None:
        assert eval_args == study.EVAL_ARGS
        runs = json.loads(sub.read_text())["runs"]
        swept.append([r["name"] for r in runs])
        root.mkdir(parents=True, exist_ok=True)
        extra = ["epochs:knowledge"] if runs[0]["x"] >= 4 else []  # a later chunk with one more column
        seeded = len({r["seed"] for r in runs}) > 1  # collect writes a seed column only when seeds differ
        with (root / "runs.csv").open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["run", "loss:code", *extra, *["seed"] * seeded])
            w.writerows([[r["name"], r["x"] / 10, *[1.5] * len(extra), *[r["seed"]] * seeded] for r in runs])
        with (root / "sweep.log").open("a") as f:
            f.writelines(f"sweep: {r['name']}: done in 7 s\n" for r in runs)

    monkeypatch.setattr(study, "sweep", fake_sweep)
    out, root = tmp_path / "out", tmp_path / "runs"
    merged = study.sweep_in_chunks(tmp_path / "plan.json", root, out, "ladder", 2, chunk=2)
    assert swept == [["r0", "r1"], ["r2", "r3"], ["r4"]]
    assert sorted(p.name for p in (out / "ladder").iterdir()) == ["00.csv", "00.log", "01.csv", "01.log", "02.csv", "02.log"]
    assert (out / "ladder" / "01.log").read_text() == "sweep: r2: done in 7 s\nsweep: r3: done in 7 s\n"
    with merged.open() as f:
        rows = list(csv.DictReader(f))
    assert [r["run"] for r in rows] == ["r0", "r1", "r2", "r3", "r4"]
    assert rows[0]["epochs:knowledge"] == "" and rows[4]["epochs:knowledge"] == "1.5"
    assert [r["seed"] for r in rows] == ["0", "1", "0", "1", "0"]  # the last chunk's seed is the plan's
    (out / "ladder" / "01.csv").unlink()
    import shutil

    shutil.rmtree(root)  # another machine: no run directories, the committed chunks only
    study.sweep_in_chunks(tmp_path / "plan.json", root, out, "ladder", 2, chunk=2)
    assert swept[3:] == [["r2", "r3"]]


def test_smallest_detectable_difference_is_the_paired_half_width(tmp_path):
    from scipy import stats

    from data_mixture.table import read_runs

    plan = study.pilot_plan(3)
    loss = {r["name"]: 3.0 + {"uniform": 0.0, "even": -0.1, "knowledge_heavy": 0.2, "prose_heavy": 0.3}[
        r["name"].split("_", 1)[1].rsplit("_s", 1)[0]] + [0.0, 0.01, 0.03][r["seed"]] * (r["name"].count("even") + 1)
            for r in plan["runs"] if r["preset"] == "s1b"}
    write_table(tmp_path / "runs.csv", plan, loss)
    h = study.paired_half_widths(read_runs(str(tmp_path / "runs.csv")), study.sizes()["s1b"]["params_active"],
                                 study.TARGET_SET)
    assert len(h) == 6  # every pair of the 4 mixtures
    d = [0.0, 0.01, 0.03]  # even's seeds move twice as much: its pairs' differences have these deviations
    expected = stats.t.ppf(0.975, 2) * float(__import__("numpy").std(d, ddof=1)) / 3 ** 0.5
    assert sorted(h)[-1] == pytest.approx(expected) and sorted(h)[0] == pytest.approx(0.0, abs=1e-12)


def test_ladder_replicates_are_one_mixture_with_the_table_s_seeds(tmp_path):
    """The ladder names its second seed ``s1b_m0_s1`` beside ``s1b_m0`` (seed 0): one mixture, two
    seeds, paired by the table's seed column."""
    from data_mixture.table import read_runs

    plan = json.loads((RESULTS / "plan.json").read_text())
    loss = {r["name"]: 3.0 + 0.01 * int(r["name"].split("_m")[1].split("_")[0]) + 0.02 * r["seed"]
            for r in plan["runs"] if r["preset"] == "s1b"}
    write_table(tmp_path / "runs.csv", plan, loss)
    table = read_runs(str(tmp_path / "runs.csv"))
    weights, cells = study.final_cells(table, study.sizes()["s1b"]["params_active"], study.TARGET_SET)
    assert len(cells) == study.MIXTURES and cells["s1b_m3"] == [(0, pytest.approx(3.03)), (1, pytest.approx(3.05))]
    h = study.paired_half_widths(table, study.sizes()["s1b"]["params_active"], study.TARGET_SET)
    assert len(h) == study.MIXTURES * (study.MIXTURES - 1) // 2 and max(h) == pytest.approx(0.0, abs=1e-9)


def test_mergemix_searches_the_target_losses_and_the_continuous_benchmark_score():
    objectives = study.mergemix_objectives(study.ENCYCLOPEDIA)
    assert objectives == {"loss": ["--loss-weights", "knowledge=0.5,prose=0.5"],
                          "benchmark": ["--bench-metric", "gold_logprob"]}
    assert study.target_score({"loss:knowledge": 1.0, "loss:prose": 3.0, "loss:code": 9.0}, study.ENCYCLOPEDIA) == 2.0


def test_a_size_can_train_longer_than_the_study_s_budget(monkeypatch):
    """``tokens_per_param_at`` trains the named sizes for their own tokens per parameter (the gate's
    runs and the epochs of the fixed pool follow); the others keep the study's."""
    a = {**study.ATTEMPTS[3], "tokens_per_param_at": {"s0": 40.0}}
    monkeypatch.setitem(study.ATTEMPTS, 99, a)
    plan = study.pilot_plan(99)
    steps = {r["preset"]: r["steps"] for r in plan["runs"]}
    assert steps == {"s0": study.tokens_of("s0", 40.0)[0], "s1b": study.tokens_of("s1b", 20.0)[0]}
    assert plan["epochs_by_size"]["s0"]["uniform"] == pytest.approx(0.25 * study.tokens_of("s0", 40.0)[1] / 250_000)
    assert study.target_point(a)[1] == study.tokens_of(study.TARGET, 20.0)[1]


def test_answers_table_orients_every_registered_comparison_as_method_minus_baseline(tmp_path):
    """A method that is lower than every baseline by more than its seeds move beats them all; a
    registered pair written either way round reads as method minus baseline."""
    from data_mixture.register import register, verify
    from data_mixture.table import read_runs

    domains = study.DOMAINS
    cands = {"uniform": [0.25] * 4, "proportional": [0.1, 0.4, 0.4, 0.1], "best_at_proxy": [0.0, 0.5, 0.0, 0.5],
             "rank_by_weight": [0.1, 0.1, 0.1, 0.7], "camel": [0.0, 0.3, 0.0, 0.7], "mergemix_loss": [0.2, 0.2, 0.2, 0.4]}
    level = {"uniform": 3.0, "proportional": 3.1, "best_at_proxy": 2.9, "rank_by_weight": 2.95, "camel": 2.8,
             "mergemix_loss": 2.85}
    comparisons = [["uniform", "camel"]] + [[m, b] for m in ("camel", "mergemix_loss") for b in study.BASELINES
                                            if (m, b) != ("camel", "uniform")] + [["camel", "mergemix_loss"]]
    reg = register({"rule": "paired t", "metric": "knowledge=0.75,prose=0.25"},
                   {n: dict(zip(domains, w)) for n, w in cands.items()}, comparisons=comparisons,
                   code_version={"commit": "x"}, registered_at="2026-12-01T00:00:00+00:00")
    size = study.sizes()["s2"]
    with (tmp_path / "t.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["run", "params_total", "params_active", "tokens", *[f"mix:{d}" for d in domains],
                    *[f"loss:{d}" for d in domains], "seed", "started_at"])
        for n, mix in cands.items():
            for seed, jitter in enumerate((0.0, 0.01, -0.005)):
                v = level[n] + jitter + (0.002 * seed if n == "camel" else 0.0)
                w.writerow([f"s2_{n}_s{seed}", size["params_total"], size["params_active"], 1e7, *mix, 1, v, 1, v,
                            seed, "2026-12-02T00:00:00+00:00"])
    check = verify(reg, read_runs(str(tmp_path / "t.csv")))
    assert check["pre_registered"]
    text = "\n".join(study.answers_md(check))
    camel = next(line for line in text.splitlines() if line.startswith("| camel |"))
    assert camel.startswith("| camel | -0.1980 [") and camel.count("**beats**") == 4  # uniform came as (uniform, camel)
    assert "-0.1000" in next(line for line in text.splitlines() if line.startswith("| mergemix_loss |"))
    assert "beat every one of uniform, proportional, best_at_proxy, rank_by_weight: **camel, mergemix_loss**" in text
    assert "CAMEL's pick" not in text  # no other law registered


def test_candidates_name_each_pick_from_the_ladder_s_files(tmp_path):
    """The trivial picks from the ladder's s1b runs, the laws' from their optima; the best other law
    is the best non-CAMEL law by decision accuracy, and rank-by-weight is not UniMax in disguise."""
    plan = json.loads((RESULTS / "plan.json").read_text())
    knowledge = {r["name"]: r["mixture"]["knowledge"] for r in plan["runs"]}
    write_table(tmp_path / "runs.csv", plan, {n: 3.0 - k + 0.01 * ("_s1" in n) for n, k in knowledge.items()
                                              if n.startswith("s1b")})
    laws = {"camel": 0.9, "camel+repfit": 0.95, "additive": 0.8, "regmix": 0.85, "mixing_law": 0.7}
    (tmp_path / "evaluate_ladder").mkdir()
    (tmp_path / "evaluate_ladder" / "evaluation.json").write_text(json.dumps(
        {"laws": {k: {"decision": {"accuracy": v}, "mean": {"mae": 0.01}} for k, v in laws.items()}}))
    (tmp_path / "optima").mkdir()
    for i, law in enumerate(laws):
        w = dict(zip(study.DOMAINS, [0.1, 0.2, 0.1, 0.6] if i % 2 else [0.2, 0.2, 0.2, 0.4]))
        (tmp_path / "optima" / f"{law}.json").write_text(json.dumps({"weights": w}))
    for name in ("loss", "benchmark"):
        (tmp_path / "mergemix" / f"search_{name}").mkdir(parents=True)
        (tmp_path / "mergemix" / f"search_{name}" / "summary.json").write_text(json.dumps({"mixture": {"prose": 1.0}}))
    got = study.candidates(tmp_path, {**study.ATTEMPTS[4], "target": study.TARGET_SET})  # the table's target column
    assert list(got) == ["uniform", "proportional", "unimax", "best_at_proxy", "rank_by_weight", "camel",
                         "best_other_law", "repetition_law", "mergemix_loss", "mergemix_benchmark"]
    best = max(knowledge[n] for n in knowledge if n.startswith("s1b"))
    assert got["best_at_proxy"]["weights"]["knowledge"] == pytest.approx(best)
    assert got["rank_by_weight"]["weights"]["knowledge"] == pytest.approx(study.RANK_BY_WEIGHT_CAP)
    assert got["unimax"]["weights"]["knowledge"] < 0.1  # 4 epochs of a 250k pool in 12M tokens
    assert got["best_other_law"]["law"] == "regmix"  # camel+repfit scored higher but is CAMEL's variant


def test_mergemix_base_is_the_gate_s_uniform_run_at_the_largest_proxy(tmp_path, monkeypatch):
    swept = []
    monkeypatch.setattr(study, "sweep", lambda plan, root, parallel: swept.append(json.loads(plan.read_text())["runs"]))
    base, run = study.mergemix_base(RESULTS, tmp_path, 2, 4)
    assert run["name"] == "s1b_uniform_s10" and base == tmp_path / "pilot4" / "s1b_uniform_s10"
    assert [r["name"] for r in swept[0]] == ["s1b_uniform_s10"]  # reused when done, trained otherwise
