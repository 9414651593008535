"""Mid-training plans and seeds: plan -> sweep (bases first, each trained once) -> collect.

The plans are real (``make_plan`` and the CLI). The sweeps run against a stand-in for moejax's two
commands (``SweepOptions.python`` is a small script that answers ``-m moejax.main`` and ``-m
moejax.eval`` by writing what they write: ``config.json`` from the runner's resolved config,
``checkpoints/<step>/`` and ``eval/step_N.json``), so the runner's ordering, leases and blocking
and collect's columns are checked in seconds. The stand-in resumes from its own checkpoints first
and reads ``checkpoint.init_from`` only on a fresh start, as moejax does; moejax's own behaviour
(parameters only, the step counter at 0, a resume ignoring ``init_from``) is checked on a real
run by the slow test at the end.
"""

from __future__ import annotations

import csv
import json
import shutil
import stat
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from data_mixture.plan import BASE_SEED_OFFSET, PlanError, PlanSpec, continuation_runs, make_plan
from data_mixture.sweep import SweepError, SweepOptions, run_sweep
from data_mixture.table import read_runs

DOMAINS = ("code", "prose", "math", "knowledge")
TINY = {"model.d_model": 16, "model.num_layers": 1, "model.num_heads": 1, "model.num_kv_heads": 1,
        "model.head_dim": 16, "model.mlp_dim": 32, "model.moe.num_experts": 4, "model.moe.expert_dim": 16,
        "model.moe.shared_expert_dim": 16, "model.moe.tile_size": 8}
PRESETS = {"a": TINY, "b": {**TINY, "model.d_model": 32, "model.num_layers": 2, "model.num_heads": 2}}
BATCH, SEQ = 8, 32
PER_STEP = BATCH * SEQ

FAKE = r'''#!{python}
"""Stand-in for `python -m moejax.main` / `python -m moejax.eval` (tests/test_dm_midtrain.py)."""
import json, os, sys, time
from pathlib import Path

args = sys.argv[1:]
module, rest = args[1], args[2:]
workdir = Path(rest[rest.index("--workdir") + 1])
over = dict(a[len("--config."):].split("=", 1) for a in rest if a.startswith("--config."))
root = workdir.parent


def log(**fields):
    with open(root / "launches.jsonl", "a") as f:
        f.write(json.dumps({{"run": workdir.name, "module": module, "time": time.time(), **fields}}) + "\n")


def steps_on_disk(path):
    ck = Path(path) / "checkpoints"
    return sorted(int(c.name) for c in ck.iterdir()) if ck.is_dir() else []


if module == "moejax.main":
    log(event="start", init_from=over.get("checkpoint.init_from", ""))
    if workdir.name in os.environ.get("FAKE_FAIL", "").split(","):
        print("fake: training failed on purpose"); sys.exit(1)
    cfg = json.loads((workdir / "record.json").read_text())["resolved_config"]
    steps, every = int(over["train.steps"]), int(over["checkpoint.every_steps"])
    have = steps_on_disk(workdir)
    if have:
        print(f"resuming from step {{have[-1]}}")
    elif over.get("checkpoint.init_from"):
        base, step = over["checkpoint.init_from"], int(over.get("checkpoint.init_step", -1))
        if step not in steps_on_disk(base):
            print(f"config key 'checkpoint.init_from' has value {{base!r}}; it holds no checkpoint at step {{step}}")
            sys.exit(2)
        print(f"parameters from {{base}} (step {{step}}); fresh optimizer and data")
    else:
        print("fresh start")
    (workdir / "config.json").write_text(json.dumps(cfg))
    time.sleep(float(os.environ.get("FAKE_SECONDS", "0.3")))
    for s in sorted(set(range(every, steps + 1, every)) | {{steps}}):
        if not have or s > have[-1]:
            (workdir / "checkpoints" / str(s)).mkdir(parents=True, exist_ok=True)
    log(event="end")
else:
    log(event="eval")
    mixture = json.loads((workdir / "config.json").read_text())["data"]["mixture"]
    (workdir / "eval").mkdir(exist_ok=True)
    for s in steps_on_disk(workdir):
        losses = {{d: {{"loss": 2.0 + 1.0 / s - 0.1 * float(mixture.get(d, 0))}} for d in {domains!r}}}
        (workdir / "eval" / f"step_{{s}}.json").write_text(json.dumps({{"losses": {{"domains": losses}}, "benchmarks": {{}}}}))
'''


