"""Checkpoint evaluation: the eval CLI's JSON, bits per byte, multiple-choice scoring, calibration,
task-file validation and expert masking, on a tiny model trained for a few steps."""

import functools
import json
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from moejax.data.bpe import train_bpe
from moejax.data.pipeline import make_eval_batches
from moejax.eval import __main__ as eval_cli
from moejax.eval.calibration import choice_probabilities, expected_calibration_error
from moejax.eval.forward import Scorer
from moejax.eval.harness import answer_logprob, choice_logliks, multiple_choice_metrics, score_multiple_choice
from moejax.eval.losses import heldout_losses, target_bytes
from moejax.eval.masking import least_used, mask_state, masked_balancer
from moejax.eval.restore import open_run
from moejax.eval.tasks import Task, TaskFileError, load_task_file
from moejax.model.balancing import RoutingSetup
from moejax.train.checkpoint import Checkpointer
from moejax.train.loop import train
from tests.test_train import read_metrics, small_run_cfg


def train_eval_run(workdir: str) -> None:
    """A tiny run trained for 5 steps (checkpoints at 3 and 5), on the run's shared corpus cache."""
    cfg = small_run_cfg("")
    # An odd step count: the loss-free bias moves by +-u per step, so it cannot be back at 0.
    cfg.train.steps = 5
    # A loss-free bias, so that evaluation must restore it and route with it to match training.
    cfg.model.moe.balancing = (("loss_free", {"u": 0.01}), ("switch", {"weight": 1e-2}))
    train(cfg, workdir)


@pytest.fixture(scope="module")
def workdir(run_once, builtin_benchmarks):
    """The tiny eval run, trained once per pytest run (tests/conftest.py) and shared with test_generate.py.

    test_eval_cli_writes_documented_json_and_curves adds its eval/ directory; nothing else writes to it.
    The built-in benchmarks the CLI scores are built first, once per run (``builtin_benchmarks``).
    """
    return run_once("eval_run", train_eval_run)


@pytest.fixture(scope="module")
def erun(workdir):
    return open_run(workdir)


@pytest.fixture(scope="module")
def ckpt(erun):
    return erun.load()


@pytest.fixture(scope="module")
def scorer(erun):
    return Scorer(erun.run, erun.run.balancer, erun.cfg.model.moe.num_experts)


@functools.cache
def _reference_forward(graphdef, balancer):
    def forward(params, balance, tokens_bt):
        positions = jnp.broadcast_to(jnp.arange(tokens_bt.shape[1]), tokens_bt.shape)
        model = nnx.merge(graphdef, params)
        return model(tokens_bt, positions, jnp.ones_like(tokens_bt), balancer=balancer, balance_state=balance)[0]

    return jax.jit(forward)


def reference_logits(erun, ckpt, tokens, width: int = 128) -> np.ndarray:
    """Logits [T, V] of one unsharded row, right-padded to ``width`` (causal attention and dropless
    routing make padding invisible to earlier tokens), routed with the checkpoint's balance state."""
    padded = np.zeros((1, width), np.int32)
    padded[0, : len(tokens)] = tokens
    forward = _reference_forward(erun.run.graphdef, erun.run.balancer)
    return np.asarray(forward(jax.device_get(ckpt.params), jax.device_get(ckpt.balance), padded)[0, : len(tokens)])


def model_logprobs(erun, ckpt, ids) -> np.ndarray:
    """log p(ids[t+1] | ids[:t+1]) by :func:`reference_logits` and a float64 numpy log-softmax."""
    logits = reference_logits(erun, ckpt, ids[:-1]).astype(np.float64)
    logz = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
    return logits[np.arange(len(ids) - 1), ids[1:]] - logz


