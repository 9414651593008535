"""Relative paths mean what the user typed, from any directory: every command resolves them
against the current directory before a library sees them (orbax refuses relative checkpoint paths)."""

from __future__ import annotations

import json
import os

import pytest

import moejax
from moejax.data.prepare import main as prepare_main
from moejax.generate import main as generate_main
from moejax.interop.hf.cli import main as hf_main
from tests.test_eval import workdir  # noqa: F401 (the shared trained run)


def test_commands_take_relative_paths_from_another_directory(workdir, tmp_path, monkeypatch, capsys):
    elsewhere = tmp_path / "user"
    (elsewhere / "runs").mkdir(parents=True)
    os.symlink(workdir, elsewhere / "runs" / "main")
    (elsewhere / "texts.jsonl").write_text("".join(json.dumps({"text": f"line {i} " * 20}) + "\n" for i in range(80)))
    monkeypatch.chdir(elsewhere)
    monkeypatch.setattr(moejax, "CALLER_CWD", None)  # run directly, not through launch.sh

    assert prepare_main(["--source", "t=texts.jsonl", "--out", "datasets/mine", "--seq-len", "16",
                         "--heldout-fraction", "0.2"]) == 0
    assert (elsewhere / "datasets" / "mine" / "dataset.json").is_file()

    pytest.importorskip("transformers")  # the dev extra's: a small Mixtral written by save_pretrained
    from tests.test_hf_interop import hf_checkpoint

    hf_checkpoint("mixtral", str(elsewhere))  # ./mixtral
    hf_main(["import", "--hf-dir", "mixtral", "--workdir", "runs/imported"])
    hf_main(["export", "--workdir", "runs/imported", "--hf-dir", "hf_out"])  # once: "Checkpoint path should be absolute"
    assert (elsewhere / "hf_out" / "config.json").is_file()
    assert f"exported {elsewhere / 'runs' / 'imported'} as mixtral" in capsys.readouterr().out

    generate_main(["--workdir", "runs/main", "--prompt", "def ", "--max-new-tokens", "4"])
    assert "--- step" in capsys.readouterr().out

    model = moejax.load("runs/main")
    assert model.workdir == str(elsewhere / "runs" / "main") and model.step > 0
