"""prepare's input kinds: gzip/zstd-compressed JSONL and text (streamed), Parquet and a Hugging
Face dataset saved with save_to_disk (hf:PATH[:column]), mixed in one directory; and bad input
of those kinds refused with an error naming the file."""

from __future__ import annotations

import bz2
import gzip
import json
import sys
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from moejax.data import layout
from moejax.data.dataset import open_dataset
from moejax.errors import DataError
from moejax.data.prepare import main as prepare_main
from moejax.data.prepare import prepare_dataset
from tests.test_data_prepare import _documents

OPTIONS = dict(workers=1, heldout_fraction=0.0, seq_len=4)


def _docs(tag: str, n: int) -> list[str]:
    return [f"{tag} document {i}: " + " ".join(f"w{(i * 7 + j) % 31}" for j in range(20 + i % 5)) for i in range(n)]


def _jsonl(docs: list[str]) -> bytes:
    return "".join(json.dumps({"text": d}) + "\n" for d in docs).encode()


def _saved_dataset(path, docs: list[str]) -> None:
    import datasets

    datasets.Dataset.from_dict({"body": docs, "n": list(range(len(docs)))}).save_to_disk(str(path))


@pytest.mark.filterwarnings("ignore::moejax.data.dataset.HeldoutWarning")  # no held-out split asked for
def test_a_directory_of_every_kind_and_a_saved_dataset_give_back_every_document(tmp_path, capsys):
    mix, expected = tmp_path / "mix", []
    (mix / "sub").mkdir(parents=True)
    plain, gz, zst = _docs("plain", 12), _docs("gz", 15), _docs("zst", 14)
    (mix / "a.jsonl").write_bytes(_jsonl(plain))
    (mix / "b.jsonl.gz").write_bytes(gzip.compress(_jsonl(gz)))
    half = len(zst) // 2  # two zstd frames, as pzstd writes them
    (mix / "sub" / "c.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(_jsonl(zst[:half]))
                                              + zstandard.ZstdCompressor().compress(_jsonl(zst[half:])))
    (mix / "d.txt.gz").write_bytes(gzip.compress(b"one gzip text document " * 20))
    (mix / "e.txt.zst").write_bytes(zstandard.ZstdCompressor().compress(b"one zstd text document " * 20))
    pq.write_table(pa.table({"text": _docs("parquet", 9)}), mix / "f.parquet")
    (mix / "g.txt").write_text("one plain text document " * 20)
    expected = [*plain, *gz, *zst, "one gzip text document " * 20, "one zstd text document " * 20,
                *_docs("parquet", 9), "one plain text document " * 20]
    hf_docs = _docs("hf", 40)
    _saved_dataset(tmp_path / "saved", hf_docs)

    out = tmp_path / "ds"
    argv = ["--source", f"mix={mix}", "--source", f"web=hf:{tmp_path / 'saved'}:body", "--out", str(out),
            "--workers", "1", "--seq-len", "8", "--heldout-fraction", "0", "--shard-mb", "0.001"]
    assert prepare_main(argv) == 0
    dataset = open_dataset(out)
    assert Counter(_documents(dataset, "mix", "train")) == Counter(expected)
    assert Counter(_documents(dataset, "web", "train")) == Counter(hf_docs)
    manifests = dataset.manifest["domain_manifests"]
    assert len(manifests["web"]["shards"]) > 1  # the saved dataset, cut into row ranges
    assert manifests["web"]["source"] == f"web=hf:{tmp_path / 'saved'}:body"
    capsys.readouterr()
    assert prepare_main(argv) == 0  # unchanged inputs: every shard is kept
    assert ", 0 shards tokenized" in capsys.readouterr().out