def test_eval_cli_writes_documented_json_and_curves(workdir, tmp_path, capsys):
    user_task = tmp_path / "my_quiz.jsonl"
    user_task.write_text(
        json.dumps({"context": "def add(a, b):\n    return", "choices": [" a + b", " a - b"], "gold": 0}) + "\n"
        + json.dumps({"context": "The capital city", "choices": [" of", " xq"], "gold": 0}) + "\n"
    )
    eval_cli.main(["--workdir", workdir, "--all", "--max-items", "3", "--no-progress",
                   "--tasks", "code", "prose", "math", "knowledge", str(user_task)])
    printed = capsys.readouterr().out
    assert "bits/byte" in printed and "my_quiz" in printed and "tokens/s" in printed
    out_dir = os.path.join(workdir, "eval")
    assert sorted(os.listdir(out_dir)) == ["curves.png", "step_3.json", "step_5.json"]
    with open(os.path.join(out_dir, "step_5.json")) as f:
        result = json.load(f)
    assert set(result) == {"step", "workdir", "tokenizer", "settings", "losses", "benchmarks", "routing",
                           "throughput", "eval_seconds"}
    assert result["step"] == 5 and result["tokenizer"] == "byte"
    domains = result["losses"]["domains"]
    assert set(domains) == {"code", "prose", "math", "knowledge"}
    for d in domains.values():
        assert set(d) == {"loss", "loss_se", "perplexity", "bits_per_byte", "tokens", "bytes"}
        assert 0 < d["loss_se"] < d["loss"]
        assert d["perplexity"] == pytest.approx(math.exp(d["loss"]))
    # The same held-out batches as training, routed with the restored loss-free bias: the final
    # eval_loss of the training log.
    final_eval = [r for r in read_metrics(workdir) if "eval_loss" in r][-1]
    assert final_eval["step"] == 5
    assert result["losses"]["loss_mean"] == pytest.approx(final_eval["eval_loss"], abs=1e-5)

    bench = result["benchmarks"]
    assert set(bench) == {"code", "prose", "math", "knowledge", "my_quiz"}
    for name in ("code", "prose", "knowledge", "my_quiz"):
        assert {"accuracy", "accuracy_per_token", "accuracy_per_byte", "ece", "gold_logprob", "items",
                "skipped"} <= set(bench[name])
        assert bench[name]["gold_logprob"] is None or bench[name]["gold_logprob"] < 0
    for name in ("prose", "knowledge", "my_quiz"):
        assert 0 <= bench[name]["accuracy"] <= 1 and 0 <= bench[name]["ece"] <= 1
    assert bench["my_quiz"]["items"] == 2 and bench["prose"]["items"] == 3
    assert bench["code"]["items"] + bench["code"]["skipped"] == 3  # next lines longer than 64 tokens are skipped
    assert bench["math"]["kind"] == "exact_match" and 0 <= bench["math"]["exact_match"] <= 1
    assert len(bench["math"]["examples"]) == 3
    assert bench["math"]["gold_logprob"] < 0

    layers = result["routing"]["layers"]
    assert [layer["layer"] for layer in layers] == [1]  # small_run_cfg: layer 0 dense, layer 1 MoE
    load = np.array(layers[0]["load"])
    cooc = np.array(layers[0]["cooccurrence"])
    assert load.shape == (4,) and load.sum() == pytest.approx(1.0)
    np.testing.assert_allclose(np.diag(cooc), 2 * load, rtol=1e-6)  # top-2: diag = k * load
    np.testing.assert_allclose(cooc, cooc.T)
    assert result["routing"]["max_vio"] == pytest.approx(load.max() / load.mean() - 1)
    for phase in ("losses", "multiple_choice", "exact_match", "total"):
        assert result["throughput"][phase]["tokens_per_sec"] > 0

    # A second --all reuses both results.
    eval_cli.main(["--workdir", workdir, "--all", "--max-items", "3", "--no-progress",
                   "--tasks", "code", "prose", "math", "knowledge", str(user_task)])
    assert capsys.readouterr().out.count("reusing") == 2


def test_restores_the_loss_free_bias_and_routes_with_it(erun, ckpt, scorer):
    full = Checkpointer(erun.checkpoint_dir, max_to_keep=3).restore(ckpt.step, erun.run.abstract_state)
    np.testing.assert_array_equal(ckpt.balance["loss_free"]["bias_e"], full.state["balance"]["loss_free"]["bias_e"])
    assert np.abs(np.asarray(ckpt.balance["loss_free"]["bias_e"])).max() > 0
    batch = make_eval_batches(["code"], seq_len=erun.cfg.train.seq_len, batch_size=8, batches_per_domain=1,
                              dataset=erun.dataset)["code"][0]
    with_bias = scorer(ckpt.params, ckpt.balance, batch, routing=True)["routing"]["counts_le"]
    without = scorer(ckpt.params, {}, batch, routing=True)["routing"]["counts_le"]
    assert not np.array_equal(with_bias, without)


