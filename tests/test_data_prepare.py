"""Tests for user datasets: sources, prepare (shards, manifests, resumption), BPE, load_tokenizer,
and training batches from a prepared dataset."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from moejax.config import default_config
from moejax.data import layout
from moejax.data.dataset import PROGRESS_FILE, open_dataset, verify_dataset
from moejax.errors import DataError
from moejax.data.from_config import make_data
from moejax.data.packing import ShardedPacker
from moejax.data.prepare import main as prepare_main
from moejax.data.prepare import prepare_dataset
from moejax.data.streams import tokenize_documents
from moejax.data.synthetic_knowledge import knowledge_documents
from moejax.data.synthetic_math import math_documents
from moejax.data.tokenizer import ByteTokenizer, check_tokenizer_matches, load_tokenizer

OPTIONS = dict(heldout_fraction=0.2, shard_mb=0.02, workers=1, progress=False)


@pytest.fixture(scope="module")
def docs():
    """Documents per source format: distinct texts of a few hundred bytes."""
    math = math_documents(1, 60_000)
    knowledge = knowledge_documents(1, 150_000)
    return {"txt": math[:80], "jsonl": knowledge[:400], "parquet": knowledge[400:700] + ["naïve ✓ — ünïcode"]}


@pytest.fixture(scope="module")
def sources(tmp_path_factory, docs) -> dict[str, str]:
    """One source per format, with things prepare must skip: empty documents, nulls, hidden and
    unrelated files, blank JSONL lines and extra fields."""
    root = tmp_path_factory.mktemp("sources")
    txt = root / "txt"
    for i, doc in enumerate(docs["txt"]):
        path = txt / f"part{i % 3}" / f"{i:03d}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(doc, encoding="utf-8")
    (txt / "empty.txt").write_text("")
    (txt / "blank.txt").write_text("  \n\n ")
    (txt / ".hidden.txt").write_text("never read")
    (txt / "notes.md").write_text("not a source format: ignored in a directory")
    lines = []
    for i, doc in enumerate(docs["jsonl"]):
        lines.append(json.dumps({"text": doc, "id": i, "meta": {"lang": "en"}}))
        if i % 97 == 0:
            lines += ["", json.dumps({"text": None})]
    (root / "facts.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    table = pa.table({"id": list(range(len(docs["parquet"]) + 1)),
                      "text": docs["parquet"] + [None]})
    pq.write_table(table, root / "facts.parquet", row_group_size=40)
    return {"txt": str(txt), "jsonl": str(root / "facts.jsonl"), "parquet": str(root / "facts.parquet")}


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, sources) -> tuple[str, dict]:
    out = str(tmp_path_factory.mktemp("prepared") / "ds")
    summary = prepare_dataset([f"{kind}={path}" for kind, path in sources.items()], out, **OPTIONS)
    return out, summary


def _documents(dataset, domain: str, split: str) -> list[str]:
    """Decode every document of a domain split of a prepared dataset."""
    out = []
    for stream in dataset.streams(domain, split):
        if not stream.num_documents:
            continue
        ends = np.append(stream.doc_starts[1:], stream.num_tokens) - 1
        assert (stream.tokens[ends] == dataset.tokenizer.eos_id).all()
        out += [dataset.tokenizer.decode(stream.tokens[s:e]) for s, e in zip(stream.doc_starts, ends)]
    return out


def _file_times(directory: str) -> dict[str, int]:
    return {str(p): p.stat().st_mtime_ns for p in Path(directory).rglob("shard-*.npy")}


# --- prepare ------------------------------------------------------------------------------------


def test_prepare_round_trips_every_document_of_every_format(prepared, docs):
    out, summary = prepared
    dataset = open_dataset(out)
    assert dataset.domains == ("jsonl", "parquet", "txt")  # Name order, whatever the CLI order.
    assert dataset.tokenizer.name == "byte"
    for domain in dataset.domains:
        train, heldout = (_documents(dataset, domain, s) for s in layout.SPLITS)
        # Every non-empty document exactly once, across JSONL byte ranges and Parquet row groups.
        assert Counter(train + heldout) == Counter(docs[domain])
        assert not set(train) & set(heldout)
        assert 0.08 < len(heldout) / len(docs[domain]) < 0.35  # heldout_fraction 0.2
        manifest = dataset.manifest["domain_manifests"][domain]
        assert manifest["splits"]["train"]["documents"] == len(train)
        assert manifest["dtype"] == "uint16" and manifest["tokenizer"] == "byte"
        tokens = sum(len(d.encode()) + 1 for d in train)
        assert manifest["splits"]["train"]["tokens"] == tokens
        assert summary["domains"][domain]["train"]["tokens"] == tokens
    counts = {d: dataset.manifest["domain_manifests"][d]["skipped_documents"] for d in dataset.domains}
    assert counts == {"txt": 2, "jsonl": 5, "parquet": 1}  # empty/blank files, nulls
    assert len(dataset.manifest["domain_manifests"]["jsonl"]["shards"]) >= 4  # 0.02 MB shards
    assert summary["shards_skipped"] == 0 and summary["shards_tokenized"] > 10


def test_same_inputs_give_the_same_content_hash_whatever_the_workers(prepared, sources, tmp_path):
    out, _ = prepared
    again = prepare_dataset([f"{k}={p}" for k, p in sources.items()], tmp_path / "again",
                            **{**OPTIONS, "workers": 2})
    original = json.loads((Path(out) / layout.DATASET_FILE).read_text())
    parallel = json.loads((tmp_path / "again" / layout.DATASET_FILE).read_text())
    assert parallel["sha256"] == original["sha256"]
    assert parallel["domains"] == original["domains"]
    assert again["shards_tokenized"] == sum(len(open_dataset(out).manifest["domain_manifests"][d]["shards"])
                                            for d in original["domains"])
    assert verify_dataset(tmp_path / "again") == 4 * again["shards_tokenized"]


def test_rerun_skips_finished_shards_and_redoes_changed_ones(sources, tmp_path):
    src = [f"jsonl={sources['jsonl']}", f"txt={sources['txt']}"]
    out = tmp_path / "ds"
    first = prepare_dataset(src, out, **OPTIONS)
    reference = json.loads((out / layout.DATASET_FILE).read_text())
    times = _file_times(out)
    # An interrupted run: a shard without its record, a leftover temporary file, no manifest.
    (out / "txt" / "shard-00001.json").unlink()
    (out / "txt" / layout.MANIFEST_FILE).unlink()
    (out / "txt" / ".shard-00002.train.tokens.npy.tmp").write_bytes(b"partial")
    again = prepare_dataset(src, out, **OPTIONS)
    assert again["shards_tokenized"] == 1
    assert again["shards_skipped"] == first["shards_tokenized"] - 1
    assert json.loads((out / layout.DATASET_FILE).read_text()) == reference
    changed = {p for p, t in _file_times(out).items() if times[p] != t}
    assert changed and all("txt/shard-00001." in p for p in changed)
    assert not list(out.rglob(f"*{layout.TMP_SUFFIX}"))
    # A source file that changed is tokenized again; the rest is kept.
    edited = sorted(Path(sources["txt"]).rglob("*.txt"))[-1]
    original = edited.read_text()
    try:
        edited.write_text(original + "\nOne more line.")
        third = prepare_dataset(src, out, **OPTIONS)
    finally:
        edited.write_text(original)
    assert third["shards_tokenized"] == 1
    assert json.loads((out / layout.DATASET_FILE).read_text())["sha256"] != reference["sha256"]


def test_a_failed_run_leaves_nothing_and_the_fixed_rerun_completes(tmp_path, docs):
    """The run dies on a bad line in its last file, after other shards were written: the new output
    directory is removed; a run into an existing dataset removes only what it wrote."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs["jsonl"]))
    (src / "b.jsonl").write_text(json.dumps({"text": "fine"}) + "\n{not json\n")
    with pytest.raises(DataError, match=r"b.jsonl: the line at byte 17 is not valid JSON.* Nothing was left behind"):
        prepare_dataset([f"facts={src}"], tmp_path / "ds", **OPTIONS)
    assert not (tmp_path / "ds").exists()
    (src / "b.jsonl").write_text(json.dumps({"text": "fine"}) + "\n")
    summary = prepare_dataset([f"facts={src}"], tmp_path / "ds", **OPTIONS)
    assert summary["shards_skipped"] == 0 and summary["shards_tokenized"] >= 4
    before = sorted(str(p.relative_to(tmp_path)) for p in (tmp_path / "ds").rglob("*"))
    (src / "b.jsonl").write_text("{not json\n")
    with pytest.raises(DataError, match=r"were removed; what was there before is untouched"):
        prepare_dataset([f"more={src / 'b.jsonl'}"], tmp_path / "ds", **OPTIONS)
    assert sorted(str(p.relative_to(tmp_path)) for p in (tmp_path / "ds").rglob("*")) == before