def spec(**kw) -> PlanSpec:
    base = dict(budget_flops=1e12, target_size=1e6, target_tokens=1e8, law="regmix_linear", presets=PRESETS,
                domains=",".join(DOMAINS), simulations=1, sim_starts=2, min_runs_per_size=3, seed=0, batch=BATCH,
                seq_len=SEQ, min_sizes=2, mid_training=True, base_tokens=4 * PER_STEP, mid_tokens=4 * PER_STEP)
    base.update(kw)
    return PlanSpec(**base)


@pytest.fixture(scope="module")
def mid_plan():
    return make_plan(spec(seeds=2, seed_sizes=["a"]))


@pytest.fixture
def fake_python(tmp_path) -> str:
    path = tmp_path / "fake_python"
    path.write_text(FAKE.format(python=sys.executable, domains=DOMAINS))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def small_plan(plan: dict, names: list[str], path: Path) -> Path:
    """The plan with only the named runs (the simulation picks many mixtures; a sweep test needs few)."""
    by_name = {r["name"]: r for r in plan["runs"]}
    path.write_text(json.dumps({**plan, "runs": [by_name[n] for n in names]}, indent=1))
    return path


def launches(root: Path) -> list[dict]:
    return [json.loads(line) for line in (root / "launches.jsonl").read_text().splitlines()]


def read_csv(path: Path) -> tuple[list[str], list[dict]]:
    with open(path) as f:
        reader = csv.DictReader(f)
        return list(reader.fieldnames or []), list(reader)


def options(root: Path, python: str, **kw) -> SweepOptions:
    return SweepOptions(root=str(root), progress=False, python=python, heartbeat=1, lease_timeout=30, **kw)


# -------------------------------------------------------------------------------------------- plan


def test_mid_training_plan_has_one_base_per_size_and_replicates(mid_plan):
    runs, protocol = mid_plan["runs"], mid_plan["protocol"]
    sizes = mid_plan["chosen"]["sizes"]
    bases = [r for r in runs if r["role"] == "base"]
    mids = [r for r in runs if r["role"] == "mid"]
    assert [r["name"] for r in bases] == [f"{p}_base" for p in sizes] and runs[:len(bases)] == bases  # bases first
    assert len(mids) == len(runs) - len(bases) and not [r for r in runs if r["role"] == "scratch"]
    n = mid_plan["chosen"]["runs_per_size"]
    assert [r["name"] for r in mids if r["preset"] == "a"] == [f"a_m{k}{s}" for k in range(n) for s in ("", "_s1")]
    assert [r["name"] for r in mids if r["preset"] == "b"] == [f"b_m{k}" for k in range(n)]
    for base in bases:
        o = base["overrides"]
        assert base["seed"] == o["train.seed"] == BASE_SEED_OFFSET and "checkpoint.init_from" not in o
        assert o["data.mixture"] == base["mixture"] == {d: 0.25 for d in DOMAINS}
        assert base["tokens"] == 4 * PER_STEP == base["steps"] * PER_STEP
    for r in mids:
        o, base = r["overrides"], next(b for b in bases if b["preset"] == r["preset"])
        assert r["base"] == base["name"] and r["base_tokens"] == base["tokens"]
        assert o["checkpoint.init_from"] == base["name"] and o["checkpoint.init_step"] == base["steps"]
        assert o["optim.schedule"] == "cosine" and o["optim.lr"] == pytest.approx(3e-3) and o["optim.warmup_steps"] == 1
        assert o["train.seed"] == r["seed"] == (1 if r["name"].endswith("_s1") else 0)
        assert r["tokens"] == 4 * PER_STEP and {k: o[k] for k in TINY} == {k: base["overrides"][k] for k in TINY}
    # FLOPs: every base once, plus every mid-training run (replicates included), within the budget
    assert all(r["flops"] == 6 * r["params_active"] * r["tokens"] for r in runs)
    assert mid_plan["total_flops"] == pytest.approx(sum(r["flops"] for r in runs))
    assert mid_plan["chosen"]["base_flops"] == pytest.approx(sum(r["flops"] for r in bases))
    # the budget pays for the bases first: what is left buys the mixtures (replicates counted)
    per_mixture = sum(r["flops"] for r in mids) / n
    budget = mid_plan["chosen"]["base_flops"] + 5.5 * per_mixture
    tight = make_plan(spec(seeds=2, seed_sizes=["a"], budget_flops=budget))
    assert tight["chosen"]["runs_per_size"] == 5 and tight["total_flops"] <= budget
    with pytest.raises(PlanError, match=r"affords no allocation: the cheapest needs .* plus one base per size"):
        make_plan(spec(seeds=2, seed_sizes=["a"], budget_flops=mid_plan["chosen"]["base_flops"] + 2.9 * per_mixture))
    assert protocol["kind"] == "mid_training" and protocol["seeds"] == 2 and protocol["seed_sizes"] == ["a"]
    assert protocol["base_tokens"] == {p: 4.0 * PER_STEP for p in sizes} == protocol["mid_tokens"]
    assert protocol["law_tokens"] == "mid" and protocol["schedule"]["warmup_fraction"] == 0.05
    json.dumps(mid_plan)


