"""Tests for moejax.data on the built-in corpus: tokenizer, corpus and cache, packing,
grain pipeline (mixtures, schedules, resumption, per-process rows), and make_data from a config.

Prepared (user) datasets and BPE are tested in test_data_prepare.py."""

from __future__ import annotations

import hashlib
import json
import os
import time
import warnings

import numpy as np
import pytest

from moejax.config import default_config
from moejax.errors import ConfigError
from moejax.data import corpus as corpus_lib
from moejax.data.corpus import DOMAINS, build_corpus, build_domain, load_tokenized_corpus
from moejax.errors import DataError
from moejax.data.from_config import make_data
from moejax.data.mixture import MixtureWarning, Stage, normalize_mixture
from moejax.data.packing import FIELDS, WindowPacker, num_windows, pack_window
from moejax.data.pipeline import DataStateWarning, make_eval_batches, make_train_iterator
from moejax.data.streams import tokenize_documents
from moejax.data.synthetic_knowledge import build_world
from moejax.data.tokenizer import ByteTokenizer, get_tokenizer

TOK = ByteTokenizer()
UNIFORM = {domain: 0.25 for domain in DOMAINS}


@pytest.fixture(scope="module")
def rebuilt():
    """The seed-0 corpus built from scratch, independently of the run's shared cache."""
    return build_corpus(0)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory, rebuilt) -> str:
    """A fresh cache directory of this module, written by ``load_tokenized_corpus`` from ``rebuilt``.

    Building is the slow part and ``rebuilt`` is already built, so the build is handed in; the
    tokenising, writing and reading are load_tokenized_corpus's own.
    """
    path = str(tmp_path_factory.mktemp("moejax_cache"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(corpus_lib, "build_corpus", lambda seed: rebuilt)
        load_tokenized_corpus(0, path)
    return path


@pytest.fixture(scope="module")
def tokenized(corpus_cache):
    """The run's shared corpus (tests/conftest.py): a build independent of ``rebuilt``."""
    return load_tokenized_corpus(0, corpus_cache)


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


def test_prose_parsed_in_worker_processes_equals_parsing_here():
    from moejax.data import stdlib_text

    files = stdlib_text.read_stdlib_files()[:150]
    odd = ['"""Caf\u00e9 \u2603 docstring."""\n# one\n# two\n# three words here\n', "def broken(:\n", ""]
    sources = [f.text for f in files] + odd
    pieces = stdlib_text.all_prose_pieces(sources)  # two or more worker processes on 2+ cores
    assert pieces == [stdlib_text._prose_pieces(source) for source in sources]
    assert pieces[-3] == ["Caf\u00e9 \u2603 docstring.", "one\ntwo\nthree words here"] and pieces[-2] == []


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


def _hashes(batches: list[dict]) -> list[str]:
    """One sha256 per batch over every field, to compare runs."""
    out = []
    for batch in batches:
        h = hashlib.sha256()
        for field in sorted(batch):
            h.update(np.ascontiguousarray(batch[field]).tobytes())
        out.append(h.hexdigest())
    return out


def test_train_batches_have_the_documented_fields(cache_dir):
    it = make_train_iterator(UNIFORM, seq_len=64, global_batch_size=8, seed=0, cache_dir=cache_dir)
    for batch in _take(it, 4):
        assert set(batch) == set(FIELDS)
        assert batch["inputs"].shape == (8, 64) and batch["domain"].shape == (8,)
        assert batch["loss_mask"].dtype == np.float32 and batch["inputs"].dtype == np.int32
        _assert_packing_invariants(batch)


def test_realised_mixture_matches_weights_over_10k_sequences(cache_dir):
    mixture = {"code": 0.45, "prose": 0.2, "math": 0.3, "knowledge": 0.05}
    it = make_train_iterator(mixture, seq_len=16, global_batch_size=50, seed=3, cache_dir=cache_dir)
    domains = np.concatenate([batch["domain"] for batch in _take(it, 200)])  # 10,000 sequences.
    shares = np.bincount(domains, minlength=len(DOMAINS)) / domains.size
    np.testing.assert_allclose(shares, [0.45, 0.2, 0.3, 0.05], atol=0.01)
    # Grain interleaves deterministically, so every batch is already close to the weights.
    per_batch = np.stack([np.bincount(b, minlength=4) for b in domains.reshape(200, 50)]) / 50
    assert np.abs(per_batch - [0.45, 0.2, 0.3, 0.05]).max() <= 0.04


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


# A schedule: math alone for 3 steps, then math and code, then code and knowledge.
SCHEDULE = (Stage(0, {"math": 1.0}), Stage(3, {"code": 0.5, "math": 0.5}),
            Stage(6, {"code": 0.25, "knowledge": 0.75}))


def _scheduled(cache_dir, **kwargs):
    return make_train_iterator(SCHEDULE, seq_len=32, global_batch_size=8, seed=5,
                               cache_dir=cache_dir, **kwargs)


def test_schedule_switches_weights_at_stage_boundaries(cache_dir):
    batches = _take(_scheduled(cache_dir), 9)
    counts = [np.bincount(b["domain"], minlength=4).tolist() for b in batches]  # code prose math know
    assert counts[:3] == [[0, 0, 8, 0]] * 3
    assert counts[3:6] == [[4, 0, 4, 0]] * 3
    assert counts[6:] == [[2, 0, 0, 6]] * 3


def test_a_domain_continues_its_stream_across_stages(cache_dir):
    """Math in stage 2 picks up where stage 1 left it: the same windows as a math-only run."""
    math_rows = [row for b in _take(_scheduled(cache_dir), 6)
                 for row, d in zip(b["inputs"], b["domain"]) if d == DOMAINS.index("math")]
    only_math = make_train_iterator({"math": 1.0}, seq_len=32, global_batch_size=8, seed=5,
                                    cache_dir=cache_dir)
    expected = np.concatenate([b["inputs"] for b in _take(only_math, 5)])[: len(math_rows)]
    assert len(math_rows) == 36
    np.testing.assert_array_equal(np.stack(math_rows), expected)


@pytest.mark.parametrize("save_at", [0, 2, 3, 4, 6, 8])
def test_resume_gives_the_batches_of_an_uninterrupted_run(cache_dir, save_at):
    """Batch hashes agree after a save/restore before, at and after stage boundaries."""
    expected = _hashes(_take(_scheduled(cache_dir), 10))
    first = _scheduled(cache_dir)
    seen = _take(first, save_at)
    state = json.loads(json.dumps(first.get_state()))
    resumed = _scheduled(cache_dir)
    resumed.set_state(state)
    assert _hashes(seen + _take(resumed, 10 - save_at)) == expected


def test_resume_refuses_a_different_data_setup(cache_dir):
    it = _scheduled(cache_dir)
    _take(it, 4)
    state = it.get_state()
    other_len = make_train_iterator(SCHEDULE, seq_len=64, global_batch_size=8, seed=5,
                                    cache_dir=cache_dir)
    with pytest.raises(DataError, match=r"made with seq_len=32, this run has 64.*fresh workdir"):
        other_len.set_state(state)
    changed = (SCHEDULE[0], Stage(3, {"code": 0.9, "math": 0.1}))
    with pytest.raises(DataError, match=r"schedule changed at or before step 4.*stage from step 3"):
        make_train_iterator(changed, seq_len=32, global_batch_size=8, seed=5,
                            cache_dir=cache_dir).set_state(state)
    with pytest.raises(DataError, match=r"another moejax data pipeline version"):
        _scheduled(cache_dir).set_state({"parents": {}})
    # Stages after the resume step may change: here the last stage is replaced.
    later = (*SCHEDULE[:2], Stage(8, {"prose": 1.0}))
    resumed = make_train_iterator(later, seq_len=32, global_batch_size=8, seed=5, cache_dir=cache_dir)
    resumed.set_state(state)
    assert [int(b["domain"][0]) for b in _take(resumed, 5)][-1] == DOMAINS.index("prose")
    # Other data content (e.g. another interpreter's stdlib) resumes, with a warning.
    tampered = json.loads(json.dumps(state))
    tampered["made_with"]["data"] = "0" * 64
    with pytest.warns(DataStateWarning, match="differs from the data"):
        _scheduled(cache_dir).set_state(tampered)


def test_process_slices_tile_the_global_batch(cache_dir):
    global_batches = _take(_scheduled(cache_dir), 5)
    halves = [_take(_scheduled(cache_dir, process_index=i, process_count=2), 5) for i in range(2)]
    for b, (first, second) in enumerate(zip(*halves)):
        for field in FIELDS:
            np.testing.assert_array_equal(
                np.concatenate([first[field], second[field]]), global_batches[b][field])
    # A state saved by one process restores on any process count.
    it = _scheduled(cache_dir, process_index=1, process_count=4)
    _take(it, 4)
    full = _scheduled(cache_dir)
    full.set_state(json.loads(json.dumps(it.get_state())))
    np.testing.assert_array_equal(next(full)["inputs"][2:4], next(it)["inputs"])
    with pytest.raises(DataError, match="global_batch_size 8 is not divisible by process_count 3"):
        _scheduled(cache_dir, process_index=0, process_count=3)
    with pytest.raises(DataError, match=r"process_index must be an int in \[0, 2\), got 2"):
        _scheduled(cache_dir, process_index=2, process_count=2)


@pytest.mark.parametrize(
    ("mixture", "message"),
    [
        ({"code": 1.0, "poetry": 1.0},
         r"mixture names domain 'poetry', which the built-in corpus does not have; its domains "
         r"are: code, prose, math, knowledge"),
        ({"code": -0.5, "math": 1.0}, r"weight for 'code' must be a finite number >= 0"),
        ({"code": float("nan")}, r"weight for 'code' must be a finite number >= 0, got nan"),
        ({"math": float("inf")}, r"weight for 'math' must be a finite number >= 0"),
        ({"math": "0.5"}, r"weight for 'math' must be a finite number >= 0, got '0.5'"),
        ({"code": 0.0, "math": 0}, r"must not all be zero"),
        ({}, r"non-empty mapping"),
    ],
)
def test_bad_mixture_is_rejected_with_a_clear_error(mixture, message):
    with pytest.raises(DataError, match=message):
        make_train_iterator(mixture, seq_len=32, global_batch_size=4, seed=0)


def test_mixture_not_summing_to_one_is_normalised_with_a_warning():
    normalised = r"weights sum to 4, not 1; normalised to \{code: 0.25, math: 0.75\}"
    with pytest.warns(MixtureWarning, match=normalised):
        assert normalize_mixture({"math": 3, "code": 1, "prose": 0}) == {"code": 0.25, "math": 0.75}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert normalize_mixture({"math": 0.6, "code": 0.4}) == {"code": 0.4, "math": 0.6}


def test_bad_shapes_and_seed_are_rejected(cache_dir):
    with pytest.raises(DataError, match="seq_len must be a positive int, got 0"):
        make_train_iterator(UNIFORM, seq_len=0, global_batch_size=4, seed=0)
    with pytest.raises(DataError, match="global_batch_size must be a positive int, got 2.0"):
        make_train_iterator(UNIFORM, seq_len=8, global_batch_size=2.0, seed=0)
    with pytest.raises(DataError, match=r"seed must be an int in \[0, 2\*\*32\), got -1"):
        make_train_iterator(UNIFORM, seq_len=8, global_batch_size=2, seed=-1)
    with pytest.raises(DataError, match="train split of domain 'math' in the built-in corpus has no "
                                        "window of 100000001 tokens"):
        make_train_iterator({"math": 1}, seq_len=10**8, global_batch_size=2, seed=0,
                            cache_dir=cache_dir)


# --- eval batches -------------------------------------------------------------------------------


def test_first_eval_batches_are_consecutive_heldout_windows(cache_dir, tokenized):
    """train.eval_windows=first (runs saved before the key): the first windows of the split."""
    batches = make_eval_batches(["prose", "math"], seq_len=128, batch_size=4,
                                batches_per_domain=3, cache_dir=cache_dir, windows="first")
    again = make_eval_batches(["prose", "math"], seq_len=128, batch_size=4,
                              batches_per_domain=3, cache_dir=cache_dir, windows="first")
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
    with pytest.raises(DataError, match=r"the evaluation names domain 'poetry', which the built-in "
                                        r"corpus does not have"):
        make_eval_batches(["poetry"], seq_len=8, batch_size=2, batches_per_domain=1,
                          cache_dir=cache_dir)
    with pytest.raises(DataError, match="held-out split of domain 'code' in the built-in corpus has "
                                        "no window"):
        make_eval_batches(["code"], seq_len=10**8, batch_size=2, batches_per_domain=1,
                          cache_dir=cache_dir)
    with pytest.raises(DataError, match="batches_per_domain must be a positive int"):
        make_eval_batches(["code"], seq_len=8, batch_size=2, batches_per_domain=0,
                          cache_dir=cache_dir)


# --- make_data from a config --------------------------------------------------------------------


def _cfg(cache_dir, **data):
    cfg = default_config()
    cfg.train.seq_len, cfg.train.global_batch_size, cfg.train.eval_batches = 32, 8, 1
    cfg.data.cache_dir = cache_dir
    for key, value in data.items():
        cfg.data[key] = value
    return cfg


def test_make_data_builds_the_run_data_from_the_config(cache_dir, tmp_path):
    data = make_data(_cfg(cache_dir))
    assert data.domains == DOMAINS and data.tokenizer.name == "byte"
    assert list(data.eval_batches) == list(DOMAINS)
    assert next(data.train_iter)["inputs"].shape == (8, 32)
    mixture_file = tmp_path / "mixture.json"
    mixture_file.write_text(json.dumps({"weights": {"math": 0.75, "code": 0.25}, "law": "camel"}))
    data = make_data(_cfg(cache_dir, mixture_file=str(mixture_file)))
    assert data.schedule == (Stage(0, {"code": 0.25, "math": 0.75}),)
    schedule = '[[0, {"math": 1}], [2, {"prose": 1}]]'
    data = make_data(_cfg(cache_dir, schedule=schedule))
    assert [int(next(data.train_iter)["domain"][0]) for _ in range(3)] == [2, 2, 1]
    schedule_file = tmp_path / "schedule.json"
    schedule_file.write_text(schedule)
    assert make_data(_cfg(cache_dir, schedule=str(schedule_file))).schedule == data.schedule


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"mixture": {"code": 1.0, "web": 1.0}},
         r"data.mixture names domain 'web', which the built-in corpus does not have; its domains "
         r"are: code, prose, math, knowledge\. Use those names, or prepare data for 'web'"),
        ({"mixture_file": "/nonexistent/mix.json"},
         r"data.mixture_file file '/nonexistent/mix.json' does not exist"),
        ({"schedule": "[[5, {\"code\": 1}]]"}, r"first stage must start at step 0, not 5"),
        ({"schedule": "[[0, {\"code\": 1}], [0, {\"math\": 1}]]"}, r"start steps must increase"),
        ({"schedule": "[[0, {\"code\": -1}]]"}, r"data.schedule: weight for 'code' must be a finite"),
        ({"schedule": "[[0, {\"code\": 1}"}, r"data.schedule is not valid JSON"),
        ({"schedule": "[0, 1]"}, r"data.schedule stage 0 is 0; each stage must be \[start_step"),
        ({"path": "/nonexistent/dataset"},
         r"data.path '/nonexistent/dataset' does not exist. Prepare it first: python -m "
         r"moejax.data.prepare"),
    ],
)
def test_bad_data_config_fails_before_training_with_a_clear_error(cache_dir, data, message):
    with pytest.raises(DataError, match=message):
        make_data(_cfg(cache_dir, **data))


def test_bad_mixture_file_and_config_conflicts(cache_dir, tmp_path):
    bad = tmp_path / "mix.json"
    bad.write_text('{"code": 0.5}')
    with pytest.raises(DataError, match=r"must hold a JSON object with a \"weights\" object"):
        make_data(_cfg(cache_dir, mixture_file=str(bad)))
    cfg = _cfg(cache_dir, mixture_file=str(bad), schedule='[[0, {"code": 1}]]')
    with pytest.raises(ConfigError, match=r"'data.schedule' has value .* while data.mixture_file is set"):
        from moejax.checks import validate

        validate(cfg, 8)
    cfg = _cfg(cache_dir)
    cfg.model.vocab_size = 200
    with pytest.raises(DataError, match=r"'model.vocab_size' has value 200; allowed: at least the "
                                        r"vocabulary of the tokenizer of the built-in corpus \(byte: 259 tokens\)"):
        make_data(cfg)
