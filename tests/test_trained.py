"""``moejax.load``: a checkpoint as a Python object (moejax/trained.py), checked against the
reference forward of tests/test_eval.py and the generation the CLI does."""

from __future__ import annotations

import numpy as np
import pytest

import moejax
from moejax.errors import ConfigError
from moejax.eval.generator import Generator
from tests.test_eval import ckpt, erun, model_logprobs, reference_logits, workdir  # noqa: F401 (shared fixtures)


@pytest.fixture(scope="module")
def model(workdir):
    return moejax.load(workdir)


def test_load_gives_the_run_its_config_and_tokenizer(model, erun, ckpt):
    assert model.step == ckpt.step == erun.steps[-1]
    assert model.config.model.num_layers == erun.cfg.model.num_layers
    assert model.tokenizer.name == erun.tokenizer.name
    assert model.tokenizer.decode(model.tokenizer.encode("def f(x):")) == "def f(x):"
    with pytest.raises(ConfigError, match=r"has no checkpoint at step 12345; steps: \["):
        moejax.load(model.workdir, step=12345)


def test_logits_equal_the_reference_forward_single_and_batched(model, erun, ckpt):
    ids = model.tokenizer.encode("def main():\n    return 1\n")
    logits = model.logits(ids)
    assert logits.shape == (len(ids), erun.cfg.model.vocab_size)
    np.testing.assert_allclose(logits, reference_logits(erun, ckpt, ids), atol=2e-4, rtol=2e-4)
    batch = model.logits(np.stack([ids, ids[::-1]]))
    np.testing.assert_allclose(batch[0], logits, atol=2e-4, rtol=2e-4)
    np.testing.assert_allclose(batch[1], reference_logits(erun, ckpt, ids[::-1]), atol=2e-4, rtol=2e-4)
    with pytest.raises(ConfigError, match=r"past the 64 the model was trained on"):
        model.logits(np.zeros(65, np.int32))


def test_loss_is_the_mean_nll_per_token_after_eos(model, erun, ckpt):
    text = "Q: What is 2 + 3?\nA: 5\n"
    eos = model.tokenizer.eos_id
    ids = np.concatenate([[eos], model.tokenizer.encode(text), [eos]]).astype(np.int32)
    expected = -model_logprobs(erun, ckpt, ids).mean()
    assert model.loss(text) == pytest.approx(expected, rel=1e-4)
    assert model.loss(list(ids[1:-1])) == pytest.approx(expected, rel=1e-4)  # ids work like text
    both = model.loss([text, "x" * 150])  # the second is longer than one window (seq_len 64)
    assert both[0] == pytest.approx(expected, rel=1e-4) and np.isfinite(both[1])


def test_generate_is_the_generators_greedy_continuation(model, erun, ckpt):
    prompt = "Q: What is 2 + 3?\nA:"
    ids = model.tokenizer.encode(prompt)
    generator = Generator(erun.run, erun.cfg, max_len=32 + 8, balancer=erun.run.balancer,
                          num_tokens=model.tokenizer.vocab_size)
    (row,) = generator.generate(ckpt.params, ckpt.balance, [ids], max_new_tokens=8,
                                stop_ids=(model.tokenizer.eos_id,))
    assert model.generate(prompt, max_new_tokens=8) == model.tokenizer.decode(row)
    assert model.generate([prompt, "def "], max_new_tokens=4, temperature=0.8, seed=1) == \
        model.generate([prompt, "def "], max_new_tokens=4, temperature=0.8, seed=1)


def test_the_example_notebook_runs_as_a_script(workdir):
    """experiments/notebooks/load_checkpoint.py, the documented example, on the shared run."""
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "experiments/notebooks/load_checkpoint.py"], cwd=root, capture_output=True,
                          text=True, timeout=600, env={**os.environ, "MOEJAX_WORKDIR": workdir})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "TrainedModel(" in proc.stdout and "nats/token" in proc.stdout and "most likely next tokens" in proc.stdout
