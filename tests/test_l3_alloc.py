"""Tests for moejax.data.l3_alloc: rows per token of a Large Lookup Layer (the LZW allocation),
budget checks, token sampling and the command line (the format, the uniform allocation and the
allocation file: tests/test_l3_allocation.py).

The CLI test on the built-in corpus uses the default corpus cache, ``$MOEJAX_CACHE``, which
tests/conftest.py points at the run's shared cache (built once per run, ``corpus_cache``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from moejax.errors import ConfigError
from moejax.data import l3_alloc
from moejax.errors import DataError
from moejax.data.l3_alloc import (
    check_allocation,
    check_budget,
    default_out_path,
    load_allocation,
    lzw_allocation,
    lzw_codewords,
    sample_train_tokens,
    uniform_allocation,
)
from moejax.data.prepare import prepare_dataset
from moejax.data.streams import TokenStream

A, B, C = 0, 1, 2
ABAB = np.array([A, B] * 4)  # a b a b a b a b


def _zipf_stream(n: int, vocab: int, seed: int = 0) -> np.ndarray:
    """Token ids with a Zipf-like frequency: id 0 most frequent, id vocab-1 least."""
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, vocab + 1) ** 1.1
    return rng.choice(vocab, size=n, p=p / p.sum())


def _reference_allocation(tokens, vocab_size, budget, max_rows):
    """Steps 2-4 of ``lzw_allocation`` as the plain sequential loop of the paper's Algorithm 1."""
    counts, last = lzw_codewords(tokens, vocab_size)
    ranked = sorted((c for c in range(len(counts)) if counts[c]), key=lambda c: (-counts[c], c))
    rows = [1] * vocab_size
    left = budget - vocab_size
    for order in ([int(last[c]) for c in ranked], list(range(vocab_size))):
        while left and any(rows[t] < max_rows for t in order):
            for t in order:
                if left and rows[t] < max_rows:
                    rows[t] += 1
                    left -= 1
    return np.concatenate([[0], np.cumsum(rows)])


# --- LZW parse and allocation, by hand -----------------------------------------------------------


def test_lzw_codewords_by_hand():
    # Dictionary a=0, b=1. Parse: emit a (add ab=2), emit b (add ba=3), emit ab (add aba=4),
    # emit aba (add abab=5), emit b (end of stream).
    counts, last = lzw_codewords(ABAB, 2)
    np.testing.assert_array_equal(counts, [1, 2, 1, 0, 1, 0])  # a b ab ba aba abab
    np.testing.assert_array_equal(last, [A, B, B, A, A, B])


@pytest.mark.parametrize("vocab_size, budget, max_rows, expected", [
    # Ranking (count desc, then code): b (2), a (1), ab (1, last b), aba (1, last a).
    (2, 5, 10, [0, 2, 5]),     # 3 extra rows: b, a, b.
    (2, 7, 10, [0, 3, 7]),     # 4 extra rows: b, a, b, a; then a second pass: b.
    (3, 7, 3, [0, 3, 6, 7]),   # c never occurs: it keeps 1 row; a and b reach the cap 3.
    (3, 8, 3, [0, 3, 6, 8]),   # a and b at the cap: the last row goes to c (round-robin by id).
    (3, 8, 4, [0, 3, 7, 8]),   # with room for b, the second pass gives it the row instead.
    (2, 2, 1, [0, 1, 2]),      # budget == vocabulary: one row each.
    (2, 8, 4, [0, 4, 8]),      # budget == V * k: everybody at the cap.
])
def test_lzw_allocation_by_hand(vocab_size, budget, max_rows, expected):
    offsets = lzw_allocation(ABAB, vocab_size, budget, max_rows)
    assert offsets.dtype == np.int64
    np.testing.assert_array_equal(offsets, expected)
    np.testing.assert_array_equal(offsets, _reference_allocation(ABAB, vocab_size, budget, max_rows))


def test_lzw_allocation_matches_the_sequential_algorithm():
    tokens = _zipf_stream(3000, 40, seed=1)
    for vocab_size, budget, max_rows in [(40, 41, 2), (40, 200, 8), (45, 400, 30), (40, 1600, 40),
                                         (50, 700, 14), (40, 40 * 64, 64)]:
        np.testing.assert_array_equal(
            lzw_allocation(tokens, vocab_size, budget, max_rows),
            _reference_allocation(tokens, vocab_size, budget, max_rows),
            err_msg=f"V={vocab_size} v={budget} k={max_rows}")


