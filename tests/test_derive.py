"""Values the program derives from the dataset instead of asking for them (moejax/derive.py):
the vocabulary size from the tokenizer and a prepared dataset's own mixture; independent data
errors said at once."""

from __future__ import annotations

import json

import pytest

from moejax import checks
from moejax.config import default_config
from moejax.errors import DataError
from moejax.data.prepare import prepare_dataset

OPTIONS = dict(heldout_fraction=0.3, shard_mb=0.02, workers=1, progress=False, seq_len=32)


@pytest.fixture(scope="module")
def bpe_dataset(tmp_path_factory) -> str:
    """Three domains of unequal size, a 400-token BPE (more than the default 272 embedding rows)."""
    root = tmp_path_factory.mktemp("derive")
    for name, count in (("a", 300), ("b", 100), ("c", 100)):
        with open(root / f"{name}.jsonl", "w") as f:
            for i in range(count):
                f.write(json.dumps({"text": f"{name} document {i}: " + f"word{i % 17} " * 12}) + "\n")
    out = str(root / "ds")
    prepare_dataset([f"{name}={root / name}.jsonl" for name in "abc"], out, tokenizer="bpe", vocab_size=400,
                    **OPTIONS)
    return out


def _cfg(path: str):
    cfg = default_config()
    cfg.train.seq_len, cfg.train.global_batch_size, cfg.train.eval_batches = 32, 8, 1
    cfg.data.path = path
    return cfg


def test_vocab_size_and_mixture_come_from_the_dataset_with_a_log_line(bpe_dataset, caplog):
    cfg = _cfg(bpe_dataset)
    with caplog.at_level("INFO", logger="moejax"):
        _, info = checks.check_config(cfg)
    assert cfg.model.vocab_size == 512  # 400 rounded up to a multiple of 128
    assert "derived model.vocab_size=512 from the tokenizer of prepared dataset" in caplog.text
    with open(f"{bpe_dataset}/dataset.json") as f:
        tokens = {d: v["train_tokens"] for d, v in json.load(f)["domains"].items()}
    mixture = dict(cfg.data.mixture)
    assert set(mixture) == set(info.domains) == {"a", "b", "c"}
    for domain, count in tokens.items():  # in proportion to each domain's training tokens
        assert mixture[domain] == pytest.approx(count / sum(tokens.values()), abs=1e-5)
    assert mixture["a"] > 2 * mixture["b"]
    assert "derived data.mixture from prepared dataset" in caplog.text
    assert "--config.data.default_mixture=uniform gives equal weights" in caplog.text


def test_uniform_switch_and_what_the_user_set_is_kept(bpe_dataset):
    cfg = _cfg(bpe_dataset)
    cfg.data.default_mixture = "uniform"
    checks.check_config(cfg)
    assert dict(cfg.data.mixture) == pytest.approx({"a": 1 / 3, "b": 1 / 3, "c": 1 / 3})
    cfg = _cfg(bpe_dataset)  # an experiment's own mixture and vocabulary are its choice
    cfg.data.mixture = {"a": 1.0}
    cfg.model.vocab_size = 1024
    checks.check_config(cfg)
    assert (dict(cfg.data.mixture), cfg.model.vocab_size) == ({"a": 1.0}, 1024)
    cfg = _cfg(bpe_dataset)  # the built-in corpus keeps its default mixture
    cfg.data.path = ""
    checks.check_config(cfg)
    assert dict(cfg.data.mixture) == dict(default_config().data.mixture) and cfg.model.vocab_size == 272


def test_a_value_set_on_the_command_line_is_checked_not_replaced_and_errors_come_together(bpe_dataset):
    cfg = _cfg(bpe_dataset)
    cfg.model.vocab_size = 300
    cfg.data.mixture = {"a": 1.0, "nope": 1.0}
    with pytest.raises(DataError) as caught:
        checks.check_config(cfg, changed=("model.vocab_size", "data.mixture"))
    message = str(caught.value)
    assert message.startswith("2 problems: (1) data.mixture names domain 'nope'")
    assert "(2) config key 'model.vocab_size' has value 300; allowed: at least the vocabulary" in message
    assert "Set --config.model.vocab_size=512" in message