def test_files_a_failed_run_of_an_older_version_left_are_cleared_and_said(tmp_path, docs, caplog):
    src = tmp_path / "a.jsonl"
    src.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs["jsonl"]))
    out = tmp_path / "ds"
    (out / "facts").mkdir(parents=True)
    (out / "facts" / "shard-00000.train.tokens.npy").write_bytes(b"left by a failed run")
    (out / PROGRESS_FILE).write_text(json.dumps({"state": "failed", "domains": ["facts"], "error": "bad line"}))
    prepare_dataset([f"facts={src}"], out, **OPTIONS)
    assert "an earlier run into" in caplog.text and "removed what it left: facts, prepare-progress.json" in caplog.text
    assert open_dataset(out).domains == ("facts",)


def test_non_utf8_text_is_refused_naming_the_file_byte_and_line(tmp_path):
    text, jsonl = tmp_path / "latin1.txt", tmp_path / "latin1.jsonl"
    text.write_bytes("line one\ncaf\u00e9 two\n".encode("latin-1"))
    jsonl.write_bytes(b'{"text": "ok"}\n' + '{"text": "caf\u00e9"}\n'.encode("latin-1"))
    with pytest.raises(DataError, match=r"latin1.txt: byte 12 \(line 2\) is not valid UTF-8 .*iconv"):
        prepare_dataset([f"prose={text}"], tmp_path / "a", **OPTIONS)
    with pytest.raises(DataError, match=r"latin1.jsonl: the line at byte 15: byte 28 is not valid UTF-8"):
        prepare_dataset([f"prose={jsonl}"], tmp_path / "b", **OPTIONS)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_adding_a_domain_keeps_the_others(prepared, sources, tmp_path):
    out = tmp_path / "ds"
    prepare_dataset([f"txt={sources['txt']}"], out, **OPTIONS)
    times = _file_times(out)
    summary = prepare_dataset([f"code={sources['jsonl']}"], out, **OPTIONS)
    assert open_dataset(out).domains == ("code", "txt")
    assert summary["shards_skipped"] == 0
    assert all(_file_times(out)[p] == t for p, t in times.items())