def test_lzw_allocation_invariants_on_a_random_stream():
    vocab_size, budget, max_rows = 70, 70 * 6, 24
    tokens = _zipf_stream(30_000, 64)  # ids 64..69 never occur
    offsets = lzw_allocation(tokens, vocab_size, budget, max_rows)
    check_allocation(offsets, vocab_size, budget, max_rows)
    rows = np.diff(offsets)
    assert offsets[0] == 0 and offsets[-1] == budget and rows.sum() == budget
    assert rows.min() >= 1 and rows.max() <= max_rows
    assert (rows[64:] == 1).all()  # unseen tokens keep their one row
    freq = np.bincount(tokens, minlength=vocab_size)[:64]
    by_freq = np.argsort(-freq, kind="stable")
    assert rows[by_freq[:8]].mean() > 3 * rows[by_freq[-8:]].mean()  # frequent >> rare
    assert rows[by_freq[0]] > rows[by_freq[-1]]
    assert np.corrcoef(np.log(freq), rows[:64])[0, 1] > 0.7
    np.testing.assert_array_equal(offsets, lzw_allocation(tokens.astype(np.uint16), vocab_size,
                                                          budget, max_rows))  # deterministic


def test_lzw_allocation_of_an_empty_stream_is_round_robin():
    np.testing.assert_array_equal(lzw_allocation(np.zeros(0, np.int32), 3, 7, 5), [0, 3, 5, 7])


# --- validation errors --------------------------------------------------------------------------


@pytest.mark.parametrize("vocab_size, budget, max_rows, message", [
    (10, 9, 4, r"budget 9 is smaller than the vocabulary \(10 tokens\).*--budget >= 10"),
    (10, 20, 0, r"max_rows must be an int >= 1 .*got 0"),
    (10, 41, 4, r"budget 41 cannot be spent: 10 tokens with at most max_rows=4 .* hold only 40 "
                r"rows. Use --budget <= 40, or --max-rows >= 5"),
    (0, 20, 4, r"vocab_size must be an int >= 1"),
    (10, 20.0, 4, r"budget must be an int >= 1 .*got 20.0"),
])
def test_bad_budgets(vocab_size, budget, max_rows, message):
    for call in (lambda: check_budget(vocab_size, budget, max_rows),
                 lambda: uniform_allocation(vocab_size, budget, max_rows),
                 lambda: lzw_allocation(ABAB, vocab_size, budget, max_rows)):
        with pytest.raises(DataError, match=message):
            call()
    assert issubclass(DataError, ConfigError)


def test_lzw_rejects_ids_outside_the_vocabulary():
    with pytest.raises(DataError, match=r"holds id 5, outside the vocabulary \[0, 4\).*--vocab-size >= 6"):
        lzw_allocation(np.array([0, 1, 5]), 4, 8, 4)
    with pytest.raises(DataError, match=r"holds id -1"):
        lzw_allocation(np.array([0, -1]), 4, 8, 4)


# --- sampling -------------------------------------------------------------------------------------


class _FakeDataset:
    """What ``sample_train_tokens`` reads of a ``TokenDataset``: domains and train shards."""

    def __init__(self, shards: dict[str, list[np.ndarray]]):
        self.domains = tuple(shards)
        self._shards = {d: tuple(TokenStream(np.asarray(s), np.zeros(1, np.int32)) for s in ss)
                        for d, ss in shards.items()}

    def streams(self, domain, split):
        assert split == "train"
        return self._shards[domain]


def test_sample_train_tokens_shares_domains_and_crosses_shards():
    big = np.arange(1000, 1600)
    dataset = _FakeDataset({"big": [big[:250], big[250:260], big[260:]], "small": [np.arange(7)]})
    sample = sample_train_tokens(dataset, 100, chunks_per_domain=4)
    # "small" gives all 7 tokens; "big" gets the other 93, in 4 chunks spread over its 600.
    assert sample.dtype == np.int64 and sample.size == 100
    assert sample[-7:].tolist() == list(range(7))
    chunks = np.split(sample[:93], np.flatnonzero(np.diff(sample[:93]) != 1) + 1)
    assert [c.size for c in chunks] == [23, 23, 23, 24]
    assert [int(c[0]) for c in chunks] == [1000, 1149, 1299, 1449]  # one per quarter of "big"
    assert sample_train_tokens(dataset, 10_000).size == 607  # all there is
    np.testing.assert_array_equal(sample, sample_train_tokens(dataset, 100, chunks_per_domain=4))


# --- command line -------------------------------------------------------------------------------


