"""Data-constrained domains: a fixed pool of unique tokens, repeated, with epochs counted per domain."""

from __future__ import annotations

import json

import numpy as np
import pytest

from moejax.data.dataset import open_dataset
from moejax.data.pipeline import make_train_iterator
from moejax.data.pools import dataset_pools, parse_unique_tokens, pool_windows
from moejax.errors import DataError

SEQ = 32


def _windows(it, steps):
    """Input rows (as bytes) of the math rows of ``steps`` batches."""
    seen = []
    for _ in range(steps):
        b = next(it)
        for row, dom in zip(b["inputs"], b["domain"][:, 0] if b["domain"].ndim > 1 else b["domain"]):
            seen.append((int(dom), row.tobytes()))
    return seen


def test_a_pool_is_repeated_and_its_epochs_counted(corpus_cache):
    pool = 40 * SEQ  # 40 windows of math
    it = make_train_iterator({"math": 0.5, "code": 0.5}, seq_len=SEQ, global_batch_size=8, seed=0, cache_dir=corpus_cache,
                             unique_tokens={"math": pool})
    rows = _windows(it, 30)
    math_id = it.dataset.domains.index("math")
    math_rows = [r for d, r in rows if d == math_id]
    assert len(set(math_rows)) <= 40 < len(math_rows)  # only the pool's 40 windows, repeated
    epochs = it.epochs()
    assert epochs["math"] == pytest.approx(len(math_rows) / 40)
    assert epochs["math"] > 2 and epochs["code"] < 0.05
    # the same pool whatever the seed; a smaller pool is part of a larger one
    other = make_train_iterator({"math": 1.0}, seq_len=SEQ, global_batch_size=8, seed=7, cache_dir=corpus_cache,
                                unique_tokens={"math": pool})
    assert len(set(math_rows) | {r for _, r in _windows(other, 20)}) <= 40
    assert set(pool_windows(1000, 10 * SEQ, SEQ, "math")) <= set(pool_windows(1000, 40 * SEQ, SEQ, "math"))


def test_pool_state_round_trips_and_is_checked(corpus_cache):
    kw = dict(seq_len=SEQ, global_batch_size=4, seed=1, cache_dir=corpus_cache)
    it = make_train_iterator({"math": 1.0}, unique_tokens={"math": 20 * SEQ}, **kw)
    _windows(it, 9)
    state = json.loads(json.dumps(it.get_state()))
    again = make_train_iterator({"math": 1.0}, unique_tokens={"math": 20 * SEQ}, **kw)
    again.set_state(state)
    assert np.array_equal(next(it)["inputs"], next(again)["inputs"])
    assert again.epochs() == it.epochs()
    with pytest.raises(DataError, match="unique_tokens"):
        make_train_iterator({"math": 1.0}, unique_tokens={"math": 30 * SEQ}, **kw).set_state(state)
    # a run without pools keeps the iterator state it always had
    assert "unique_tokens" not in make_train_iterator({"math": 1.0}, **kw).get_state()["made_with"]


def test_bad_pools_name_the_key_and_the_fix(corpus_cache):
    assert parse_unique_tokens("code=2e6, math=500000") == {"code": 2000000, "math": 500000}
    with pytest.raises(DataError, match="DOMAIN=TOKENS"):
        parse_unique_tokens("code")
    ds = open_dataset("", corpus_cache)
    with pytest.raises(DataError, match="does not have"):
        dataset_pools(ds, "cobol=100")
    with pytest.raises(DataError, match="allowed: at most"):
        dataset_pools(ds, "math=1000000000")


def test_prepare_records_a_pool_that_training_reads(tmp_path):
    from moejax.data.prepare import main
    from moejax.data.synthetic_math import math_documents

    src = tmp_path / "math.jsonl"
    src.write_text("\n".join(json.dumps({"text": d}) for d in math_documents(1, 40_000)) + "\n")
    out = tmp_path / "ds"
    assert main(["--source", f"math={src}", "--out", str(out), "--heldout-fraction", "0.2", "--seq-len", "32",
                 "--unique-tokens", "math=3200", "--workers", "1"]) == 0
    assert json.loads((out / "dataset.json").read_text())["domains"]["math"]["unique_tokens"] == 3200
    ds = open_dataset(str(out))
    assert dataset_pools(ds) == {"math": 3200}
    assert dataset_pools(ds, "math=640") == {"math": 640}  # the run's config wins
    it = make_train_iterator({"math": 1.0}, seq_len=SEQ, global_batch_size=10, seed=0, dataset=ds,
                             unique_tokens=dataset_pools(ds))
    _windows(it, 20)
    assert it.epochs()["math"] == pytest.approx(200 / 100)  # 3200 tokens = 100 windows of 32
    with pytest.raises(SystemExit) as bad:
        main(["--source", f"math={src}", "--out", str(tmp_path / "bad"), "--unique-tokens", "code=10"])
    assert bad.value.code == 2