# --- tokenizers ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bpe_dataset(tmp_path_factory, sources) -> str:
    out = str(tmp_path_factory.mktemp("bpe") / "ds")
    prepare_dataset([f"txt={sources['txt']}", f"jsonl={sources['jsonl']}"], out,
                    tokenizer="bpe", vocab_size=400, **OPTIONS)
    return out


def test_bpe_is_trained_saved_beside_the_data_and_round_trips(bpe_dataset, docs, sources, tmp_path):
    tok = load_tokenizer(bpe_dataset)
    assert tok.name.startswith("bpe-400-") and len(tok.name) == len("bpe-400-") + 12
    assert load_tokenizer(Path(bpe_dataset) / layout.TOKENIZER_FILE).name == tok.name
    dataset = open_dataset(bpe_dataset)
    assert dataset.tokenizer.name == tok.name
    assert (tok.bos_id, tok.eos_id, tok.pad_id) == (0, 1, 2)
    for domain in ("txt", "jsonl"):
        decoded = _documents(dataset, domain, "train") + _documents(dataset, domain, "heldout")
        assert Counter(decoded) == Counter(docs[domain])
        manifest = dataset.manifest["domain_manifests"][domain]
        assert manifest["tokenizer"] == tok.name
        byte_tokens = sum(len(d.encode()) for d in docs[domain])  # 400 tokens compress a little
        bpe_tokens = manifest["splits"]["train"]["tokens"] + manifest["splits"]["heldout"]["tokens"]
        assert bpe_tokens < 0.8 * byte_tokens
    text = "Q: What is 12 + 30?\nA: 42 — naïve ✓"
    assert tok.decode(tok.encode(text)) == text
    # Deterministic: the same corpus trains the same tokenizer, hence the same id.
    again = tmp_path / "again"
    prepare_dataset([f"txt={sources['txt']}", f"jsonl={sources['jsonl']}"], again,
                    tokenizer="bpe", vocab_size=400, **OPTIONS)
    assert load_tokenizer(again).name == tok.name


