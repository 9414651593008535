"""``python -m data_mixture mergemix`` end to end on the shared tiny base, and its bad-input errors."""

import json
import os
import shutil

import numpy as np
import pytest

from data_mixture.__main__ import main
from tests.mergemix_fixture import EXPERT_TOKENS, mergemix_experts, mergemix_runs  # noqa: F401 (fixtures)


def _run(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    return exc.value.code, capsys.readouterr().err


def _args(base, out, *extra):
    return ["mergemix", "--base", base, "--domains", "code,math", "--expert-tokens", str(EXPERT_TOKENS),
            "--fractions", "0.5,1", "--out", str(out), "--max-items", "2", "--loss-batches", "1", "--no-progress",
            "--expert-eval-args", "--tasks --loss-batches 1", *extra]


@pytest.mark.parametrize("extra, message", [
    (["--budget", "3", "--seeds", "4"], "--budget 3 is smaller than the seed design"),
    (["--router", "oracle"], "--router 'oracle' is unknown"),
    (["--bench-metric", "bpb"], "--bench-metric 'bpb' is unknown; allowed: accuracy, gold_logprob"),
    (["--expert-fraction", "0.3"], "--expert-fraction 0.3 is not one of the kept checkpoints"),
    (["--min-weight", "code=0.6,math=0.5"], "floors must be >= 0 and sum below 1"),
    (["--min-weight", "web=0.1"], "--min-weight names ['web']"),
])
def test_bad_input_is_refused_before_training(mergemix_runs, tmp_path, capsys, extra, message):
    code, err = _run(_args(os.path.join(mergemix_runs, "base"), tmp_path / "out", *extra), capsys)
    assert code == 2 and message in err
    assert not (tmp_path / "out" / "experts").exists()


def test_unknown_domain_is_refused_before_training(mergemix_runs, tmp_path, capsys):
    argv = _args(os.path.join(mergemix_runs, "base"), tmp_path / "out")
    argv[argv.index("code,math")] = "code,poetry"
    code, err = _run(argv, capsys)
    assert code == 2 and "poetry" in err and not (tmp_path / "out" / "experts").exists()


def test_end_to_end_writes_a_mixture_launch_accepts(mergemix_runs, mergemix_experts, tmp_path, capsys):
    """The experts come from the shared fixture (trained by the same experts module with the same
    plan), copied: the pipeline finds them done and goes on to merge and search."""
    out = tmp_path / "out"
    shutil.copytree(mergemix_experts, out / "experts")
    argv = _args(os.path.join(mergemix_runs, "base"), out, "--search", "both", "--budget", "6", "--seeds", "4",
                 "--min-weight", "code=0.1")
    main(argv)
    printed = capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    mixture = json.loads((out / "mixture.json").read_text())
    assert set(mixture["weights"]) == {"code", "math"} and sum(mixture["weights"].values()) == pytest.approx(1.0)
    assert mixture["weights"]["code"] >= 0.1 - 1e-12  # the floor holds
    assert summary["mixture"] == mixture["weights"] and '"mixture"' in printed
    for method in ("mergemix", "cmaes"):
        trace = json.loads((out / f"search_{method}.json").read_text())["trace"]
        assert len(trace) == 6 and all(t["merge_alpha"][0] >= 0.1 - 1e-12 for t in trace)
    assert (out / "search.png").stat().st_size > 0 and (out / "surface.png").stat().st_size > 0
    cost = json.loads((out / "cost.json").read_text())
    assert cost["merges_evaluated"] == summary["merges_evaluated"] > 0 and cost["merges"] > 0 and cost["experts"] > 0

    from moejax.data.mixture import read_mixture_file

    assert read_mixture_file(out / "mixture.json") == mixture["weights"]

    # Rerun: experts are skipped and every merge comes from the cache (nothing recomputed).
    main(argv)
    again = json.loads((out / "summary.json").read_text())
    assert again["mixture"] == summary["mixture"]
    assert again["cache_hits"] >= 12 and again["flops"]["merges_evaluated"] == summary["flops"]["merges_evaluated"]
    lines = (out / "cache.jsonl").read_text().splitlines()
    assert len(lines) == len({(tuple(np.round(json.loads(line)["alpha"], 9)), json.loads(line)["router"]) for line in lines})


def test_harc_proxy_is_cached_with_its_calibration(mergemix_runs, mergemix_experts, tmp_path):
    """The harc treatment calibrates once per alpha: a second evaluation (also from a reopened cache
    file) is a cache hit and skips the calibration."""
    from data_mixture.mergemix.pipeline import MergeProxy, open_merge
    from data_mixture.mergemix.routing import calibration_batches

    base, cache = os.path.join(mergemix_runs, "base"), str(tmp_path / "cache.jsonl")
    kw = dict(max_items=1, loss_batches=1, cache_path=cache, tasks=[])
    merge_set, evaluator = open_merge(base, None, mergemix_experts, ("code", "math"), 1.0, **kw)
    calib = calibration_batches(merge_set.erun, ["code", "math"], batches_per_domain=1)
    harc = MergeProxy(merge_set, evaluator, "harc", calib_batches=calib)
    first = harc(np.array([0.3, 0.7]))
    assert harc(np.array([0.3, 0.7])) == first and (evaluator.merges_evaluated, evaluator.cache_hits) == (1, 1)
    linear = MergeProxy(merge_set, evaluator, "linear")(np.array([0.3, 0.7]))
    assert evaluator.merges_evaluated == 2 and linear["loss:code"] != first["loss:code"]
    _, reopened = open_merge(base, None, mergemix_experts, ("code", "math"), 1.0, **kw)
    assert MergeProxy(merge_set, reopened, "harc", calib_batches=None)(np.array([0.3, 0.7])) == first
    assert reopened.merges_evaluated == 0


def test_bench_metric_gold_logprob_end_to_end(mergemix_runs, mergemix_experts, tmp_path, capsys):
    """``--bench-metric gold_logprob``: the benchmark objective on the continuous score; the mixture
    records the metric, and the same --out is refused for the other metric (its cache holds log-probs)."""
    out = tmp_path / "out"
    shutil.copytree(mergemix_experts, out / "experts")
    argv = _args(os.path.join(mergemix_runs, "base"), out, "--budget", "4", "--seeds", "4")
    main([*argv, "--bench-metric", "gold_logprob"])
    mixture = json.loads((out / "mixture.json").read_text())
    assert mixture["bench_metric"] == "gold_logprob" and mixture["objective"]["weights"]
    trace = json.loads((out / "search_mergemix.json").read_text())["trace"]
    bench = [v for t in trace for k, v in t["metrics"].items() if k.startswith("bench:")]
    assert len(bench) >= 4 and all(v < 0 for v in bench)  # log-probabilities, not accuracies
    code, err = _run(argv, capsys)
    assert code == 2 and "as gold_logprob, but this evaluator scores them as accuracy" in err
