"""Tests for moejax.data: tokenizer, built-in corpus and cache, packing, grain pipeline."""

from __future__ import annotations

import json
import os
import time

import numpy as np
import pytest

from moejax.data import corpus as corpus_lib
from moejax.data.corpus import DOMAINS, build_corpus, build_domain, load_tokenized_corpus
from moejax.data.packing import FIELDS, WindowPacker, num_windows, pack_window
from moejax.data.pipeline import make_eval_batches, make_train_iterator, normalize_mixture
from moejax.data.streams import tokenize_documents
from moejax.data.synthetic_knowledge import build_world
from moejax.data.tokenizer import ByteTokenizer, get_tokenizer

TOK = ByteTokenizer()
UNIFORM = {domain: 1.0 for domain in DOMAINS}


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> str:
    """A cache directory holding the seed-0 corpus, built once for the whole module."""
    path = str(tmp_path_factory.mktemp("moejax_cache"))
    load_tokenized_corpus(0, path)
    return path


@pytest.fixture(scope="module")
def tokenized(cache_dir):
    return load_tokenized_corpus(0, cache_dir)


@pytest.fixture(scope="module")
def rebuilt():
    """The seed-0 corpus built a second time, from scratch."""
    return build_corpus(0)


def _take(iterator, n: int) -> list[dict[str, np.ndarray]]:
    return [next(iterator) for _ in range(n)]


def _assert_batches_equal(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b)
    for batch_a, batch_b in zip(a, b):
        assert batch_a.keys() == batch_b.keys()
        for field in batch_a:
            np.testing.assert_array_equal(batch_a[field], batch_b[field], err_msg=field)


# --- tokenizer ---------------------------------------------------------------------------------


def test_tokenizer_round_trip_and_specials():
    text = "def f(x):\n    return x + 1  # naïve café ✓"
    ids = TOK.encode(text)
    assert ids.dtype == np.int32
    assert len(ids) == len(text.encode("utf-8"))
    assert TOK.decode(ids) == text
    assert TOK.decode(np.concatenate([[TOK.bos_id], ids, [TOK.eos_id, TOK.pad_id]])) == text
    assert (TOK.vocab_size, TOK.bos_id, TOK.eos_id, TOK.pad_id) == (259, 256, 257, 258)
    assert TOK.decode([0xC3]) == "\ufffd"  # A lone UTF-8 lead byte is replaced, not an error.


def test_get_tokenizer_by_name():
    assert get_tokenizer("byte").name == "byte"
    with pytest.raises(ValueError, match=r"'bpe'.*allowed names: \['byte'\]"):
        get_tokenizer("bpe")


# --- corpus -------------------------------------------------------------------------------------


def test_generated_domains_are_deterministic_per_seed():
    for domain in ("math", "knowledge"):
        first, again, other = build_domain(domain, 0), build_domain(domain, 0), build_domain(domain, 1)
        assert first == again
        assert corpus_lib.content_hash(first["train"]) != corpus_lib.content_hash(other["train"])


def test_full_build_is_deterministic(tokenized, rebuilt):
    manifest = rebuilt.manifest
    for domain in DOMAINS:
        for split in ("train", "heldout"):
            cached = tokenized.manifest["domains"][domain][split]
            assert manifest["domains"][domain][split]["sha256"] == cached["sha256"]


def test_corpus_sizes(tokenized):
    for domain in DOMAINS:
        train = tokenized.manifest["domains"][domain]["train"]
        assert 3_000_000 <= train["bytes"] <= 20_000_000, domain
        heldout = tokenized.stream(domain, "heldout")
        assert heldout.num_tokens // 256 >= 200, domain  # A few hundred eval sequences.


def test_corpus_is_real_text(tokenized):
    def text(domain: str, n: int = 200_000) -> str:
        return TOK.decode(tokenized.stream(domain, "train").tokens[:n])

    code = text("code")
    assert "def " in code and "import " in code and "return " in code
    prose = text("prose").replace(" ", "").replace("\n", "")
    assert sum(c.isascii() and c.isalpha() for c in prose) / len(prose) > 0.7
    math_text = text("math")
    assert "Q: What is " in math_text and "Solve for x:" in math_text
    assert " was born in " in text("knowledge")