def test_a_dataset_refuses_a_second_tokenizer(prepared, bpe_dataset, sources):
    out, _ = prepared
    bpe_id = load_tokenizer(bpe_dataset).name
    with pytest.raises(DataError, match=rf"dataset {out} is tokenized with 'byte' .* asks for 'a new "
                                        r"bpe-400-<hash>'. A dataset holds one tokenizer"):
        prepare_dataset([f"txt={sources['txt']}"], out, tokenizer="bpe", vocab_size=400, **OPTIONS)
    with pytest.raises(DataError, match=rf"dataset {bpe_dataset} is tokenized with '{bpe_id}' .* asks "
                                        r"for 'byte'"):
        prepare_dataset([f"more={sources['txt']}"], bpe_dataset, **OPTIONS)
    with pytest.raises(DataError, match=rf"tokenized with '{bpe_id}' .* asks for 'a new bpe-512"):
        prepare_dataset([f"more={sources['txt']}"], bpe_dataset, tokenizer="bpe", vocab_size=512, **OPTIONS)


def test_load_tokenizer_and_tokenizer_checks(bpe_dataset, prepared, tmp_path):
    assert isinstance(load_tokenizer("byte"), ByteTokenizer)
    assert isinstance(load_tokenizer(prepared[0]), ByteTokenizer)
    bpe_id = load_tokenizer(bpe_dataset).name
    with pytest.raises(DataError, match=rf"tokenizer '{bpe_id}' is a trained BPE: load it from the "
                                        r"tokenizer.json beside its data"):
        load_tokenizer(bpe_id)
    with pytest.raises(DataError, match=r"'wordpiece' is neither 'byte' nor an existing tokenizer.json"):
        load_tokenizer("wordpiece")
    with pytest.raises(DataError, match=r"broken.json is not a tokenizer file the tokenizers library can read"):
        (tmp_path / "broken.json").write_text("{}")
        load_tokenizer(tmp_path / "broken.json")
    # A replaced tokenizer.json no longer matches the id the data was tokenized with.
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / layout.DATASET_FILE).write_text((Path(bpe_dataset) / layout.DATASET_FILE).read_text())
    (copy / layout.TOKENIZER_FILE).write_text(
        (Path(bpe_dataset) / layout.TOKENIZER_FILE).read_text().replace('"<|pad|>"', '"<|pad|>" ', 1))
    with pytest.raises(DataError, match=rf"is tokenizer 'bpe-400-\w+', but .* tokenized with '{bpe_id}'"):
        load_tokenizer(copy)
    check_tokenizer_matches(bpe_id, bpe_id)
    with pytest.raises(DataError, match=rf"tokenizer mismatch: data/ds is tokenized with '{bpe_id}', "
                                        r"but runs/x/checkpoints/200 was trained with 'byte'\. Use the data"):
        check_tokenizer_matches(bpe_id, "byte", data_source="data/ds", checkpoint="runs/x/checkpoints/200")


# --- bad input ----------------------------------------------------------------------------------