def test_continuation_runs_repeat_the_plans_base_and_mid_recipe(mid_plan):
    """Mixtures chosen after the ladder (the target's picks) get make_plan's base and mid runs."""
    by_name = {r["name"]: r for r in mid_plan["runs"]}
    planned = by_name["b_m1"]
    runs = continuation_runs(spec(), "b", {"m1": planned["mixture"], "other": {d: 0.25 for d in DOMAINS}}, [0, 1])
    assert [r["name"] for r in runs] == ["b_base", "b_m1_s0", "b_m1_s1", "b_other_s0", "b_other_s1"]
    assert runs[0] == by_name["b_base"] and runs[1] == {**planned, "name": "b_m1_s0"}
    assert runs[2]["overrides"] == {**planned["overrides"], "train.seed": 1} and runs[2]["seed"] == 1
    with pytest.raises(PlanError, match="preset 'zz' is not among the presets"):
        continuation_runs(spec(), "zz", {"m": planned["mixture"]}, [0])
    with pytest.raises(PlanError, match="mid-training spec"):
        continuation_runs(spec(mid_training=False), "b", {"m": planned["mixture"]}, [0])


def test_scratch_plans_keep_their_names_and_overrides():
    plain = make_plan(spec(mid_training=False, base_tokens=None, mid_tokens=None, tokens_per_param=(0.5,)))
    assert plain["protocol"] == {"kind": "scratch", "seeds": 1, "seed_values": [0], "seed_sizes": [],
                                 "seed_sizes_requested": None}
    assert all(r["role"] == "scratch" and r["seed"] == 0 and "base" not in r for r in plain["runs"])
    assert [r["name"] for r in plain["runs"]] == [f"{p}_m{k}" for p in plain["chosen"]["sizes"]
                                                 for k in range(plain["chosen"]["runs_per_size"])]
    seeded = make_plan(spec(mid_training=False, base_tokens=None, mid_tokens=None, tokens_per_param=(0.5,), seeds=3))
    names = [r["name"] for r in seeded["runs"]]
    assert names[:3] == [f"{seeded['chosen']['sizes'][0]}_m0", f"{seeded['chosen']['sizes'][0]}_m0_s1",
                         f"{seeded['chosen']['sizes'][0]}_m0_s2"] and len(set(names)) == len(names)
    by_name = {r["name"]: r for r in seeded["runs"]}
    a, b = by_name[names[0]]["overrides"], by_name[names[2]]["overrides"]
    assert {k: v for k, v in a.items() if k != "train.seed"} == {k: v for k, v in b.items() if k != "train.seed"}
    assert (a["train.seed"], b["train.seed"]) == (0, 2)


