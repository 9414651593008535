"""``prepare`` writes dataset.json last, only on success; a failed run leaves nothing behind, an
interrupted one its finished shards (a rerun resumes), which are never taken for a dataset, and
training says what happened and how to fix it."""
import json

import pytest

from moejax.data import prepare as prepare_lib
from moejax.data.dataset import PROGRESS_FILE, describe_dataset
from moejax.errors import DataError
from moejax.data.prepare import main as prepare_main, prepare_dataset


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("atomic")
    for domain in ("good", "other"):
        (root / domain).mkdir()
        with open(root / domain / "docs.jsonl", "w") as f:
            for i in range(120):
                f.write(json.dumps({"text": f"{domain} document {i} " + "word " * (i % 17 + 5)}) + "\n")
    (root / "blank").mkdir()
    (root / "blank" / "empty.txt").write_text("  \n\n")
    return root


def _prepare(out, *specs):
    return prepare_dataset(list(specs), out, heldout_fraction=0.3, workers=1, progress=False, shard_mb=0.002)


def test_failed_prepare_leaves_nothing_behind(sources, tmp_path, capsys):
    out = tmp_path / "ds"
    with pytest.raises(SystemExit) as exit_:
        prepare_main(["--source", f"good={sources / 'good'}", "--source", f"blank={sources / 'blank'}",
                      "--out", str(out), "--workers", "1", "--heldout-fraction", "0.3", "--shard-mb", "0.002"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"source blank={sources / 'blank'} holds no non-empty documents" in err  # what happened
    assert f"Nothing was left behind: {out} was removed." in err
    assert not out.exists()  # good's shards were written before blank failed, and removed with the rest

    # The same --out with the input fixed starts afresh and completes.
    summary = _prepare(out, f"good={sources / 'good'}")
    assert summary["shards_skipped"] == 0 and (out / "dataset.json").is_file()
    assert not (out / PROGRESS_FILE).exists()
    assert describe_dataset(str(out)).domains == ("good",)


def test_a_failed_record_left_by_an_older_prepare_is_named_by_training(sources, tmp_path):
    out = tmp_path / "ds"
    out.mkdir()
    (out / PROGRESS_FILE).write_text(json.dumps({"state": "failed", "domains": ["blank"], "error": "no documents."}))
    with pytest.raises(DataError) as error:
        describe_dataset(str(out))
    message = str(error.value)
    assert "the prepare run into it failed" in message and "Its error was: no documents." in message
    assert "rerun the prepare command (it first removes what the failed run left)" in message


def test_interrupted_prepare_is_reported_as_interrupted_and_finishes_on_rerun(sources, tmp_path, monkeypatch):
    out = tmp_path / "ds"
    real = prepare_lib.tokenize_shard
    calls = []

    def interrupted_on_the_third_shard(task):
        calls.append(task)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(task)

    monkeypatch.setattr(prepare_lib, "tokenize_shard", interrupted_on_the_third_shard)
    with pytest.raises(KeyboardInterrupt):
        _prepare(out, f"good={sources / 'good'}", f"other={sources / 'other'}")
    monkeypatch.undo()
    assert not (out / "dataset.json").exists()
    with pytest.raises(DataError, match=r"a prepare run into it \(domains good, other\) was interrupted or is "
                                        r"still running, so it has no dataset.json\. Rerun the same prepare "
                                        r"command to finish it"):
        describe_dataset(str(out))
    summary = _prepare(out, f"good={sources / 'good'}", f"other={sources / 'other'}")
    assert summary["shards_skipped"] == 2  # the two shards finished before the interruption
    assert describe_dataset(str(out)).domains == ("good", "other")


def test_failed_addition_leaves_the_existing_dataset_untouched(sources, tmp_path):
    out = tmp_path / "ds"
    _prepare(out, f"good={sources / 'good'}")
    before = (out / "dataset.json").read_bytes()
    files = sorted(p.relative_to(out) for p in out.rglob("*"))
    with pytest.raises(DataError, match="holds no non-empty documents"):
        _prepare(out, f"good={sources / 'good'}", f"blank={sources / 'blank'}")
    assert (out / "dataset.json").read_bytes() == before
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == files  # nothing of the failed run left
    assert describe_dataset(str(out)).domains == ("good",)  # still a dataset, of its finished domains


def test_tiny_heldout_split_warns_in_prepare_and_at_training_start(sources, tmp_path):
    from moejax.config import default_config
    from moejax.data.dataset import MIN_HELDOUT_DOCUMENTS, MIN_HELDOUT_TOKENS, HeldoutWarning
    from moejax.data.from_config import make_data

    out = tmp_path / "ds"
    with pytest.warns(HeldoutWarning) as caught:
        prepare_dataset([f"good={sources / 'good'}"], out, heldout_fraction=0.05, workers=1, progress=False)
    (warning,) = caught
    message = str(warning.message)
    assert (MIN_HELDOUT_DOCUMENTS, MIN_HELDOUT_TOKENS) == (20, 8192)  # the documented minimum (docs/data.md)
    assert "domain 'good' has a held-out split of" in message
    assert "below the minimum of 20 documents and 8,192 tokens" in message
    assert "give it more text" in message  # 120 short documents: no fraction reaches 8,192 tokens
    assert warning.filename == __file__  # points at the caller, not at library code

    cfg = default_config()
    cfg.train.seq_len, cfg.train.global_batch_size, cfg.train.eval_batches = 32, 8, 1
    cfg.data.path, cfg.data.mixture = str(out), {"good": 1.0}
    with pytest.warns(HeldoutWarning, match=rf"prepared dataset {out}: domain 'good' has a held-out split"):
        make_data(cfg)


def test_heldout_warning_suggests_the_fraction_that_reaches_the_minimum():
    from moejax.data.dataset import small_heldout_message

    message = small_heldout_message("logs", 6, 853, total_documents=600, total_tokens=85_000, fraction=0.01)
    # max(20 / 600, 8192 / 85000) = 0.0964, with a 20% margin: 0.12
    assert "Rerun the prepare command with --heldout-fraction 0.12 (now 0.01)" in message
    assert small_heldout_message("logs", 40, 9000, total_documents=600, total_tokens=85_000, fraction=0.1) == ""


def test_a_disk_that_fills_during_prepare_is_one_paragraph(sources, tmp_path, capsys, monkeypatch):
    import errno

    def full(task):  # what a worker's np.save raises when the disk fills
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(prepare_lib, "tokenize_shard", full)
    out = tmp_path / "ds"
    with pytest.raises(SystemExit) as exit_:
        prepare_main(["--source", f"good={sources / 'good'}", "--out", str(out), "--workers", "1", "--shard-mb", "0.002"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("prepare: error: ") and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert f"the disk holding {out} is full" in err and "No space left on device" in err and "free" in err
    assert f"Nothing was left behind: {out} was removed." in err and not out.exists()