def test_bad_sources_fail_with_messages_naming_the_source(sources, tmp_path):
    empty_dir = tmp_path / "empty"
    empty_dir.mkdir()
    blank = tmp_path / "blank"
    blank.mkdir()
    (blank / "a.txt").write_text("\n")
    no_field = tmp_path / "no_field.jsonl"
    no_field.write_text('{"body": "x"}\n')
    numbers = tmp_path / "numbers.parquet"
    pq.write_table(pa.table({"text": [1, 2]}), numbers)
    out = tmp_path / "out"
    # Found while planning, before anything is written:
    for args, message in [
        (["code=/no/such/dir"], r"source code=/no/such/dir: path '/no/such/dir' does not exist"),
        ([f"code={empty_dir}"], rf"source code={empty_dir}: '{empty_dir}' is a directory without "
                                r"\.jsonl, \.parquet, \.txt files"),
        ([f"code={tmp_path}/*.nothing"], r"matches no file"),
        ([f"web={numbers}"], r"numbers.parquet: column 'text' has type int64, not string"),
        ([f"a={sources['txt']}", f"a={sources['jsonl']}"], r"domain 'a' is given twice"),
        ([f"tokens/x={sources['txt']}"], r"domain name 'tokens/x' must be 1-64 letters"),
        ([sources["txt"]], r"must look like DOMAIN=PATH"),
        ([], r"no --source given"),
    ]:
        with pytest.raises(DataError, match=message):
            prepare_dataset(args, out, **OPTIONS)
        assert not out.exists()
    # Found while reading:
    for args, message in [
        ([f"code={blank}"], rf"source code={blank} holds no non-empty documents"),
        ([f"web={no_field}"], r"no_field.jsonl: the line at byte 0 has no string field 'text'.*--text-field"),
    ]:
        with pytest.raises(DataError, match=message):
            prepare_dataset(args, tmp_path / "read_errors", **OPTIONS)
    with pytest.raises(DataError, match=r"no column 'body'; its columns are \['id', 'text'\]"):
        prepare_dataset([f"web={sources['parquet']}"], out, text_field="body", **OPTIONS)
    with pytest.raises(DataError, match=r"--heldout-fraction 1.5: allowed: a number in \[0, 1\)"):
        prepare_dataset([f"a={sources['txt']}"], out, **{**OPTIONS, "heldout_fraction": 1.5})
    with pytest.raises(DataError, match=r"--tokenizer 'wordpiece': no such file or directory\. Allowed: byte \| bpe \| a tokenizer.json"):
        prepare_dataset([f"a={sources['txt']}"], out, tokenizer="wordpiece", **OPTIONS)
    (tmp_path / "occupied").mkdir()
    (tmp_path / "occupied" / "thesis.tex").write_text("keep me")
    with pytest.raises(DataError, match=r"--out .*occupied exists and is not a prepared dataset"):
        prepare_dataset([f"a={sources['txt']}"], tmp_path / "occupied", **OPTIONS)


def test_glob_sources_read_any_suffix_as_text(tmp_path):
    for name in ("a.py", "b.py", "c.txt"):
        (tmp_path / name).write_text(f"# {name}\nprint('{name}')\n")
    out = tmp_path / "ds"
    with pytest.warns(UserWarning, match=r"domain 'code': its held-out split has 0 documents .* asks for no held-out"):
        prepare_dataset([f"code={tmp_path}/*.py"], out, **{**OPTIONS, "heldout_fraction": 0.0, "seq_len": 16})
    dataset = open_dataset(out)
    expected = ["# a.py\nprint('a.py')\n", "# b.py\nprint('b.py')\n"]  # c.txt does not match
    assert sorted(_documents(dataset, "code", "train")) == expected


def test_cli_prepares_verifies_and_reports_errors(sources, tmp_path, capsys):
    out = tmp_path / "ds"
    assert prepare_main(["--source", f"txt={sources['txt']}", "--out", str(out), "--workers", "1",
                         "--heldout-fraction", "0.2", "--shard-mb", "0.02"]) == 0
    printed = capsys.readouterr().out
    assert "txt: train" in printed and "tokenizer byte" in printed and "0 already done" in printed
    assert prepare_main(["--out", str(out), "--verify"]) == 0
    assert "files match their checksums" in capsys.readouterr().out
    shard = sorted((out / "txt").glob("shard-*.train.tokens.npy"))[0]
    data = bytearray(shard.read_bytes())
    data[-1] ^= 1
    shard.write_bytes(bytes(data))
    with pytest.raises(SystemExit) as stop:  # the command runner exits with the status
        prepare_main(["--out", str(out), "--verify"])
    assert stop.value.code == 2
    assert f"shard file {shard} does not match the sha256 recorded in its manifest" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:
        prepare_main(["--source", "x=/missing", "--out", str(tmp_path / "new")])
    assert stop.value.code == 2
    assert "prepare: error: source x=/missing: path '/missing' does not exist" in capsys.readouterr().err