@pytest.mark.parametrize("argv, expected", [
    (["--seeds", "0"], "--seeds 0: allowed: an integer >= 1"),
    (["--seeds", "-2"], "--seeds -2: allowed: an integer >= 1"),
    (["--base-tokens", "1e5"], "--base-tokens describe(s) a mid-training plan; add --mid-training"),
    (["--mid-training", "--tokens-per-param", "20"], "a --mid-training plan takes --mid-tokens-per-param"),
    (["--mid-training", "--base-tokens", "1e5", "--base-tokens-per-param", "20"], "are both given"),
    (["--mid-training", "--base-mixture", "code=0.5", "rust=0.5"], "--base-mixture has unknown domain(s) rust"),
    (["--seeds", "2", "--seed-sizes", "a,zz"], "--seed-sizes 'a,zz': 'zz' is not a size preset; allowed: a comma-separated list of a, b"),
])
def test_bad_plan_flags_are_one_line_errors(tmp_path, capsys, argv, expected):
    from data_mixture.__main__ import main

    out = tmp_path / "plan.json"
    with pytest.raises(SystemExit) as exc:
        main(["plan", "--budget-flops", "1e12", "--target-size", "1e6", "--target-tokens", "1e8", "--domains",
              ",".join(DOMAINS), "--presets", json.dumps(PRESETS), "--law", "regmix_linear", "--no-progress",
              "--out", str(out), *argv])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.startswith("python -m data_mixture plan: error: ") and err.count("\n") == 1, err
    assert expected in err and not out.exists()


# ------------------------------------------------------------------------------------------- sweep


def test_a_missing_or_mismatched_base_is_refused_before_anything_starts(mid_plan, tmp_path):
    by_name = {r["name"]: r for r in mid_plan["runs"]}
    root = tmp_path / "root"
    cases = [
        ([by_name["a_m0"]], "run 'a_m0' (runs[0]) continues from base 'a_base', which is not a run of the plan"),
        ([by_name["a_base"], {**by_name["b_m0"], "base": "a_base",
                              "overrides": {**by_name["b_m0"]["overrides"], "checkpoint.init_from": "a_base"}}],
         "run 'b_m0' (runs[1]) continues from base 'a_base' (runs[0]) but their models differ (model.d_model: 16"),
        ([by_name["a_base"], {**by_name["a_m0"], "overrides": {**by_name["a_m0"]["overrides"],
                                                                "checkpoint.init_from": "/elsewhere"}}],
         "sets checkpoint.init_from='/elsewhere'; allowed: 'a_base'"),
    ]
    for runs, expected in cases:
        plan = tmp_path / "plan.json"
        plan.write_text(json.dumps({"runs": runs}))
        with pytest.raises(SweepError) as exc:
            run_sweep(plan, options(root, "unused"))
        assert expected in str(exc.value)
        assert not root.exists()