def _cut(data: bytes) -> bytes:
    return data[: len(data) // 2]


BAD_FILES = [
    ("cut.jsonl.gz", _cut(gzip.compress(_jsonl(_docs("x", 50)))), r"cut.jsonl.gz cannot be read as gzip-compressed "
     r"data \(Compressed file ended before the end-of-stream marker was reached\): it is cut short or corrupt"),
    ("cut.jsonl.zst", _cut(zstandard.ZstdCompressor().compress(_jsonl(_docs("x", 50)))),
     r"cut.jsonl.zst cannot be read as zstd-compressed data \(it ends inside a compressed frame\)"),
    ("junk.txt.gz", b"\x1f\x8b" + b"not deflate" * 5, r"junk.txt.gz cannot be read as gzip-compressed data"),
    ("empty.txt.zst", b"", r"empty.txt.zst is named .txt.zst but is empty \(0 bytes\), so it is not "
     r"zstd-compressed data.* reads plain text .*\(\.txt\.gz, \.txt\.zst, \.jsonl\.gz, \.jsonl\.zst\)"),
    ("plain.jsonl.gz", b'{"text": "not compressed"}\n', r"plain.jsonl.gz is named .jsonl.gz but does not start "
     r"with gzip's magic bytes"),
    ("notes.txt.bz2", bz2.compress(b"hello"), r"notes.txt.bz2 is bzip2-compressed \(by its name\), which prepare "
     r"does not read; it reads .*hf:PATH\[:column\].* Decompress it first \(bunzip2 "),
    ("table.csv.gz", gzip.compress(b"a,b\n1,2\n"), r"table.csv.gz is gzip-compressed, which prepare does not "
     r"read.* named .jsonl.gz or .txt.gz: rename it if it holds one of those"),
    ("body.jsonl.zst", zstandard.ZstdCompressor().compress(b'{"text": "ok"}\n{"body": "x"}\n'),
     r"body.jsonl.zst: line 2 \(decompressed\) has no string field 'text'"),
    ("cut.parquet", b"PAR1" + b"\x00" * 40, r"cut.parquet cannot be read as Parquet \(.*\): it is cut short or corrupt"),
]


@pytest.mark.parametrize("name, content, message", BAD_FILES, ids=[case[0] for case in BAD_FILES])
def test_bad_files_are_refused_naming_the_file(tmp_path, name, content, message):
    (tmp_path / name).write_bytes(content)
    with pytest.raises(DataError, match=message):
        prepare_dataset([f"a={tmp_path / name}"], tmp_path / "out", **OPTIONS)


def test_bad_saved_datasets_are_refused_naming_the_directory_and_the_fix(tmp_path, monkeypatch):
    import datasets

    saved = tmp_path / "saved"
    _saved_dataset(saved, _docs("hf", 10))
    cases = [
        (f"a=hf:{saved}", r"saved: no column 'text'; its columns are \['body', 'n'\]. Name the column"),
        (f"a=hf:{saved}:n", r"saved: column 'n' is Value\('int64'\), not a string column"),
        (f"a=hf:{tmp_path}", r"is not a dataset saved with save_to_disk \(it has no state.json\)"),
        (f"a=hf:{tmp_path / 'nowhere'}:body", r"nowhere' does not exist; hf: names a directory written by"),
        ("a=hf:", r"--source 'a=hf:' must look like DOMAIN=hf:PATH or DOMAIN=hf:PATH:COLUMN"),
    ]
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"body": ["x"]})}).save_to_disk(str(tmp_path / "dd"))
    cases.append((f"a=hf:{tmp_path / 'dd'}", r"holds a DatasetDict \(splits: train\); name one split's directory, "
                                             rf"e.g. hf:{tmp_path / 'dd' / 'train'}"))
    for source, message in cases:
        with pytest.raises(DataError, match=message):
            prepare_dataset([source], tmp_path / "out", **OPTIONS)
    monkeypatch.setitem(sys.modules, "datasets", None)  # as if it were not installed
    with pytest.raises(DataError, match=r"saved: reading a Hugging Face dataset needs the datasets package.*"
                                        r"pip install 'moejax\[parquet\]'"):
        prepare_dataset([f"a=hf:{saved}:body"], tmp_path / "out", **OPTIONS)
    assert not (tmp_path / "out" / layout.DATASET_FILE).exists()
