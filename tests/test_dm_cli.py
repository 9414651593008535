"""CLI round trip: collect -> fit -> predict -> optimize -> the mixture file the training config reads.

collect reads a real (tiny, 5-step) trained and evaluated moejax run; its rows are joined by
synthetic rows (same columns, losses from a known law) so that the table has enough runs and sizes
to fit. The fit uses ``regmix_linear`` (milliseconds; the parametric laws' own tests cover them)
with a small bootstrap, so the whole file stays fast.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import numpy as np
import pytest

from data_mixture.__main__ import main
from data_mixture.table import read_runs
from tests.test_dm_collect import build_evaluated_run

DOMAINS = ("code", "prose", "math", "knowledge")


@pytest.fixture(scope="module")
def workdir(run_once):
    return run_once("dm_collect_run", build_evaluated_run)


def _synthetic_rows(header: list[str], seed: int = 0) -> list[dict]:
    """Rows at three sizes x 6 mixtures x 2 checkpoints from L_v = 1.5 + 30/N^0.3 + 50/D^0.3 + 0.3 exp(-2 w_v)."""
    rng = np.random.default_rng(seed)
    rows = []
    for si, n in enumerate((1e5, 3e5, 1e6)):
        for k in range(6):
            w = rng.dirichlet(np.ones(4))
            for d in (10 * n, 20 * n):
                row = {"run": f"syn{si}_{k}", "params_total": n, "params_active": n / 2, "tokens": d, "flops": 3 * n * d}
                losses = {}
                for j, dom in enumerate(DOMAINS):
                    losses[dom] = (1.5 + 30 / n ** 0.3 + 50 / d ** 0.3 + 0.3 * np.exp(-2 * w[j])) * np.exp(0.005 * rng.normal())
                    row[f"mix:{dom}"] = w[j]
                    row[f"loss:{dom}"] = losses[dom]
                row["bench:knowledge"] = 0.25 + 0.5 / (1 + np.exp(4 * (losses["knowledge"] - 3.0)))
                row["bench:math"] = 0.5 / (1 + np.exp(4 * (losses["math"] - 3.0)))
                rows.append({h: row.get(h, "") for h in header})
    return rows


@pytest.fixture(scope="module")
def pipeline(workdir, tmp_path_factory):
    out = tmp_path_factory.mktemp("dm_cli")
    collected = out / "collected.csv"
    main(["collect", workdir, "--out", str(collected)])
    with open(collected) as f:
        reader = csv.DictReader(f)
        header, rows = reader.fieldnames, list(reader)
    runs = out / "runs.csv"
    with open(runs, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=header)
        w.writeheader()
        w.writerows(rows + _synthetic_rows(header))
    fit = out / "fit.json"
    main(["fit", "--runs", str(runs), "--law", "regmix_linear", "--out", str(fit), "--bootstrap", "8", "--seed", "0",
          "--starts", "4", "--chance", "knowledge=0.25", "math=0", "--no-progress"])
    return {"dir": out, "collected": collected, "runs": runs, "fit": fit}


def test_collect_writes_a_valid_table_of_the_real_run(pipeline, workdir):
    table = read_runs(pipeline["collected"])
    assert len(table) == 2 and set(table.mix_domains) == set(DOMAINS) == set(table.loss_domains)
    assert table.extra["workdir"].tolist() == [workdir, workdir]


def test_fit_json_holds_every_domain_bootstrap_and_bench_laws(pipeline):
    fit = json.loads(pipeline["fit"].read_text())
    assert fit["law"] == "regmix_linear"
    assert len(fit["bootstrap"]) == 8
    from data_mixture.fit import Fit

    loaded = Fit.load(pipeline["fit"])
    assert set(loaded.loss_domains) == set(DOMAINS) and set(loaded.bench) == {"knowledge", "math"}


def test_predict_adds_predictions_intervals_and_keeps_extra_columns(pipeline):
    query = pipeline["dir"] / "query.csv"
    with open(query, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["run", "params_total", "params_active", "tokens", *[f"mix:{d}" for d in DOMAINS], "note"])
        w.writerow(["q1", 3e6, 1.5e6, 6e7, 0.25, 0.25, 0.25, 0.25, "uniform"])
        w.writerow(["q2", 3e6, 1.5e6, 6e7, 0.7, 0.1, 0.1, 0.1, "code-heavy"])
    pred = pipeline["dir"] / "pred.csv"
    main(["predict", "--fit", str(pipeline["fit"]), "--runs", str(query), "--out", str(pred)])
    with open(pred) as f:
        rows = list(csv.DictReader(f))
    assert [r["note"] for r in rows] == ["uniform", "code-heavy"]
    for d in DOMAINS:
        for r in rows:
            assert np.isfinite(float(r[f"pred:{d}"])) and float(r[f"lo:{d}"]) <= float(r[f"hi:{d}"])
    assert 0 <= float(rows[0]["pred:bench:knowledge"]) <= 1


def test_optimize_writes_a_mixture_file_the_training_config_accepts(pipeline):
    from moejax.checks import validate
    from moejax.config import default_config
    from moejax.data.corpus import DOMAINS as BUILTIN
    from moejax.data.mixture import schedule_from_config

    mixture = pipeline["dir"] / "mixture.json"
    main(["optimize", "--fit", str(pipeline["fit"]), "--size", "3e6", "--tokens", "6e7", "--objective", "loss",
          "--min-weight", "prose=0.1", "--max-weight", "code=0.5", "--available", "math=6e6", "--max-epochs", "2",
          "--out", str(mixture)])
    out = json.loads(mixture.read_text())
    w = out["weights"]
    assert w["prose"] >= 0.1 and w["code"] <= 0.5 and w["math"] <= 6e6 * 2 / 6e7 + 1e-12
    assert abs(sum(w.values()) - 1) < 1e-12
    assert out["bootstrap"]["members"] == 8 and set(out["predicted"]) >= {f"loss:{d}" for d in DOMAINS}
    cfg = default_config()
    cfg.data.mixture_file = str(mixture)
    validate(cfg, num_devices=8)
    (stage,) = schedule_from_config(cfg.data, BUILTIN, "the built-in corpus")
    np.testing.assert_allclose([stage.weights.get(d, 0.0) for d in DOMAINS], [w[d] for d in DOMAINS], atol=1e-12)


@pytest.mark.slow
def test_launch_trains_on_the_optimised_mixture(pipeline, tmp_path, corpus_cache):
    mixture = pipeline["dir"] / "mixture_launch.json"
    main(["optimize", "--fit", str(pipeline["fit"]), "--size", "3e6", "--tokens", "6e7", "--no-bootstrap", "--out", str(mixture)])
    proc = subprocess.run(["./launch.sh", "--workdir", str(tmp_path / "w"), f"--config.data.mixture_file={mixture}",
                           "--config.train.steps=2", "--config.model.num_layers=1", "--config.train.eval_every=2",
                           f"--config.data.cache_dir={corpus_cache}"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "done: step 2" in proc.stdout


def test_bad_input_is_one_paragraph_and_exit_2(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("run,params_total,params_active,tokens,mix:a,mix:b,loss:a\nr1,1e6,1e6,1e7,0.7,0.7,2.0\n")
    proc = subprocess.run([sys.executable, "-m", "data_mixture", "fit", "--runs", str(bad), "--law", "camel",
                           "--out", str(tmp_path / "f.json")], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "do not sum to 1 in row 1 (run 'r1'" in proc.stderr
    assert proc.stderr.count("\n") == 1


def test_infeasible_optimize_is_a_cli_error(pipeline, capsys):
    with pytest.raises(SystemExit) as e:
        main(["optimize", "--fit", str(pipeline["fit"]), "--size", "3e6", "--tokens", "6e7",
              "--max-weight", "code=0.1", "prose=0.1", "math=0.1", "knowledge=0.1", "--out", str(pipeline["dir"] / "x.json")])
    assert e.value.code == 2
    assert "infeasible: the largest shares allowed sum to 0.4 < 1" in capsys.readouterr().err


def test_every_subcommand_has_help_with_an_example(capsys):
    for cmd in ("collect", "fit", "predict", "evaluate", "register", "optimize", "plan", "sweep", "mergemix"):
        with pytest.raises(SystemExit):
            main([cmd, "--help"])
        out = capsys.readouterr().out
        assert "example:" in out and f"python -m data_mixture {cmd}" in out


def test_evaluate_compares_laws_and_reports_the_unidentifiable(pipeline, capsys):
    out = pipeline["dir"] / "evaluate"
    main(["evaluate", "--runs", str(pipeline["runs"]), "--laws", "regmix_linear,camel", "--starts", "2",
          "--out-dir", str(out)])
    report = json.loads((out / "evaluation.json").read_text())
    assert report["holdout"].startswith("largest size 1e+06")
    lin = report["laws"]["regmix_linear"]
    assert set(lin["domains"]) == set(DOMAINS) and lin["mean"]["mre"] < 0.2
    assert abs(sum(lin["optimal_mixture"].values()) - 1) < 1e-9
    assert "needs at least 23" in report["laws"]["camel"]["skipped"]  # 13 runs below the largest size
    assert (out / "pred_vs_obs.png").stat().st_size > 1000
    assert "| regmix_linear |" in (out / "evaluation.md").read_text()
