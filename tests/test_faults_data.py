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
