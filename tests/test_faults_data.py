"""Damaged token shards are found where training reads the data, before anything is compiled: a
truncated file by its size, overwritten bytes by the first shard's recorded sha256, ids outside the
vocabulary by their range."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from moejax.config import default_config
from moejax.errors import DataError
from moejax.data.from_config import check_data_config
from moejax.data.prepare import prepare_dataset


@pytest.fixture
def dataset(tmp_path):
    src = tmp_path / "src.jsonl"
    src.write_text("".join(json.dumps({"text": f"document {i} " + "word " * (i % 13 + 20)}) + "\n" for i in range(300)))
    out = tmp_path / "ds"
    prepare_dataset([f"prose={src}"], out, heldout_fraction=0.2, shard_mb=0.004, workers=1, progress=False)
    return out


def _cfg(path):
    cfg = default_config()
    cfg.data.path = str(path)
    cfg.data.mixture = {"prose": 1.0}
    return cfg


def _shard(dataset, index=0, split="train", array="tokens"):
    return dataset / "prose" / f"shard-{index:05d}.{split}.{array}.npy"


def test_an_intact_dataset_passes(dataset):
    info, _ = check_data_config(_cfg(dataset))
    assert info.domains == ("prose",)


@pytest.mark.parametrize("index, split, array", [(0, "train", "tokens"), (2, "heldout", "doc_starts")])
def test_a_truncated_shard_is_named_with_its_sizes(dataset, index, split, array):
    path = _shard(dataset, index, split, array)
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size - 7)
    with pytest.raises(DataError, match=rf"shard file {path} is cut short \(truncated\): {size - 7:,} bytes where "
                                        rf"its header and manifest need {size:,}\. .*rerun the prepare command"):
        check_data_config(_cfg(dataset))


def test_overwritten_bytes_with_the_header_intact_fail_the_recorded_checksum(dataset):
    path = _shard(dataset)
    tokens = np.load(path)
    with open(path, "r+b") as f:  # the header stays; the ids become garbage
        f.seek(os.path.getsize(path) - tokens.nbytes)
        f.write(np.random.default_rng(0).integers(0, 2**16, tokens.size, dtype=np.uint16).astype(tokens.dtype).tobytes())
    with pytest.raises(DataError, match=rf"shard file {path} does not match the sha256 recorded in its manifest"):
        check_data_config(_cfg(dataset))


def test_ids_outside_the_vocabulary_are_refused_where_no_checksum_is_recorded(dataset):
    path = _shard(dataset)
    manifest_path = dataset / "prose" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    del manifest["shards"][0]["splits"]["train"]["files"]["tokens"]["sha256"]  # as an older manifest may lack
    manifest_path.write_text(json.dumps(manifest))
    tokens = np.load(path, mmap_mode="r+")
    tokens[5] = 60000
    tokens.flush()
    with pytest.raises(DataError, match=rf"shard file {path} holds token id 60000, outside the tokenizer's "
                                        r"vocabulary of \d+ ids"):
        check_data_config(_cfg(dataset))


def _scribble(path, seed=0):
    """Random bytes behind the intact ``.npy`` header, as a bad disk or a stray write leaves them."""
    tokens = np.load(path, mmap_mode="r")
    offset = os.path.getsize(path) - tokens.nbytes
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(np.random.default_rng(seed).integers(0, 256, tokens.nbytes, dtype=np.uint8).tobytes())


def test_every_shard_is_verified_the_first_time_the_pipeline_reads_it(dataset):
    """A shard past the first (only the first is checked before compiling) is checked when the
    pipeline first reads it: its batches never reach the model."""
    from moejax.data.dataset import open_dataset
    from moejax.data.pipeline import make_train_iterator

    assert len(list((dataset / "prose").glob("shard-*.train.tokens.npy"))) >= 4
    path = _shard(dataset, 3)
    _scribble(path)
    check_data_config(_cfg(dataset))  # the first shard is fine: the start is not slowed down
    iterator = make_train_iterator({"prose": 1.0}, seq_len=32, global_batch_size=8, seed=0,
                                   dataset=open_dataset(dataset))
    with pytest.raises(DataError, match=rf"shard file {path} does not match the sha256 recorded in its manifest"):
        for _ in range(40):  # every shard is drawn within a few batches
            next(iterator)


def test_a_damaged_heldout_shard_is_refused_before_the_first_evaluation(dataset):
    from moejax.data.dataset import open_dataset
    from moejax.data.pipeline import make_eval_batches

    path = _shard(dataset, 0, "heldout")
    _scribble(path, seed=1)
    with pytest.raises(DataError, match=rf"shard file {path} does not match the sha256"):
        make_eval_batches(["prose"], seq_len=16, batch_size=4, batches_per_domain=1, dataset=open_dataset(dataset),
                          windows="first")  # reads shard 0 (sampled windows may all lie in later shards)


def test_verify_dataset_is_a_public_name_and_names_the_damaged_shard(dataset):
    import moejax.data

    assert moejax.data.verify_dataset(dataset) == len(list((dataset / "prose").glob("shard-*.npy")))
    path = _shard(dataset, 2)
    _scribble(path)
    with pytest.raises(DataError, match=rf"shard file {path} does not match the sha256"):
        moejax.data.verify_dataset(dataset)


@pytest.fixture
def cache_copy(corpus_cache, tmp_path):
    """A private copy of the built-in corpus cache, to damage."""
    import shutil

    from moejax.data import corpus

    name = f"{corpus.CORPUS_VERSION}-seed0"
    shutil.copytree(os.path.join(corpus_cache, name), tmp_path / "cache" / name)
    return tmp_path / "cache", tmp_path / "cache" / name


def test_a_damaged_builtin_cache_is_rebuilt_with_one_notice(cache_copy, capsys, monkeypatch):
    from moejax.data import corpus

    cache, directory = cache_copy
    loaded = corpus.load_tokenized_corpus(0, cache)
    intact = loaded.stream("prose", "heldout").tokens.copy()
    # The rebuild's documents decoded from the intact cache: the same corpus, without 30 s of building it.
    documents = {d: {s: loaded.documents(d, s) for s in corpus.SPLITS} for d in corpus.DOMAINS}
    monkeypatch.setattr(corpus, "build_corpus", lambda seed: corpus.Corpus(seed, documents, loaded.manifest))
    path = directory / "prose.heldout.tokens.npy"
    _scribble(path)
    capsys.readouterr()
    rebuilt = corpus.load_tokenized_corpus(0, cache)
    err = capsys.readouterr().err
    notices = [line for line in err.splitlines() if "damaged" in line]
    assert len(notices) == 1 and str(path) in notices[0] and "rebuilt" in notices[0], err
    np.testing.assert_array_equal(rebuilt.stream("prose", "heldout").tokens, intact)
    assert corpus.load_tokenized_corpus(0, cache).manifest == rebuilt.manifest