# --- training data from a prepared dataset ------------------------------------------------------


def test_sharded_packer_never_crosses_shards():
    tok = ByteTokenizer()
    shards = [tokenize_documents(["abcdefg", "hi"], tok), tokenize_documents(["jklmnopqrs"], tok)]
    packer = ShardedPacker(shards, seq_len=4, domain=1)
    assert [p.num_windows for p in packer.packers] == [2, 2] and packer.num_windows == 4
    windows = [tok.decode(packer(i)["inputs"]) for i in range(4)]
    assert windows == ["abcd", "efg", "jklm", "nopq"]  # "efg" + EOS: shard 0 ends after 2 windows
    assert packer(1)["segment_ids"].tolist() == [1, 1, 1, 1] and packer(3)["domain"] == 1
    with pytest.raises(IndexError, match=r"window 4 out of range \[0, 4\)"):
        packer(4)


def _cfg(path: str, **data) -> object:
    cfg = default_config()
    cfg.train.seq_len, cfg.train.global_batch_size, cfg.train.eval_batches = 32, 8, 2
    cfg.data.path = path
    for key, value in data.items():
        cfg.data[key] = value
    return cfg


def test_make_data_trains_on_a_prepared_dataset(prepared, bpe_dataset, tmp_path):
    out, _ = prepared
    mixture = tmp_path / "mix.json"
    mixture.write_text(json.dumps({"weights": {"txt": 0.5, "jsonl": 0.25, "parquet": 0.25}}))
    data = make_data(_cfg(out, mixture_file=str(mixture)))
    assert data.domains == ("jsonl", "parquet", "txt") and data.tokenizer.name == "byte"
    batches = [next(data.train_iter) for _ in range(50)]
    shares = np.bincount(np.concatenate([b["domain"] for b in batches]), minlength=3) / 400
    np.testing.assert_allclose(shares, [0.25, 0.25, 0.5], atol=0.01)
    assert set(data.eval_batches) == set(data.domains)
    for batch in batches[:3] + [b for bs in data.eval_batches.values() for b in bs]:
        assert batch["inputs"].shape == (8, 32)
        new_doc = batch["segment_ids"][:, 1:] != batch["segment_ids"][:, :-1]
        assert (batch["inputs"][:, :-1][new_doc] == ByteTokenizer.eos_id).all()
    # The built-in default mixture names domains this dataset does not have.
    with pytest.raises(DataError, match=rf"data.mixture names domain 'code', which prepared dataset "
                                        rf"{out} does not have; its domains are: jsonl, parquet, txt"):
        make_data(_cfg(out))
    with pytest.raises(DataError, match=r"'model.vocab_size' has value 272; allowed: at least the "
                                        r"vocabulary of the tokenizer of prepared dataset "
                                        r".*\(bpe-400-\w+, .*tokenizer\.json: 400 tokens\)\. "
                                        r"Set --config.model.vocab_size=512"):
        make_data(_cfg(bpe_dataset, schedule='[[0, {"txt": 1}]]'))
    cfg = _cfg(bpe_dataset, schedule='[[0, {"txt": 1}], [10, {"jsonl": 1}]]')
    cfg.model.vocab_size = 512
    bpe_data = make_data(cfg)
    assert bpe_data.tokenizer.name.startswith("bpe-400-")
    assert next(bpe_data.train_iter)["inputs"].max() < 400


def test_incomplete_or_foreign_dataset_dirs_are_refused(prepared, tmp_path):
    out, _ = prepared
    with pytest.raises(DataError, match=rf"data.path '{tmp_path}' is not a prepared dataset: "
                                        rf".*dataset.json is missing. Prepare it with"):
        make_data(_cfg(str(tmp_path)))
    partial = tmp_path / "partial"
    partial.mkdir()
    dataset = json.loads((Path(out) / layout.DATASET_FILE).read_text())
    (partial / layout.DATASET_FILE).write_text(json.dumps(dataset))
    with pytest.raises(DataError, match=r"lists domain 'jsonl' but .*manifest.json is missing: a "
                                        r"prepare run was interrupted"):
        open_dataset(partial)