def test_cli_on_the_builtin_corpus(tmp_path, capsys, corpus_cache):  # corpus_cache: built once per run
    out = tmp_path / "alloc.json"
    code = l3_alloc.main(["--budget", "4096", "--max-rows", "64", "--sample-tokens", "20000",
                          "--out", str(out)])
    stdout = capsys.readouterr().out
    assert code == 0, stdout
    alloc = load_allocation(out, vocab_size=259)
    assert (alloc.budget, alloc.max_rows, alloc.method, alloc.tokenizer, alloc.sample_tokens) == (
        4096, 64, "lzw", "byte", 20000)
    rows = alloc.rows
    hist = np.bincount(rows, minlength=65)
    assert f"1:{hist[1]} " in stdout and f"64:{hist[64]}" in stdout
    assert "top 10 tokens by rows: ' ' (32): 64" in stdout  # the most frequent byte, at the cap
    assert rows[ord(" ")] > rows[ord("Q")] > 0 and rows[200] == 1  # 200: never in UTF-8 text
    assert f"wrote {out}" in stdout


def test_cli_on_a_prepared_dataset_writes_beside_the_tokenizer(tmp_path, capsys):
    src = tmp_path / "src"
    for domain, text in (("alpha", "the cat sat on the mat. "), ("beta", "1 + 2 = 3; 2 + 3 = 5. ")):
        for i in range(12):
            (src / domain).mkdir(parents=True, exist_ok=True)
            (src / domain / f"{i}.txt").write_text(text * (5 + i), encoding="utf-8")
    data = tmp_path / "ds"
    prepare_dataset([f"alpha={src / 'alpha'}", f"beta={src / 'beta'}"], data, heldout_fraction=0.2,
                    workers=1, progress=False)
    args = ["--budget", "360", "--max-rows", "8", "--data-path", str(data), "--vocab-size", "300"]
    assert l3_alloc.main(args) == 0
    path = data / "l3_allocation_lzw_v360_k8.json"
    assert f"wrote {path}" in capsys.readouterr().out
    alloc = load_allocation(path, vocab_size=300)
    assert alloc.rows[ord("t")] == 8 and alloc.rows[299] == 1 and alloc.rows[ord("Z")] == 1
    assert l3_alloc.main(args + ["--method", "uniform"]) == 0
    uniform = load_allocation(data / "l3_allocation_uniform_v360_k8.json")
    np.testing.assert_array_equal(uniform.offsets, uniform_allocation(300, 360, 8))
    assert uniform.sample_tokens == 0


def test_default_out_path(tmp_path):
    assert default_out_path("datasets/mine", "lzw", 4096, 64) == Path(
        "datasets/mine/l3_allocation_lzw_v4096_k64.json")
    assert default_out_path("", "uniform", 512, 4, cache_dir=tmp_path) == (
        tmp_path / "builtin-v1-seed0" / "l3_allocation_uniform_v512_k4.json")


@pytest.mark.parametrize("args, message", [
    (["--budget", "100", "--max-rows", "4"],
     "budget 100 is smaller than the vocabulary (259 tokens): every token needs at least one row. "
     "Use --budget >= 259."),
    (["--budget", "4096", "--max-rows", "0"], "--max-rows 0: the most rows one token may own must be >= 1."),
    (["--budget", "4096", "--max-rows", "4"], "budget 4096 cannot be spent: 259 tokens with at most "
                                              "max_rows=4 rows each hold only 1036 rows."),
    (["--budget", "4096", "--max-rows", "64", "--vocab-size", "200"],
     "--vocab-size 200 is smaller than the vocabulary of the built-in corpus's tokenizer 'byte'"),
    (["--budget", "4096", "--max-rows", "64", "--sample-tokens", "0"], "--sample-tokens 0"),
    (["--budget", "4096", "--max-rows", "64", "--data-path", "/nonexistent/ds"],
     "data.path '/nonexistent/ds' does not exist"),
])
def test_cli_bad_input_fails_before_any_work(args, message, tmp_path, capsys, monkeypatch):
    def no_work(*_, **__):
        raise AssertionError("opened the dataset before checking the options")

    monkeypatch.setattr("moejax.data.dataset.open_dataset", no_work)
    out = tmp_path / "alloc.json"
    with pytest.raises(SystemExit) as stop:  # the command runner exits with the status
        l3_alloc.main(args + ["--out", str(out)])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("moejax: error: ") and message in err, err
    assert not out.exists()


def test_cli_as_a_module(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "moejax.data.l3_alloc", "--budget", "10", "--max-rows", "2",
         "--out", str(tmp_path / "a.json")],
        capture_output=True, text=True, cwd=Path(__file__).parent.parent)
    assert result.returncode == 2
    assert result.stderr == ("moejax: error: budget 10 is smaller than the vocabulary (259 tokens): "
                             "every token needs at least one row. Use --budget >= 259.\n")
    result = subprocess.run([sys.executable, "-m", "moejax.data.l3_alloc", "--max-rows", "2"],
                            capture_output=True, text=True, cwd=Path(__file__).parent.parent)
    assert result.returncode == 2
    assert "moejax: error: the following arguments are required: --budget" in result.stderr
