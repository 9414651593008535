"""Generation with a KV cache: equivalence with the full forward pass, top-p sampling, seeding, CLI."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from moejax import generate as generate_cli
from moejax.eval.generator import Generator
from moejax.model.decode import next_token, top_p_mask
from tests.test_eval import ckpt, erun, reference_logits, workdir  # noqa: F401 (shared fixtures)


def test_cached_greedy_decoding_equals_recomputing_the_full_forward(erun, ckpt):
    tokenizer = erun.tokenizer
    prompts = [tokenizer.encode("def main():\n    "), tokenizer.encode("Q: What is 2 + 3?\nA:"), tokenizer.encode("A")]
    generator = Generator(erun.run, erun.cfg, max_len=64, balancer=erun.run.balancer)
    rows, logits_sbv = generator.generate(ckpt.params, ckpt.balance, prompts, max_new_tokens=20, return_logits=True)
    for b, (prompt, new) in enumerate(zip(prompts, rows)):
        assert len(new) == 20  # no stop ids given: the whole budget
        ids = list(prompt)
        for step in range(20):
            logits_v = reference_logits(erun, ckpt, np.array(ids))[-1]
            assert int(np.argmax(logits_v)) == new[step]
            np.testing.assert_allclose(logits_sbv[step, b], logits_v, atol=2e-5, rtol=1e-5)
            ids.append(int(new[step]))


def test_top_p_keeps_only_the_nucleus():
    logits = jnp.log(jnp.array([[0.5, 0.3, 0.15, 0.05]]))
    keep = lambda p: np.asarray(top_p_mask(logits, jnp.float32(p)))[0].tolist()
    assert keep(0.5) == [True, False, False, False]  # the top token alone holds 0.5
    assert keep(0.7) == [True, True, False, False]
    assert keep(0.85) == [True, True, True, False]
    assert keep(1.0) == [True, True, True, True]
    keys = jax.random.split(jax.random.key(0), 4000)
    draws = np.asarray(jax.vmap(lambda k: next_token(logits, k, jnp.float32(1.0), jnp.float32(0.7))[0])(keys))
    assert set(np.unique(draws).tolist()) == {0, 1}
    assert np.mean(draws == 0) == pytest.approx(0.5 / 0.8, abs=0.03)  # renormalised within the nucleus
    greedy = next_token(logits, jax.random.key(1), jnp.float32(0.0), jnp.float32(0.1))
    assert int(greedy[0]) == 0


def test_sampling_is_seeded(erun, ckpt):
    generator = Generator(erun.run, erun.cfg, max_len=64, balancer=erun.run.balancer)
    prompt = [erun.tokenizer.encode("The ")]
    run = lambda seed: generator.generate(ckpt.params, ckpt.balance, prompt, max_new_tokens=24, temperature=1.0,
                                          top_p=0.95, seed=seed)[0].tolist()
    assert run(0) == run(0)
    assert run(0) != run(1)


def test_generate_cli_prints_the_continuation(workdir, capsys):
    generate_cli.main(["--workdir", workdir, "--prompt", "def ", "--max-new-tokens", "8", "--seed", "3",
                       "--temperature", "0.7", "--top-p", "0.9"])
    out = capsys.readouterr().out
    assert "--- step 5" in out and "\ndef " in out
    with pytest.raises(SystemExit):
        generate_cli.main(["--workdir", workdir, "--prompt", "x", "--top-p", "0"])


def test_generation_past_the_trained_context_is_refused_with_the_budget_that_fits():
    from moejax.errors import ConfigError

    prompts = [np.arange(5), np.arange(10)]
    generate_cli.check_context(prompts, 246, 256)  # 10 + 246 = 256 fits
    with pytest.raises(ConfigError, match=r"--max-new-tokens 100000 with a prompt of 10 tokens needs 100010 "
                                          r"positions, past the 256 .* Use --max-new-tokens 246 or fewer, or pass "
                                          r"--beyond-context"):
        generate_cli.check_context(prompts, 100000, 256)
    with pytest.raises(ConfigError, match="Shorten the prompt"):
        generate_cli.check_context([np.arange(300)], 1, 256)


def test_a_cache_larger_than_the_free_memory_is_refused_with_the_budget_that_fits():
    from moejax.config import ConfigError, default_config

    cfg = default_config()  # 4 layers x 2 kv heads x head_dim 32, float32: 2 KiB of cache per position
    prompts = [np.arange(5)]
    per_position = generate_cli.memory_bytes(cfg, 1, 1, 0)
    generate_cli.check_memory(cfg, prompts, 1000, available=2**30)
    with pytest.raises(ConfigError, match=r"--max-new-tokens 100,000,000 needs about \d+\.\d GiB \(the key/value "
                                          r"cache of 100,000,016 positions for 1 prompt\(s\)\), more than the 0\.8 GiB "
                                          r"generation may use \(80% of the 1\.0 GiB free on cpu\)\. Use "
                                          r"--max-new-tokens ([\d,]+) or fewer\.") as error:
        generate_cli.check_memory(cfg, prompts, 100_000_000, available=2**30)
    fits = int(str(error.value).split("Use --max-new-tokens ")[1].split(" ")[0].replace(",", ""))
    generate_cli.check_memory(cfg, prompts, fits, available=2**30)  # the number it names fits
    assert generate_cli.memory_bytes(cfg, 1, generate_cli.cache_len(prompts, fits + 2), fits + 2) > 0.8 * 2**30
    assert per_position == 2 * 4 * 2 * 32 * 4


def test_text_streams_as_tokens_come_and_a_split_character_prints_once_whole():
    from moejax.data.tokenizer import ByteTokenizer

    tokenizer, written = ByteTokenizer(), []
    stream = generate_cli.TextStream(tokenizer, (tokenizer.eos_id,), write=written.append)
    for token in tokenizer.encode("ab é c"):
        stream(np.array([token]))
    stream(np.array([tokenizer.eos_id]))
    stream(np.array(tokenizer.encode("x")))  # after the stop id: nothing
    assert "".join(written) == "ab é c" and len(written) >= 4  # piece by piece, never a broken character
    assert "\ufffd" not in "".join(written)


def test_a_prompt_that_is_not_utf8_is_one_paragraph_before_loading(tmp_path, capsys):
    prompt = b"caf\xe9 ok".decode("utf-8", "surrogateescape")  # what Python makes of a Latin-1 argument
    with pytest.raises(SystemExit) as exit_:
        generate_cli.main(["--workdir", str(tmp_path / "none"), "--prompt", "fine", "--prompt", prompt])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("moejax.generate: error: --prompt 2") and "Traceback" not in err, err
    assert "byte 0xe9 at position 3 is not valid UTF-8" in err and len(err.strip().splitlines()) == 1