def test_bits_per_byte_equals_an_independent_computation(erun, ckpt, scorer):
    batches = make_eval_batches(["code"], seq_len=erun.cfg.train.seq_len, batch_size=8, batches_per_domain=1,
                                dataset=erun.dataset)
    code = heldout_losses(scorer, ckpt, batches, erun.tokenizer, progress=False)[0]["domains"]["code"]
    batches = batches["code"]
    nats = nbytes = 0.0
    for batch in batches:
        for row in range(len(batch["inputs"])):
            ids = np.concatenate([batch["inputs"][row, :1], batch["targets"][row]])
            segments = batch["segment_ids"][row]
            logp = np.zeros(len(ids) - 1)
            for seg in np.unique(segments):  # each document on its own, positions from 0
                where = np.flatnonzero(segments == seg)
                logp[where] = model_logprobs(erun, ckpt, np.concatenate([ids[where], ids[where[-1] + 1:][:1]]))
            mask = batch["loss_mask"][row] > 0
            nats -= logp[mask].sum()
            text = bytes(int(t) for t in batch["targets"][row][mask] if t < 256)
            nbytes += len(text)
    assert code["bytes"] == nbytes
    assert code["bits_per_byte"] == pytest.approx(nats / math.log(2) / nbytes, rel=1e-5)


def test_bpe_bytes_are_the_decoded_utf8_length():
    tokenizer = train_bpe(["héllo wörld, 中文 text " * 20, "plain ascii words here " * 20], 300)
    text = "héllo 中文 wörld"
    ids = tokenizer.encode(text)
    mask = np.ones((1, len(ids)), np.float32)
    assert target_bytes(tokenizer, ids[None], mask) == len(text.encode("utf-8"))
    mask[0, 0] = 0
    assert target_bytes(tokenizer, ids[None], mask) == len(tokenizer.decode(ids[1:]).encode("utf-8"))


def test_multiple_choice_loglik_equals_numpy(erun, ckpt, scorer):
    items = (
        {"context": "import os\n", "choices": [" path", "\n", "def main():\n    return 1"], "gold": 0},
        {"context": "The garden " * 12, "choices": [" was", " qzx"], "gold": 1},  # cut to 128: another bucket
        {"context": "x", "choices": [" y", "z" * 200], "gold": 0},  # a choice longer than the context: skipped
    )
    task = Task("hand", "multiple_choice", items, "test")
    tokenizer = erun.tokenizer
    loglik, num_tokens, _ = choice_logliks(scorer, ckpt, task, tokenizer, max_len=128, batch_size=8, progress=False)
    assert {i for i, _ in loglik} == {0, 1}
    correct = []
    for i, item in enumerate(items[:2]):
        context = tokenizer.encode(item["context"])
        expected = []
        for c, choice in enumerate(item["choices"]):
            choice_ids = tokenizer.encode(choice)
            ids = np.concatenate([context, choice_ids])[-129:]
            expected.append(model_logprobs(erun, ckpt, ids)[-len(choice_ids):].sum())
            assert loglik[i, c] == pytest.approx(expected[-1], abs=1e-4)
            assert num_tokens[i, c] == len(choice_ids)
        correct.append(int(np.argmax(expected)) == item["gold"])
    result, _ = score_multiple_choice(scorer, ckpt, task, tokenizer, max_len=128, batch_size=8, progress=False)
    assert result["items"] == 2 and result["skipped"] == 1
    assert result["accuracy"] == np.mean(correct)
    gold = [loglik[i, item["gold"]] for i, item in enumerate(items[:2])]
    assert result["gold_logprob"] == pytest.approx(np.mean(gold), abs=1e-6)


def test_exact_match_answer_logprob_is_teacher_forced(erun, ckpt, scorer):
    items = ({"prompt": "Q: What is 2 + 3?\nA:", "answer": " 5"}, {"prompt": "Q: What is 10 - 4?\nA:", "answer": " 6"})
    task = Task("em", "exact_match", items, "test")
    tokenizer = erun.tokenizer
    got, tokens_run = answer_logprob(scorer, ckpt, task, tokenizer, max_len=128, batch_size=8, progress=False)
    expected = []
    for item in items:
        answer_ids = tokenizer.encode(item["answer"])
        ids = np.concatenate([tokenizer.encode(item["prompt"]), answer_ids])
        expected.append(model_logprobs(erun, ckpt, ids)[-len(answer_ids):].sum())
    assert got == pytest.approx(np.mean(expected), abs=1e-4)
    assert tokens_run > 0


def test_length_normalisation_picks_by_token_and_by_byte():
    loglik = np.array([[-2.0, -3.0]])
    gold = np.array([1])
    metrics = multiple_choice_metrics(loglik, tokens_nc=np.array([[1, 6]]), bytes_nc=np.array([[4, 2]]), gold_n=gold)
    assert metrics["accuracy"] == 0.0  # raw: -2 > -3 picks choice 0
    assert metrics["accuracy_per_token"] == 1.0  # -2/1 < -3/6 picks choice 1
    assert metrics["accuracy_per_byte"] == 0.0  # -2/4 > -3/2 picks choice 0
    assert metrics["gold_logprob"] == -3.0  # the gold choice's log-likelihood, whichever is picked