def test_sweep_trains_each_base_once_before_its_runs_and_collect_records_the_protocol(mid_plan, tmp_path, fake_python):
    names = ["a_base", "b_base", "a_m0", "a_m0_s1", "a_m1", "b_m0"]
    plan = small_plan(mid_plan, names, tmp_path / "plan.json")
    root = tmp_path / "root"
    result = run_sweep(plan, options(root, fake_python, parallel=2))
    assert result.exit_code == 0, result.summary
    events = launches(root)
    starts = [e for e in events if e["event"] == "start"]
    assert sorted(e["run"] for e in starts) == sorted(names)  # every run trained once, each base once
    for e in starts:
        if e["run"].endswith("_base"):
            continue
        base = e["run"][0] + "_base"
        assert e["init_from"] == str((root / base).resolve())
        assert e["time"] > max(x["time"] for x in events if x["run"] == base)  # after the base trained and evaluated
    assert "parameters from" in (root / "a_m0_s1" / "train.log").read_text()
    said = (root / "sweep.log").read_text()
    assert said.index("a_base: done") < said.index("a_m0: start (attempt 1, train from base a_base)")
    rec = json.loads((root / "a_m0" / "record.json").read_text())
    assert rec["overrides"]["checkpoint.init_from"] == "a_base"  # the plan's, root-independent
    assert rec["added_overrides"]["checkpoint.init_from"] == str((root / "a_base").resolve())

    header, rows = read_csv(root / "runs.csv")
    assert header[-7:] == ["seed", "base", "base_tokens", "step", "loss_source", "workdir", "started_at"]
    last = {r["run"]: r for r in rows if r["step"] == "4"}
    assert [r["run"] for r in rows] == [n for n in names for _ in (2, 4)]
    for name in ("a_base", "b_base"):
        assert (last[name]["base"], last[name]["base_tokens"], last[name]["seed"]) == ("", "", str(BASE_SEED_OFFSET))
    for name in names[2:]:
        assert last[name]["base"] == name[0] + "_base" and float(last[name]["base_tokens"]) == 4 * PER_STEP
        assert float(last[name]["tokens"]) == 4 * PER_STEP  # the mid-training tokens only
        assert last[name]["seed"] == ("1" if name.endswith("_s1") else "0")
    table = read_runs(root / "runs.csv")
    assert sorted(set(table.law_rows().run)) == sorted(names[2:])
    # rerunning launches nothing; a mid run that lost its final checkpoint resumes from its own
    shutil.rmtree(root / "a_m1" / "checkpoints" / "4")
    (root / "a_m1" / "eval" / "step_4.json").unlink()
    again = run_sweep(plan, options(root, fake_python))
    assert again.exit_code == 0 and again.launched == ["a_m1"]
    assert "resuming from step 2" in (root / "a_m1" / "train.log").read_text().split("=== attempt")[-1]


