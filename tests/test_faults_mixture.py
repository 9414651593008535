"""The data-mixture commands never drop a bound or extrapolate silently: every repetition of a
repeatable flag counts, and a prediction or optimisation at a model size the fit never saw warns."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

from data_mixture.__main__ import main
from data_mixture.laws.base import SizeExtrapolationWarning
from data_mixture.synthetic import draw_design, synthetic_table
from data_mixture.table import write_runs

DOMAINS = ("prose", "math", "code")


def _loss(v, n, d, mix_rm):
    return 1.5 + 30 / n**0.3 + 50 / d**0.3 + 0.3 * np.exp(-2 * mix_rm[:, v])


def _fit(tmp_path, sizes, law="regmix_linear"):
    design = draw_design(mix_domains=DOMAINS, sizes=sizes, runs_per_size=12, seed=0)
    runs, fit = tmp_path / "runs.csv", tmp_path / f"fit_{law}.json"
    write_runs(synthetic_table(_loss, design, DOMAINS, domains=DOMAINS), runs)
    main(["fit", "--runs", str(runs), "--law", law, "--out", str(fit), "--bootstrap", "0", "--starts", "4", "--no-progress"])
    return fit


def test_every_repeated_min_and_max_weight_counts(tmp_path):
    fit = _fit(tmp_path, (1e6, 3e6))
    out = tmp_path / "mix.json"
    main(["optimize", "--fit", str(fit), "--size", "3e6", "--tokens", "6e7", "--no-bootstrap", "--out", str(out),
          "--min-weight", "prose=0.3", "--min-weight", "math=0.4", "--max-weight", "code=0.2",
          "--max-weight", "math=0.45"])
    weights = json.loads(out.read_text())["weights"]
    assert weights["prose"] >= 0.3 - 1e-9 and 0.4 - 1e-9 <= weights["math"] <= 0.45 + 1e-9
    assert weights["code"] <= 0.2 + 1e-9


def test_a_domain_given_twice_with_two_values_is_refused(tmp_path, capsys):
    fit = _fit(tmp_path, (1e6, 3e6))
    with pytest.raises(SystemExit) as exit_:
        main(["optimize", "--fit", str(fit), "--size", "3e6", "--tokens", "6e7", "--no-bootstrap",
              "--out", str(tmp_path / "m.json"), "--min-weight", "math=0.3", "--min-weight", "math=0.4"])
    assert exit_.value.code == 2
    assert "--min-weight gives 'math' twice, as 0.3 and 0.4" in capsys.readouterr().err


@pytest.mark.parametrize("law", ["regmix_linear", "regmix"])
def test_optimising_a_one_size_fit_for_another_size_warns(tmp_path, law):
    fit = _fit(tmp_path, (3e6,), law=law)
    with pytest.warns(SizeExtrapolationWarning, match=r"the fit saw one size only \(3e\+06\): its size term is not identified"):
        main(["optimize", "--fit", str(fit), "--size", "1e9", "--tokens", "2e10", "--no-bootstrap",
              "--out", str(tmp_path / "m.json")])
    with warnings.catch_warnings():
        warnings.simplefilter("error", SizeExtrapolationWarning)  # at the fitted size: no warning
        main(["optimize", "--fit", str(fit), "--size", "3e6", "--tokens", "6e7", "--no-bootstrap",
              "--out", str(tmp_path / "m.json"), "--force"])


@pytest.mark.parametrize("law", ["regmix_linear", "regmix"])
def test_predicting_past_a_multi_size_fit_says_how_far(tmp_path, law):
    fit = _fit(tmp_path, (1e6, 3e6), law=law)
    with pytest.warns(SizeExtrapolationWarning, match=r"outside the sizes the fit saw \[1e\+06, 3e\+06\] \(up to 10x beyond\)"):
        main(["optimize", "--fit", str(fit), "--size", "3e7", "--tokens", "6e8", "--no-bootstrap",
              "--out", str(tmp_path / "m.json")])


def test_a_lease_whose_runner_died_on_this_host_is_taken_over_at_once(tmp_path):
    import subprocess
    import sys

    from data_mixture.sweep import record

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # its pid is gone (a SIGKILLed runner's would be too)
    killed = {**record.new_owner(), "pid": dead.pid}
    assert record.try_acquire(tmp_path, killed, timeout=300)[0]  # heartbeat 0 s ago, far below the timeout
    assert record.stale_reason(killed, 0.0, 300) == (
        f"its runner, pid {dead.pid} on this host ({record.host()}), is no longer running")
    mine = record.new_owner()
    assert record.try_acquire(tmp_path, mine, timeout=300) == (True, mine)
    record.release(tmp_path, mine)

    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:  # a live runner of this host, or one of another host with a fresh heartbeat, keeps its lease
        for holder in ({**record.new_owner(), "pid": alive.pid}, {**record.new_owner(), "host": "node7", "pid": dead.pid}):
            assert record.try_acquire(tmp_path, holder, timeout=300)[0]
            got, seen = record.try_acquire(tmp_path, record.new_owner(), timeout=300)
            assert not got and seen["id"] == holder["id"]
            record.release(tmp_path, holder)
    finally:
        alive.kill()
        alive.wait()