def test_knowledge_facts_recur_in_different_wordings(tokenized):
    person = next(e for e in build_world(0) if e.kind == "person")
    knowledge = TOK.decode(tokenized.stream("knowledge", "train").tokens)
    place = person.facts["birthplace"]
    wordings = [
        f"{person.name} was born in {place}.",
        f"The birthplace of {person.name} is {place}.",
        f"{person.name} is a native of {place}.",
    ]
    assert sum(w in knowledge for w in wordings) >= 2
    assert knowledge.count(person.name) >= 5


def test_heldout_text_never_appears_in_train(rebuilt):
    for domain in DOMAINS:
        splits = rebuilt.documents[domain]
        assert splits["heldout"], domain
        assert not set(splits["heldout"]) & set(splits["train"]), domain
    # A held-out file's docstrings stay with its held-out code, out of the code train split.
    # (One-line docstrings such as "Return -1 if x < y, ..." recur across files: skip those.)
    code_train = "\x00".join(rebuilt.documents["code"]["train"])
    long_heldout = [doc for doc in rebuilt.documents["prose"]["heldout"] if len(doc) > 200]
    assert len(long_heldout) > 20
    assert not any(doc in code_train for doc in long_heldout)


def test_cache_matches_text_and_loads_fast(cache_dir, tokenized):
    assert os.listdir(cache_dir) == ["builtin-v1-seed0"]  # No temporary directory left behind.
    math_docs = build_domain("math", 0)["train"]
    stream = tokenized.stream("math", "train")
    assert stream.tokens.dtype == np.int32 and stream.doc_starts.dtype == np.int32
    entry = tokenized.manifest["domains"]["math"]["train"]
    assert entry["tokens"] == entry["bytes"] + entry["documents"]  # One EOS per document.
    first_end = stream.doc_starts[1] - 1
    assert stream.tokens[first_end] == TOK.eos_id
    assert TOK.decode(stream.tokens[:first_end]) == math_docs[0]
    start = time.perf_counter()
    load_tokenized_corpus(0, cache_dir)
    assert time.perf_counter() - start < 1.0


def test_corpus_rejects_bad_names(tokenized):
    with pytest.raises(ValueError, match=r"'poetry'.*allowed domains"):
        build_domain("poetry")
    with pytest.raises(ValueError, match=r"'validation'.*allowed splits"):
        tokenized.stream("math", "validation")
    with pytest.raises(ValueError, match="seed must be a non-negative int"):
        build_corpus(-1)


# --- packing ------------------------------------------------------------------------------------


def _hand_made_packer(seq_len: int) -> WindowPacker:
    # Stream: a b c EOS | d e EOS | f g h i j EOS   (documents start at 0, 4, 7)
    stream = tokenize_documents(["abc", "de", "fghij"], TOK)
    np.testing.assert_array_equal(stream.doc_starts, [0, 4, 7])
    return WindowPacker(stream, seq_len, domain=2)


def test_packing_fields_on_hand_made_stream():
    packer = _hand_made_packer(seq_len=5)
    assert packer.num_windows == 2
    first, second = packer(0), packer(1)
    assert TOK.decode(first["inputs"]) == "abcd" and first["inputs"][3] == TOK.eos_id
    np.testing.assert_array_equal(first["targets"], TOK.encode("bc").tolist() + [257] + [100, 101])
    np.testing.assert_array_equal(first["segment_ids"], [1, 1, 1, 1, 2])
    np.testing.assert_array_equal(first["positions"], [0, 1, 2, 3, 0])
    np.testing.assert_array_equal(first["loss_mask"], [1, 1, 1, 0, 1])
    # Window 1 starts inside document "de": its positions restart at 0 at the window start.
    np.testing.assert_array_equal(second["inputs"], [101, 257, 102, 103, 104])
    np.testing.assert_array_equal(second["segment_ids"], [1, 1, 2, 2, 2])
    np.testing.assert_array_equal(second["positions"], [0, 1, 0, 1, 2])
    np.testing.assert_array_equal(second["loss_mask"], [1, 0, 1, 1, 1])
    assert second["domain"] == 2 and second["domain"].shape == ()
    assert {k: v.dtype for k, v in first.items()} == {
        **{k: np.dtype(np.int32) for k in FIELDS}, "loss_mask": np.dtype(np.float32)
    }
    with pytest.raises(IndexError, match=r"window 2 out of range \[0, 2\)"):
        packer(2)