def test_two_runners_share_the_bases(mid_plan, tmp_path, fake_python, monkeypatch):
    monkeypatch.setenv("FAKE_SECONDS", "1")
    plan = small_plan(mid_plan, ["a_base", "a_m0", "a_m1", "a_m2"], tmp_path / "plan.json")
    root = tmp_path / "root"
    results = []

    def runner():
        results.append(run_sweep(plan, options(root, fake_python, wait_others=True)))

    threads = [threading.Thread(target=runner) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:  # generous: under a loaded CI machine the waiting runner's polls lag
        t.join(timeout=300)
    assert [r.exit_code for r in results] == [0, 0], [r.summary for r in results]
    starts = [e["run"] for e in launches(root) if e["event"] == "start"]
    assert sorted(starts) == ["a_base", "a_m0", "a_m1", "a_m2"]  # nothing trained twice
    assert sorted(n for r in results for n in r.launched) == sorted(starts)


def test_a_failed_base_blocks_its_runs(mid_plan, tmp_path, fake_python, monkeypatch):
    monkeypatch.setenv("FAKE_FAIL", "a_base")
    plan = small_plan(mid_plan, ["a_base", "b_base", "a_m0", "a_m1", "b_m0"], tmp_path / "plan.json")
    root = tmp_path / "root"
    result = run_sweep(plan, options(root, fake_python, retries=0))
    assert result.exit_code == 1 and list(result.failed) == ["a_base"]
    assert result.blocked == {"a_m0": "base a_base failed", "a_m1": "base a_base failed"}
    assert sorted(result.succeeded) == ["b_base", "b_m0"]
    assert not (root / "a_m0").exists() and not (root / "a_m1").exists()  # never launched
    assert "blocked: a_m0, a_m1: not launched, their base a_base failed" in result.summary
    _, rows = read_csv(root / "runs.csv")
    assert {r["run"] for r in rows} == {"b_base", "b_m0"}


# ----------------------------------------------------------------------------------------- collect


def test_collect_names_the_missing_base(mid_plan, tmp_path, fake_python, capsys):
    from data_mixture.__main__ import main

    plan = small_plan(mid_plan, ["a_base", "a_m0"], tmp_path / "plan.json")
    root = tmp_path / "root"
    assert run_sweep(plan, options(root, fake_python)).exit_code == 0
    with pytest.raises(SystemExit) as exc:
        main(["collect", str(root / "a_m0"), "--out", str(tmp_path / "runs.csv")])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and f"run 'a_m0' ({root / 'a_m0'}) is a mid-training run of {(root / 'a_base').resolve()}" in err
    main(["collect", str(root / "a_m0"), "--out", str(tmp_path / "runs.csv"), "--ignore-init-from"])
    header, _ = read_csv(tmp_path / "runs.csv")
    assert "base" not in header and "seed" not in header  # one run, from scratch as far as the table knows
    main(["collect", str(root / "a_base"), str(root / "a_m0"), "--out", str(tmp_path / "runs.csv"), "--force"])
    assert "2 runs (1 mid-training runs of 1 base(s))" in capsys.readouterr().out


# ------------------------------------------------------------------------------------ real moejax


@pytest.mark.slow  # two real training runs, their evaluations and a resume (a few minutes on 2 cores)
def test_real_mid_training_run_counts_its_own_tokens_and_resumes_from_itself(mid_plan, tmp_path, corpus_cache,
                                                                             monkeypatch):
    from experiments.tools.fault_drill import child_xla_flags

    monkeypatch.setenv("XLA_FLAGS", child_xla_flags(None))
    path = small_plan(mid_plan, ["a_base", "a_m1"], tmp_path / "plan.json")
    root = tmp_path / "root"
    sweep = SweepOptions(root=str(root), progress=False, eval_args=["--tasks", "--loss-batches", "1"])
    first = run_sweep(path, sweep)
    assert first.exit_code == 0, first.summary
    log = (root / "a_m1" / "train.log").read_text()
    assert f"parameters from {(root / 'a_base').resolve()} (step 4); fresh optimizer and data" in log
    metrics = [json.loads(x) for x in (root / "a_m1" / "metrics.jsonl").read_text().splitlines()]
    assert metrics[0]["step"] == 0  # the step counter starts again at 0
    _, rows = read_csv(root / "runs.csv")
    assert [float(r["tokens"]) for r in rows if r["run"] == "a_m1"] == [2 * PER_STEP, 4 * PER_STEP]
    shutil.rmtree(root / "a_m1" / "checkpoints" / "4")
    (root / "a_m1" / "eval" / "step_4.json").unlink()
    again = run_sweep(path, sweep)
    assert again.exit_code == 0 and again.launched == ["a_m1"]
    last = (root / "a_m1" / "train.log").read_text().split("=== attempt")[-1]
    assert "resuming from step 2" in last and "parameters from" not in last


def test_pilot_compares_mixture_spread_with_seed_noise(tmp_path):
    """experiments.studies.is_mixture_effect_above_seed_noise on a hand-made table: 2 mixtures x 2 seeds from one base."""
    from data_mixture.table import from_columns, write_runs
    from experiments.studies.is_mixture_effect_above_seed_noise import analyse

    cols = {"run": ["b", "m0", "m0s1", "m1", "m1s1"], "params_total": [1e6] * 5, "params_active": [1e6] * 5,
            "tokens": [2e7, 1e6, 1e6, 1e6, 1e6], "mix:a": [0.5, 0.2, 0.2, 0.8, 0.8], "mix:b": [0.5, 0.8, 0.8, 0.2, 0.2],
            "loss:a": [3.0, 2.9, 2.8, 2.5, 2.6], "seed": [0, 0, 1, 0, 1], "base": ["", "b", "b", "b", "b"],
            "base_tokens": ["", 2e7, 2e7, 2e7, 2e7]}
    write_runs(from_columns(cols), tmp_path / "runs.csv")
    m = analyse(str(tmp_path / "runs.csv"))["sizes"]["1e+06"]["metrics"]["loss:a"]
    # seed sd: both cells differ by 0.1 -> sqrt((2 * 0.005) / 2) = 0.0707; means 2.85, 2.55 -> sd 0.2121
    assert m["seed_sd"] == pytest.approx(np.sqrt(0.005)) and m["mixture_sd"] == pytest.approx(0.3 / np.sqrt(2))
    assert m["ratio"] == pytest.approx((0.3 / np.sqrt(2)) / (np.sqrt(0.005) / np.sqrt(2)))