def test_expected_calibration_error_by_hand():
    confidence = np.array([0.85, 0.85, 0.55, 0.55, 0.25])
    correct = np.array([1, 0, 1, 1, 0])
    # bins: (0.8, 0.9]: acc 0.5 vs 0.85; (0.5, 0.6]: acc 1 vs 0.55; (0.2, 0.3]: acc 0 vs 0.25
    expected = 2 / 5 * 0.35 + 2 / 5 * 0.45 + 1 / 5 * 0.25
    assert expected_calibration_error(confidence, correct) == pytest.approx(expected)
    assert expected_calibration_error(np.array([0.75] * 4), np.array([1, 1, 1, 0])) == pytest.approx(0.0)
    probs = choice_probabilities(np.log(np.array([[1.0, 3.0], [2.0, 2.0]])))
    np.testing.assert_allclose(probs, [[0.25, 0.75], [0.5, 0.5]])


@pytest.mark.parametrize("line, message", [
    ('{"context": "a", "choices": [" b", " c"], "gold": 2}',
     "line 2: field 'gold' must be an integer index into 'choices' (0..1), got 2"),
    ('{"context": "a", "choices": [" b"], "gold": 0}', "line 2: field 'choices' must be a list of at least 2"),
    ('{"context": "a", "gold": 0}', "line 2: a multiple-choice item lacks field 'choices'"),
    ('{"context": "a", "choices": [" b", " c"], "gold": 0', "line 2: not valid JSON"),
    ('{"prompt": "a", "answer": "b"}', "line 2: an exact-match item, but line 1 is a multiple-choice item"),
    ('{"question": "a"}', "line 2: expected either a multiple-choice item"),
])
def test_bad_task_file_names_file_line_and_field(tmp_path, line, message):
    path = tmp_path / "quiz.jsonl"
    path.write_text('{"context": "a", "choices": [" b", " c"], "gold": 1}\n' + line + "\n")
    with pytest.raises(TaskFileError) as info:
        load_task_file(path)
    assert str(path) in str(info.value) and message in str(info.value)


def test_cli_reports_a_bad_task_file(workdir, tmp_path, capsys):
    path = tmp_path / "broken.jsonl"
    path.write_text('{"prompt": "Q: 1 + 1?", "answer": 2}\n')
    with pytest.raises(SystemExit) as info:
        eval_cli.main(["--workdir", workdir, "--tasks", str(path), "--no-progress"])
    assert info.value.code == 2
    assert f"{path}, line 1: field 'answer' must be a string, got 2" in capsys.readouterr().err


def test_masked_experts_get_zero_load(erun, ckpt, scorer):
    moe = erun.cfg.model.moe
    batch = make_eval_batches(["prose"], seq_len=erun.cfg.train.seq_len, batch_size=8, batches_per_domain=1,
                              dataset=erun.dataset)["prose"][0]
    masking = Scorer(erun.run, masked_balancer(erun.run.balancer, RoutingSetup.from_config(erun.cfg)), moe.num_experts)
    nothing = np.zeros((1, moe.num_experts), bool)
    before = masking(ckpt.params, mask_state(ckpt.balance, nothing, moe.experts_per_token), batch, routing=True)
    plain = scorer(ckpt.params, ckpt.balance, batch)
    np.testing.assert_allclose(before["logprob_b"], plain["logprob_b"], rtol=1e-6)  # an empty mask changes nothing

    masked = least_used(before["routing"]["counts_le"], 2)
    assert masked.sum() == 2
    after = masking(ckpt.params, mask_state(ckpt.balance, masked, moe.experts_per_token), batch, routing=True)
    counts = after["routing"]["counts_le"]
    assert np.all(counts[masked] == 0)
    assert counts.sum() == before["routing"]["counts_le"].sum()  # every token still routes to k experts
    assert not np.allclose(after["logprob_b"], before["logprob_b"])
    with pytest.raises(ValueError, match="fewer than the 2 each token chooses"):
        mask_state(ckpt.balance, least_used(counts, 3), moe.experts_per_token)


def test_eval_draws_no_progress_bars_into_a_file(workdir, tmp_path, capsys):
    """stderr redirected to a file (not a terminal): no tqdm redraws in it, without --no-progress."""
    import shutil

    run = shutil.copytree(workdir, tmp_path / "run")
    shutil.rmtree(run / "eval", ignore_errors=True)  # results earlier tests wrote into the shared workdir
    capsys.readouterr()
    eval_cli.main(["--workdir", str(run), "--tasks", "--loss-batches", "1"])
    err = capsys.readouterr().err
    assert "\r" not in err and "batch/s" not in err and "it/s" not in err, err[-500:]
