"""The lm-eval adapter (moejax.eval.lm_eval): the command on the local example tasks, its
log-likelihoods against moejax.eval's on the same items, rolling windows, generation with stop
strings, and the offline error, on the tiny run test_eval.py trains."""

import os
import sys

os.environ["HF_DATASETS_OFFLINE"] = "1"  # nothing here may download (also set by the command itself)
os.environ["HF_HUB_OFFLINE"] = "1"

import json  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from lm_eval.api.instance import Instance  # noqa: E402
from lm_eval.api.registry import get_model, model_registry  # noqa: E402

from moejax.eval.harness import choice_logliks, score_exact_match, score_multiple_choice  # noqa: E402
from moejax.eval.lm_eval.__main__ import main  # noqa: E402
from moejax.eval.lm_eval.model import MoejaxLM, cut_at_stop  # noqa: E402
from moejax.eval.lm_eval.rows import rolling_rows  # noqa: E402
from moejax.eval.tasks import load_task_file  # noqa: E402
from tests.test_eval import model_logprobs, train_eval_run  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TASKS = REPO / "tests" / "data" / "lm_eval_tasks"
BATCH = 8  # the tiny run's batch is split over 8 devices


@pytest.fixture(scope="module")
def workdir(run_once):
    """The tiny run of test_eval.py (5 steps, byte tokenizer, 64-token context), trained once per pytest run."""
    return run_once("eval_run", train_eval_run)


@pytest.fixture(scope="module")
def lm(workdir):
    return MoejaxLM(workdir, batch_size=BATCH, progress=False)


@pytest.fixture
def offline_cache(tmp_path, monkeypatch):
    """The local task files are read from the repository root (their data_files are relative to it);
    the datasets library's cache goes to a temporary directory."""
    import datasets.config

    monkeypatch.chdir(REPO)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf_datasets"))


def _request(kind, args, index=0):
    return Instance(request_type=kind, doc={}, arguments=args, idx=index, metadata=("t", index, 1))


def test_command_runs_local_tasks_with_moejax_eval_numbers(workdir, lm, tmp_path, offline_cache, capsys):
    out = tmp_path / "results.json"
    main(["--workdir", workdir, "--tasks", "moejax_mc,moejax_gen", "--include_path", str(TASKS),
          "--batch_size", str(BATCH), "--no-progress", "--log_samples", "--output_path", str(out)])
    printed = capsys.readouterr().out
    assert "Tasks" in printed.splitlines()[1]  # lm-eval's table, with its headers
    assert "moejax_mc" in printed and "acc_norm" in printed and "exact_match" in printed
    results = json.loads(out.read_text())
    assert results["config"]["moejax_step"] == 5

    # Multiple choice: every choice's log-likelihood equals moejax.eval's scoring of the same JSONL.
    task = load_task_file(TASKS / "moejax_mc.jsonl")
    scorer = lm.scorer  # moejax.eval's Scorer; the rows, batches and tokenization are the harness's own
    ours, _, _ = choice_logliks(scorer, lm.ckpt, task, lm.tokenizer, max_len=lm.max_len, batch_size=BATCH,
                                progress=False)
    samples = results["samples"]["moejax_mc"]
    assert len(samples) == len(task.items)
    for sample in samples:
        theirs = [float(resp[0][0]) for resp in sample["resps"]]
        expected = [ours[sample["doc_id"], c] for c in range(len(theirs))]
        np.testing.assert_allclose(theirs, expected, rtol=1e-5, atol=1e-4)
    # ... so the accuracies agree too (lm-eval's acc_norm divides by characters: bytes for these ASCII choices).
    mc, _ = score_multiple_choice(scorer, lm.ckpt, task, lm.tokenizer, max_len=lm.max_len, batch_size=BATCH,
                                  progress=False)
    assert results["results"]["moejax_mc"]["acc,none"] == pytest.approx(mc["accuracy"])
    assert results["results"]["moejax_mc"]["acc_norm,none"] == pytest.approx(mc["accuracy_per_byte"])

    # Generation: the KV-cache greedy decode that moejax.eval's exact match runs, cut at the newline.
    gen_task = load_task_file(TASKS / "moejax_gen.jsonl")
    exact, _ = score_exact_match(lm.generator, lm.ckpt, gen_task, lm.tokenizer, max_new_tokens=16, batch_size=BATCH,
                                 progress=False)
    generated = {s["doc_id"]: s["resps"][0][0] for s in results["samples"]["moejax_gen"]}
    for doc_id, example in enumerate(exact["examples"]):
        assert "\n" not in generated[doc_id] and len(lm.tokenizer.encode(generated[doc_id])) <= 16
        assert generated[doc_id].strip() == example["prediction"]
    assert results["results"]["moejax_gen"]["exact_match,none"] == pytest.approx(exact["exact_match"])


