"""``data_mixture recommend``: on the headroom study's committed ladder (through the command line)
and on a small user-style table with a held-out target (through the Python function). Cheap
settings: one fast law (regmix_linear), few bootstrap members and resamples."""

from __future__ import annotations

import json
import os
import shlex

import pytest

from data_mixture.__main__ import main
from data_mixture import recommend
from data_mixture.recommendation import RecommendError
from data_mixture.synthetic import user_style_table
from moejax.data.mixture import read_mixture_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LADDER = os.path.join(ROOT, "experiments/studies/results/headroom_v1/runs.csv")
CHEAP = ["--laws", "regmix_linear", "--bootstrap", "10", "--resamples", "200", "--starts", "4", "--no-progress"]


@pytest.fixture(scope="module")
def ladder(tmp_path_factory):
    out = tmp_path_factory.mktemp("recommend") / "rec"
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        main(["recommend", "--runs", LADDER, "--target", "knowledge=0.75,prose=0.25", "--size", "600480",
              "--tokens", "12009472", "--unique-tokens", "knowledge=250000", "--out", str(out), *CHEAP])
    return out, buf.getvalue()


def test_recommend_on_the_headroom_ladder_prints_pick_odds_and_command(ladder):
    out, text = ladder
    result = json.loads((out / "mixture.json").read_text())
    assert text.startswith("recommended: ")
    for name in ("uniform", "best_at_proxy", "target_capped_4", "target_capped_16", "proxy_capped_4", "proxy_capped_16"):
        assert f"vs {name}: beats it in " in text
        assert name in result["robust"]["odds"]
    # the practitioner rule at the target, by hand: knowledge capped at 16 x 250e3 / 12009472 = 0.333, the rest prose
    assert result["baselines"]["target_capped_16"]["weights"]["knowledge"] == pytest.approx(16 * 250e3 / 12009472)
    assert result["decision"]["best_law"] == "regmix_linear" and result["decision"]["choice"] in ("law", "rule")
    assert "held-out decision accuracy" in text and result["holdout"].startswith("largest size")
    md = (out / "recommendation.md").read_text()
    assert "![predicted target loss](recommendation.png)" in md and (out / "recommendation.png").stat().st_size > 1000
    assert len(md.splitlines()) < 80


def test_the_printed_command_runs_as_printed(ladder):
    from moejax.main import parse_command_line

    out, text = ladder
    line = next(x for x in text.splitlines() if x.startswith("train with: "))[len("train with: "):]
    args = shlex.split(line)
    assert os.path.isabs(args[0]) and os.path.exists(args[0]) and os.path.exists(args[1])
    command = parse_command_line(["moejax.main", "--config", args[1], *args[2:]])
    cfg = command.config
    weights = read_mixture_file(cfg.data.mixture_file)
    assert weights == json.loads((out / "mixture.json").read_text())["weights"]
    # the command trains the target's tokens: steps x batch x sequence >= 12009472
    assert cfg.train.steps * cfg.train.global_batch_size * cfg.train.seq_len >= 12009472


@pytest.fixture(scope="module")
def user_style():
    table = user_style_table()
    return recommend(table, size=2e6, tokens=4e7, target="heldout", unique_tokens={"books": 2e6},
                     laws=["regmix_linear"], bootstrap=8, resamples=200, starts=4, progress=False)


def test_recommend_on_a_user_style_table_with_a_held_out_target(user_style):
    r = user_style
    # two sizes: scored out of fold across the mixtures at the largest size
    assert r["holdout"].startswith("kfold=5")
    # a held-out target weights no training domain: target-capped does not apply, proxy-capped does
    assert "proxy-capped is the practitioner rule" in r["baselines"]["target_capped_16"]["skipped"]
    assert "weights" in r["baselines"]["proxy_capped_16"] and "proxy_capped_16" in r["robust"]["odds"]
    assert r["decision"]["best_rule"].startswith("proxy_capped")
    assert abs(sum(r["weights"].values()) - 1) < 1e-9 and set(r["weights"]) == {"web", "books", "code"}


def test_recommend_errors():
    from data_mixture.table import TableError

    with pytest.raises(TableError, match="--unique-tokens names domain\\(s\\) heldout that the table does not train on"):
        recommend(user_style_table(), size=2e6, tokens=4e7, target="heldout", unique_tokens={"heldout": 1e6},
                  laws=["regmix_linear"], progress=False)
    with pytest.raises(RecommendError, match="--tokens -1"):
        recommend(user_style_table(), size=2e6, tokens=-1, progress=False)


@pytest.mark.slow  # trains two steps through launch.sh
def test_the_printed_command_trains(ladder, tmp_path):
    import subprocess
    import sys

    _, text = ladder
    line = next(x for x in text.splitlines() if x.startswith("train with: "))[len("train with: "):]
    command = shlex.split(line)
    command[command.index("--workdir") + 1] = str(tmp_path / "w")
    short = ["--config.train.steps=2", "--config.train.global_batch_size=8", "--config.train.seq_len=32",
             "--config.train.eval_batches=1"]  # a few steps of the printed command
    proc = subprocess.run(["bash", *command, *short], cwd=tmp_path, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "MOEJAX_PYTHON": sys.executable})  # from the user's directory
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "done: step 2" in proc.stdout