def test_packing_window_starting_on_document_start():
    example = _hand_made_packer(seq_len=4)(1)  # tokens[4:9] = d e EOS f g
    np.testing.assert_array_equal(example["segment_ids"], [1, 1, 1, 2])
    np.testing.assert_array_equal(example["positions"], [0, 1, 2, 0])
    np.testing.assert_array_equal(example["loss_mask"], [1, 1, 0, 1])


def test_pack_window_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="equal length"):
        pack_window(np.zeros(5, np.int32), np.zeros(4, bool), 0)


def _assert_packing_invariants(batch: dict[str, np.ndarray]) -> None:
    """Boundaries agree across fields: segments, positions and loss mask change together."""
    seg, pos, mask = batch["segment_ids"], batch["positions"], batch["loss_mask"]
    new_segment = seg[:, 1:] != seg[:, :-1]
    np.testing.assert_array_equal(mask[:, :-1] == 0, new_segment)
    np.testing.assert_array_equal(pos[:, 1:] == 0, new_segment)
    assert (batch["inputs"][:, :-1][new_segment] == TOK.eos_id).all()
    np.testing.assert_array_equal(batch["inputs"][:, 1:], batch["targets"][:, :-1])
    assert (seg[:, 0] == 1).all() and (pos[:, 0] == 0).all()


# --- train pipeline -----------------------------------------------------------------------------


def test_train_batches_have_the_documented_fields(cache_dir):
    it = make_train_iterator(UNIFORM, seq_len=64, global_batch_size=8, seed=0, cache_dir=cache_dir)
    for batch in _take(it, 4):
        assert set(batch) == set(FIELDS)
        assert batch["inputs"].shape == (8, 64) and batch["domain"].shape == (8,)
        assert batch["loss_mask"].dtype == np.float32 and batch["inputs"].dtype == np.int32
        _assert_packing_invariants(batch)


def test_realised_mixture_matches_weights(cache_dir):
    mixture = {"code": 5.0, "prose": 2.0, "math": 3.0, "knowledge": 0.0}
    it = make_train_iterator(mixture, seq_len=32, global_batch_size=16, seed=3, cache_dir=cache_dir)
    domains = np.concatenate([batch["domain"] for batch in _take(it, 125)])  # 2,000 sequences.
    shares = np.bincount(domains, minlength=len(DOMAINS)) / domains.size
    expected = [0.5, 0.2, 0.3, 0.0]
    np.testing.assert_allclose(shares, expected, atol=0.02)


def test_same_seed_same_batches_different_seed_different(cache_dir):
    def first_batches(seed: int) -> list[dict]:
        it = make_train_iterator(UNIFORM, seq_len=32, global_batch_size=4, seed=seed,
                                 cache_dir=cache_dir)
        return _take(it, 3)

    _assert_batches_equal(first_batches(7), first_batches(7))
    assert not np.array_equal(first_batches(7)[0]["inputs"], first_batches(8)[0]["inputs"])


def test_iterator_state_round_trips_through_json(cache_dir):
    kwargs = dict(seq_len=32, global_batch_size=4, seed=11, cache_dir=cache_dir)
    mixture = {"code": 0.4, "prose": 0.1, "math": 0.25, "knowledge": 0.25}
    it = make_train_iterator(mixture, **kwargs)
    _take(it, 5)
    state = json.loads(json.dumps(it.get_state()))
    expected = _take(it, 4)
    resumed = make_train_iterator(mixture, **kwargs)
    resumed.set_state(state)
    _assert_batches_equal(_take(resumed, 4), expected)


def test_each_epoch_covers_every_window_in_a_new_order(cache_dir, tokenized):
    seq_len = 65_536
    n = num_windows(tokenized.stream("math", "train").num_tokens, seq_len)
    it = make_train_iterator({"math": 1}, seq_len=seq_len, global_batch_size=1, seed=0,
                             cache_dir=cache_dir)
    windows = [batch["inputs"].tobytes() for batch in _take(it, 2 * n)]
    epoch_1, epoch_2 = windows[:n], windows[n:]
    assert len(set(epoch_1)) == n and set(epoch_1) == set(epoch_2)
    assert epoch_1 != epoch_2


