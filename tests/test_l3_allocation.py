"""Tests for moejax.model.l3_allocation: the L3 allocation format (``offsets_v1``), its
checks, the uniform allocation and the allocation file."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from moejax.model.l3_allocation import lzw_allocation
from moejax.errors import DataError
from moejax.model.l3_allocation import (
    FORMAT,
    Allocation,
    check_allocation,
    load_allocation,
    offsets_sha256,
    save_allocation,
    uniform_allocation,
)

A, B = 0, 1
ABAB = np.array([A, B] * 4)  # a b a b a b a b


# --- uniform ---------------------------------------------------------------------------------------


def test_uniform_allocation():
    np.testing.assert_array_equal(np.diff(uniform_allocation(10, 25, 3)), [3] * 5 + [2] * 5)
    np.testing.assert_array_equal(uniform_allocation(4, 4, 1), [0, 1, 2, 3, 4])
    np.testing.assert_array_equal(uniform_allocation(4, 12, 3), [0, 3, 6, 9, 12])
    offsets = uniform_allocation(259, 4096, 64)
    check_allocation(offsets, 259, 4096, 64)
    assert set(np.diff(offsets).tolist()) == {15, 16}


# --- validation errors --------------------------------------------------------------------------


@pytest.mark.parametrize("offsets, kwargs, message", [
    ([0, 1, 2, 3], {}, r"allocation has 3 tokens but the vocabulary has 4.*--vocab-size 4"),
    ([0, 1, 2, 3, 4, 5], {}, r"allocation has 5 tokens but the vocabulary has 4"),
    ([0, 2, 1, 3, 4], {}, r"not monotone: offsets\[2\] = 1 < offsets\[1\] = 2"),
    ([0, 1, 1, 3, 4], {}, r"token 1 gets 0 rows"),
    ([0, 1, 9, 10, 11], {"max_rows": 4}, r"token 1 gets 8 rows, more than max_rows=4"),
    ([1, 2, 3, 4, 5], {}, r"must start at 0, got offsets\[0\] = 1"),
    ([0, 1, 2, 3, 5], {"budget": 4}, r"allocation holds 5 rows but the budget is 4"),
    ([0, 1, 2, 3, 4], {"budget": 3}, r"budget 3 is smaller than the vocabulary \(4 tokens\)"),
    ([0, 1, 2, 3, 4], {"max_rows": 0}, r"max_rows must be an int >= 1"),
    ([0, 1, 2, 3, 20], {"budget": 20, "max_rows": 4}, r"budget 20 cannot be spent"),
    ([0.0, 1.0, 2.0, 3.0, 4.0], {}, r"1-D integer array of shape \[V \+ 1\], got float64\[5\]"),
    ([[0, 1, 2, 3, 4]], {}, r"1-D integer array"),
])
def test_check_allocation_errors(offsets, kwargs, message):
    with pytest.raises(DataError, match=message):
        check_allocation(np.asarray(offsets), 4, **kwargs)


def test_check_allocation_accepts_valid_offsets():
    check_allocation([0, 1, 3, 6, 7], 4)
    check_allocation(np.array([0, 1, 3, 6, 7], np.int32), 4, budget=7, max_rows=3)


# --- allocation files ---------------------------------------------------------------------------


def _save(path, offsets=None, max_rows=8):
    offsets = lzw_allocation(ABAB, 3, 9, max_rows) if offsets is None else offsets
    return save_allocation(path, offsets, method="lzw", max_rows=max_rows, tokenizer="byte",
                           sample_tokens=8)


def test_save_load_round_trip(tmp_path):
    path = tmp_path / "sub" / "alloc.json"
    offsets = lzw_allocation(ABAB, 3, 9, 8)
    sha = _save(path, offsets)
    assert sha == offsets_sha256(offsets) == offsets_sha256(offsets.astype(np.int32))
    record = json.loads(path.read_text())
    assert record == {"format": FORMAT, "vocab_size": 3, "budget": 9, "max_rows": 8, "method": "lzw",
                      "tokenizer": "byte", "sample_tokens": 8, "offsets": offsets.tolist(),
                      "sha256": sha}
    alloc = load_allocation(path, vocab_size=3)
    assert isinstance(alloc, Allocation)
    np.testing.assert_array_equal(alloc.offsets, offsets)
    assert alloc.offsets.dtype == np.int64 and not alloc.offsets.flags.writeable
    assert (alloc.budget, alloc.max_rows, alloc.method, alloc.tokenizer, alloc.sha256,
            alloc.sample_tokens, alloc.vocab_size) == (9, 8, "lzw", "byte", sha, 8, 3)
    np.testing.assert_array_equal(alloc.rows, np.diff(offsets))
    assert load_allocation(path).sha256 == sha  # vocab_size is optional
    assert not list(path.parent.glob(".*.tmp"))


def test_save_validates_before_writing(tmp_path):
    path = tmp_path / "alloc.json"
    with pytest.raises(DataError, match=r"token 2 gets 5 rows, more than max_rows=4"):
        _save(path, np.array([0, 1, 2, 7]), max_rows=4)
    with pytest.raises(DataError, match=r"1-D integer array of shape \[V \+ 1\], got int64\[1, 4\]"):
        _save(path, np.array([[0, 1, 2, 3]]))
    with pytest.raises(DataError, match=r"method must be a non-empty string"):
        save_allocation(path, np.array([0, 1, 2, 3]), method="", max_rows=1, tokenizer="byte",
                        sample_tokens=0)
    assert not path.exists()


def test_load_tampered_file(tmp_path):
    path = tmp_path / "alloc.json"
    _save(path)
    record = json.loads(path.read_text())
    record["offsets"][1] += 1  # still a valid allocation, but not the one that was hashed
    record["offsets"][2] += 1
    path.write_text(json.dumps(record))
    with pytest.raises(DataError, match=rf"{path} is corrupt or was edited: its offsets do not "
                                        r"match the sha256"):
        load_allocation(path)


def test_load_errors_name_the_file(tmp_path):
    path = tmp_path / "alloc.json"
    with pytest.raises(DataError, match=rf"{path} does not exist. Create it with: python -m "
                                        "moejax.data.l3_alloc"):
        load_allocation(path)
    path.write_text("{not json")
    with pytest.raises(DataError, match=rf"cannot read L3 allocation file {path}"):
        load_allocation(path)
    path.write_text(json.dumps({"format": "moejax-prepared-v1"}))
    with pytest.raises(DataError, match=rf"{path} is not an L3 allocation file: its format is "
                                        "'moejax-prepared-v1'"):
        load_allocation(path)
    path.write_text(json.dumps({"format": FORMAT, "offsets": [0, 1]}))
    with pytest.raises(DataError, match=rf"{path} lacks vocab_size, budget, max_rows"):
        load_allocation(path)
    path.write_text(json.dumps({**{k: 1 for k in ("vocab_size", "budget", "max_rows", "sample_tokens")},
                                "format": FORMAT, "method": "lzw", "tokenizer": "byte",
                                "offsets": [0, 1.5], "sha256": ""}))
    with pytest.raises(DataError, match=rf"{path} holds a non-integer offset or count"):
        load_allocation(path)
    _save(path)
    record = json.loads(path.read_text())
    record["max_rows"] = 3  # hash still matches: the offsets were not touched
    path.write_text(json.dumps(record))
    with pytest.raises(DataError, match=rf"L3 allocation file {path}: token \d gets \d rows, more "
                                        "than max_rows=3"):
        load_allocation(path)


def test_load_vocab_mismatch(tmp_path):
    path = tmp_path / "alloc.json"
    _save(path)
    with pytest.raises(DataError, match=rf"L3 allocation file {path}: allocation has 3 tokens but "
                                        r"the vocabulary has 259.*--vocab-size 259 --budget 9"):
        load_allocation(path, vocab_size=259)


def test_a_configured_allocation_file_is_read_once_per_run(tmp_path, monkeypatch):
    """Validation and set-up both ask for the allocation; the file is read once while it is
    unchanged, and read again once it is rewritten."""
    from moejax.checks import validate
    from moejax.config import default_config
    from moejax.model import l3_allocation
    from moejax.model.l3_allocation import allocation_from_config, save_allocation, uniform_allocation

    cfg = default_config()
    cfg.model.vocab_size, cfg.model.l3.after_layers = 272, (1,)
    path = tmp_path / "alloc.json"
    offsets = uniform_allocation(272, cfg.model.l3.budget, cfg.model.l3.max_rows)
    save_allocation(path, offsets, method="uniform", max_rows=cfg.model.l3.max_rows, tokenizer="byte",
                    sample_tokens=0)
    cfg.model.l3.allocation = str(path)
    reads = []
    real = l3_allocation.load_allocation
    monkeypatch.setattr(l3_allocation, "load_allocation", lambda *a, **k: reads.append(a) or real(*a, **k))
    validate(cfg, 8)  # reads it (the checks)
    first = allocation_from_config(cfg.model)  # set-up: the same reading
    assert len(reads) == 1 and first.method == "uniform"
    save_allocation(path, offsets, method="lzw", max_rows=cfg.model.l3.max_rows, tokenizer="byte",
                    sample_tokens=5)
    os.utime(path, ns=(1, 1))  # a new modification time, whatever the clock's resolution
    assert allocation_from_config(cfg.model).method == "lzw" and len(reads) == 2