def test_rolling_windows_predict_every_token_once():
    ids = np.arange(1, 151)
    rows = rolling_rows(ids, prefix_id=999, max_len=64)
    assert rows[0][0][0] == 999 and all(len(row) <= 65 for row, _ in rows)
    assert np.concatenate([row[-n:] for row, n in rows]).tolist() == ids.tolist()
    # every later window keeps as much preceding text as fits
    assert [len(row) for row, _ in rows] == [65, 65, 65]


def test_rolling_loglikelihood_is_the_document_after_eos(workdir, lm):
    text = "def main():\n    return 0\n"
    ids = lm.tokenizer.encode(text)
    (rolling,) = lm.loglikelihood_rolling([_request("loglikelihood_rolling", (text,))])
    expected = model_logprobs(lm.erun, lm.ckpt, np.concatenate([[lm.tokenizer.eos_id], ids]))
    assert rolling == pytest.approx(float(expected.sum()), abs=1e-3)
    # the same document with an empty context: lm-eval's loglikelihood convention (EOS as context)
    ((logprob, _),) = lm.loglikelihood([_request("loglikelihood", ("", text))])
    assert logprob == pytest.approx(rolling, abs=1e-4)


def test_generate_until_stops_at_strings_and_budget_and_agrees_with_greedy_scoring(lm):
    prompt = "def add(a, b):\n    return"
    free = lm.generate_until([_request("generate_until", (prompt, {"max_gen_toks": 16}))])[0]
    assert 0 < len(lm.tokenizer.encode(free)) <= 16
    stop = free[3:5]
    requests = [
        _request("generate_until", (prompt, {"until": [stop], "max_gen_toks": 16}), 0),
        _request("generate_until", (prompt, {"until": "\n", "max_gen_toks": 16}), 1),
        _request("generate_until", (prompt, {"max_gen_toks": 3}), 2),
    ]
    stopped, line, short = lm.generate_until(requests)
    assert stopped == cut_at_stop(free, (stop,)) and stop not in stopped
    assert line == free.split("\n")[0]
    assert short == free[: len(short)] and len(lm.tokenizer.encode(short)) <= 3
    # What greedy decoding produced is, token by token, the greedy choice; a changed last character is not.
    (greedy, is_greedy), (_, changed_is_greedy) = lm.loglikelihood([
        _request("loglikelihood", (prompt, free[:4])),
        _request("loglikelihood", (prompt, free[:3] + ("x" if free[3] != "x" else "y"))),
    ])
    assert is_greedy and not changed_is_greedy and greedy < 0


def test_task_that_needs_a_download_is_refused_before_the_model_loads(tmp_path, capsys, offline_cache):
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "hub.yaml").write_text(
        "task: hub_task\ndataset_path: Rowan/hellaswag\noutput_type: multiple_choice\ntest_split: validation\n"
        "doc_to_text: ctx\ndoc_to_choice: endings\ndoc_to_target: label\n"
    )
    (tasks / "missing.yaml").write_text(
        "task: missing_file\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: nowhere/items.jsonl\n"
        "output_type: multiple_choice\ntest_split: test\ndoc_to_text: context\ndoc_to_choice: choices\n"
        "doc_to_target: gold\n"
    )
    for name, expected in (("hub_task", ["needs a dataset download", "Rowan/hellaswag", "dataset_path: json",
                                         "data_files", "--include_path"]),
                           ("missing_file", ["nowhere/items.jsonl", "not found", str(REPO)])):
        with pytest.raises(SystemExit) as exit_info:
            main(["--workdir", str(tmp_path / "no_run"), "--tasks", name, "--include_path", str(tasks)])
        assert exit_info.value.code == 2
        error = capsys.readouterr().err
        assert error.startswith("python -m moejax.eval.lm_eval: error: task ") and name in error
        for part in expected:
            assert part in error
    # lm-eval's own command line through moejax checks the same, before lm-eval parses anything
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--model", "moejax", "--model_args", f"workdir={tmp_path / 'no_run'}", "--tasks", "hub_task",
              "--include_path", str(tasks)])
    assert exit_info.value.code == 2 and "needs a dataset download" in capsys.readouterr().err


def test_registered_as_moejax_beside_lm_evals_own_models():
    assert get_model("moejax") is MoejaxLM
    assert "hf" in model_registry and "dummy" in model_registry
    with pytest.raises(ValueError, match=r"unknown model argument\(s\) \['stpe'\]; allowed: workdir, step"):
        get_model("moejax").create_from_arg_string("workdir=runs/x,stpe=5", {"batch_size": 8, "device": "cpu"})


def test_without_lm_eval_the_command_names_the_extra(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # as if it were not installed
    with pytest.raises(SystemExit) as exit_info:
        main(["--workdir", "unused", "--tasks", "moejax_mc"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "needs lm-evaluation-harness" in err and "pip install 'moejax[eval]'" in err