def test_files_are_read_by_what_they_are_not_by_their_name(tmp_path):
    """Compressed or tabular files are refused, never read as text; Parquet is known by content;
    a directory says which files it skipped."""
    import gzip

    from moejax.data.sources import SkippedFilesWarning

    records = "".join(json.dumps({"text": f"document {i} " * 30}) + "\n" for i in range(40))
    with gzip.open(tmp_path / "named_plain.jsonl", "wt") as f:  # gzip bytes behind a .jsonl name
        f.write(records)
    with pytest.raises(DataError, match=r"named_plain.jsonl is gzip-compressed.*Rename it to named_plain.jsonl.gz"):
        prepare_dataset([f"a={tmp_path / 'named_plain.jsonl'}"], tmp_path / "o1", **OPTIONS)
    (tmp_path / "t.csv").write_text("title,text\nx,hello\n")
    with pytest.raises(DataError, match=r"t.csv is a CSV table, which prepare does not read; it reads plain text"):
        prepare_dataset([f"a={tmp_path / 't.csv'}"], tmp_path / "o2", **OPTIONS)
    table = pa.table({"text": [f"row {i} " * 40 for i in range(60)]})
    pq.write_table(table, tmp_path / "rows.bin")  # Parquet content, another name
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    (mixed / "a.txt").write_text("plain text " * 400)
    (mixed / "b.txt").write_text("more text " * 400)
    (mixed / "c.csv").write_text("x,y\n")
    with pytest.warns(SkippedFilesWarning, match=r"source m=.*mixed: skipped 1 file\(s\) .*c.csv \(a CSV table\)"):
        prepare_dataset([f"p={tmp_path / 'rows.bin'}", f"m={mixed}"], tmp_path / "o3",
                        **{**OPTIONS, "heldout_fraction": 0.5, "seq_len": 16})
    assert open_dataset(tmp_path / "o3").info.domains == ("m", "p")


def test_prepare_chooses_a_held_out_fraction_that_holds_out_enough_and_keeps_it_on_rerun(tmp_path, caplog):
    """1% of 60 documents holds out none: prepare picks a fraction itself (no rerun), says so,
    records it, and a rerun of the same command skips every shard."""
    src = tmp_path / "small"
    src.mkdir()
    for i in range(60):  # 60 documents, ~2.4k tokens each
        (src / f"f{i:02d}.txt").write_text(" ".join(f"w{(i * 31 + j) % 97}" for j in range(600)))
    many = tmp_path / "many.jsonl"  # 3,000 documents of ~60 tokens: 1% holds out ~30 docs, ~1.8k tokens
    many.write_text("".join(json.dumps({"text": f"record {i}: " + "lorem ipsum " * 5}) + "\n" for i in range(3000)))
    options = {**OPTIONS, "heldout_fraction": 0.01}
    with caplog.at_level("INFO", logger="moejax"):
        summary = prepare_dataset([f"small={src}", f"many={many}"], tmp_path / "ds", **options)
    chosen = summary["heldout_fractions"]
    assert chosen["small"] > 0.01 and chosen["many"] > 0.01
    assert f"domain 'many': held-out fraction {chosen['many']:g} instead of 0.01" in caplog.text
    many_split = summary["domains"]["many"]["heldout"]
    assert many_split["documents"] >= 20 and many_split["tokens"] >= 8192  # the documented minimum
    assert summary["domains"]["small"]["heldout"]["tokens"] >= 257  # a training window at least
    manifest = json.loads((tmp_path / "ds" / "many" / layout.MANIFEST_FILE).read_text())
    assert (manifest["heldout_fraction"], manifest["heldout_fraction_asked"]) == (chosen["many"], 0.01)
    again = prepare_dataset([f"small={src}", f"many={many}"], tmp_path / "ds", **options)
    assert again["shards_tokenized"] == 0 and again["heldout_fractions"] == chosen
    # A source too small for any split stops with the reason.
    tiny = tmp_path / "tiny.txt"
    tiny.write_text("a few words " * 20)
    with pytest.raises(DataError, match=r"domain 'tiny': its train split has 1 documents / 241 tokens, less than "
                                        r"one training window of 257 tokens .* give it more text"):
        prepare_dataset([f"tiny={tiny}"], tmp_path / "ds2", **options)