@pytest.mark.parametrize(
    ("mixture", "message"),
    [
        ({"code": 1.0, "poetry": 1.0}, r"unknown mixture domain 'poetry'; allowed domains: \("),
        ({"code": -0.5, "math": 1.0}, r"weight for 'code' must be a finite number >= 0"),
        ({"code": float("nan")}, r"weight for 'code' must be a finite number >= 0, got nan"),
        ({"math": float("inf")}, r"weight for 'math' must be a finite number >= 0"),
        ({"math": "0.5"}, r"weight for 'math' must be a finite number >= 0, got '0.5'"),
        ({"code": 0.0, "math": 0}, r"must not all be zero"),
        ({}, r"non-empty mapping"),
    ],
)
def test_bad_mixture_is_rejected_with_a_clear_error(mixture, message):
    with pytest.raises(ValueError, match=message):
        make_train_iterator(mixture, seq_len=32, global_batch_size=4, seed=0)


def test_mixture_is_normalised_in_domain_order():
    assert normalize_mixture({"math": 3, "code": 1, "prose": 0}) == {"code": 0.25, "math": 0.75}


def test_bad_shapes_and_seed_are_rejected(cache_dir):
    with pytest.raises(ValueError, match="seq_len must be a positive int, got 0"):
        make_train_iterator(UNIFORM, seq_len=0, global_batch_size=4, seed=0)
    with pytest.raises(ValueError, match="global_batch_size must be a positive int, got 2.0"):
        make_train_iterator(UNIFORM, seq_len=8, global_batch_size=2.0, seed=0)
    with pytest.raises(ValueError, match=r"seed must be an int in \[0, 2\*\*32\), got -1"):
        make_train_iterator(UNIFORM, seq_len=8, global_batch_size=2, seed=-1)
    with pytest.raises(ValueError, match="train split of domain 'math' has no window"):
        make_train_iterator({"math": 1}, seq_len=10**8, global_batch_size=2, seed=0,
                            cache_dir=cache_dir)


# --- eval batches -------------------------------------------------------------------------------


def test_eval_batches_are_consecutive_heldout_windows(cache_dir, tokenized):
    batches = make_eval_batches(["prose", "math"], seq_len=128, batch_size=4,
                                batches_per_domain=3, cache_dir=cache_dir)
    again = make_eval_batches(["prose", "math"], seq_len=128, batch_size=4,
                              batches_per_domain=3, cache_dir=cache_dir)
    assert list(batches) == ["prose", "math"]
    for domain in batches:
        assert len(batches[domain]) == 3
        _assert_batches_equal(batches[domain], again[domain])
        heldout = tokenized.stream(domain, "heldout").tokens
        inputs = np.concatenate([b["inputs"] for b in batches[domain]])
        np.testing.assert_array_equal(inputs.reshape(-1), heldout[: 12 * 128])
        for batch in batches[domain]:
            assert (batch["domain"] == DOMAINS.index(domain)).all()
            _assert_packing_invariants(batch)


def test_eval_batches_shrink_and_pad_to_the_heldout_size(cache_dir, tokenized):
    seq_len = 8192
    available = (tokenized.stream("prose", "heldout").num_tokens - 1) // seq_len
    assert 0 < available < 16
    (batch,) = make_eval_batches(["prose"], seq_len=seq_len, batch_size=16,
                                 batches_per_domain=5, cache_dir=cache_dir)["prose"]
    assert batch["inputs"].shape == (16, seq_len)
    assert batch["loss_mask"][:available].any(axis=1).all()
    assert not batch["loss_mask"][available:].any()
    assert (batch["segment_ids"][available:] == 0).all()
    assert (batch["inputs"][available:] == TOK.pad_id).all()


def test_eval_batches_reject_bad_input(cache_dir):
    with pytest.raises(ValueError, match=r"unknown domain 'poetry'; allowed domains"):
        make_eval_batches(["poetry"], seq_len=8, batch_size=2, batches_per_domain=1,
                          cache_dir=cache_dir)
    with pytest.raises(ValueError, match="held-out split of domain 'code' has no window"):
        make_eval_batches(["code"], seq_len=10**8, batch_size=2, batches_per_domain=1,
                          cache_dir=cache_dir)
    with pytest.raises(ValueError, match="batches_per_domain must be a positive int"):
        make_eval_batches(["code"], seq_len=8, batch_size=2, batches_per_domain=0,
                          cache_dir=cache_dir)
