"""The bad-input drill: every moejax command line, fed the mistakes users make with paths and files.

Each row runs one CLI entry point in-process (its ``main(argv)``) on a bad path or value -- a path
that does not exist, a file where a directory is expected, a directory that cannot be created, an
existing non-empty output, truncated JSON/CSV, a file of the wrong kind -- and asserts what a user
relies on: exit status 2, one ``error:`` paragraph naming the problem, no traceback, and every file
of the user's unchanged (hashed before and after). A few rows run ``launch.sh`` from another
directory, where relative paths must mean what the user typed.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from moejax.data import prepare
from moejax.data import export as corpus_export
from moejax.data import l3_alloc
from moejax.eval import __main__ as eval_cli
from moejax import generate, main as train_cli
from moejax.interop import hf

ROOT = Path(__file__).resolve().parent.parent
PROC = "/proc/moejax_cannot_create_this"  # a directory nobody can create, not even root
WORDS = "the quick brown fox jumps over a lazy dog while seven cats sleep in the warm sun".split()


def _text(i: int, words: int = 80) -> str:
    return " ".join(WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(words))


def _make_user_files(user: Path) -> None:
    """The user's own files: inputs, outputs of earlier work, and things in the way."""
    user.mkdir()
    records = "".join(json.dumps({"text": _text(i)}) + "\n" for i in range(120))
    (user / "notes.jsonl").write_text(records)
    (user / "cut.jsonl").write_text(records + '{"text": "cut sho')
    with gzip.open(user / "chat.jsonl.gz", "wt") as f:
        f.write(records)
    (user / "chat.jsonl.zst").write_bytes(b"\x28\xb5\x2f\xfd" + b"\x00" * 32)
    (user / "poems.csv").write_text("title,text\n" + "".join(f"t{i},{_text(i, 10)}\n" for i in range(50)))
    (user / "fake.parquet").write_text("not parquet at all\n")
    (user / "blob.bin").write_bytes(bytes(range(256)) * 8)
    (user / "afile").write_text("a file, where a directory is expected\n")
    (user / "mixture_cut.json").write_text('{"weights": {"code": 0.5, ')
    (user / "occupied").mkdir()
    (user / "occupied" / "thesis.tex").write_text("keep me\n")
    hf_dir = user / "hf_model"  # an HF checkpoint of the user's (not one moejax can read: cut short)
    hf_dir.mkdir()
    (hf_dir / "config.json").write_text('{"model_type": "qwen3_moe", "hidden_si')
    (hf_dir / "model.safetensors").write_bytes(b"\x00" * 64)
    bad_weights = user / "hf_bad_weights"
    bad_weights.mkdir()
    (bad_weights / "config.json").write_text('{"model_type": "qwen3_moe"}')
    (bad_weights / "model.safetensors").write_bytes(b"garbage, not safetensors")
    (user / "tasks_cut.jsonl").write_text('{"id": "q1", "prompt": "2+2=", "choi')
    (user / "empty_dir").mkdir()


def _make_workdir(path: Path, user: Path) -> None:
    """A trained-looking workdir (a step-0 checkpoint of a tiny model on a tiny prepared dataset),
    made without a train step to compile, with an eval result made with other settings."""
    from moejax import code_version
    from moejax import config as config_lib
    from moejax.data.tokenizer import ByteTokenizer
    from moejax.train.checkpoint import Checkpointer
    from moejax.train.state import init_state

    dataset = path.parent / "dataset"
    prepare.prepare_dataset([f"notes={user / 'notes.jsonl'}"], dataset, heldout_fraction=0.3, workers=1,
                            progress=False, seq_len=32)
    cfg = config_lib.default_config()
    cfg.train.seq_len, cfg.train.global_batch_size, cfg.train.steps = 32, 8, 2
    m = cfg.model
    m.d_model, m.num_layers, m.mlp_dim, m.first_k_dense = 32, 1, 64, 0
    m.num_heads, m.num_kv_heads, m.head_dim = 2, 1, 16
    m.moe.num_experts, m.moe.expert_dim, m.moe.shared_expert_dim, m.moe.tile_size = 4, 16, 16, 8
    cfg.data.path, cfg.data.mixture = str(dataset), {"notes": 1.0}
    cfg, run = hf._one_device_run(cfg)
    meta = {"config": config_lib.to_dict(cfg), "tokenizer": ByteTokenizer().name, "code_version": code_version()}
    checkpointer = Checkpointer(str(path / "checkpoints"), max_to_keep=2)
    checkpointer.save(0, init_state(cfg, run), {}, meta)
    checkpointer.close()
    (path / "config.json").write_text(json.dumps(meta["config"]))
    (path / "eval").mkdir()
    (path / "eval" / "step_0.json").write_text(json.dumps({"settings": {"tasks": ["other"]}, "step": 0}))


@pytest.fixture(scope="module")
def drill(tmp_path_factory):
    root = tmp_path_factory.mktemp("drill")
    user = root / "user"
    _make_user_files(user)
    _make_workdir(user / "run", user)
    (root / "out").mkdir()
    return root


def _tree_hash(directory: Path) -> dict[str, str]:
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(directory.rglob("*"))}


def _exit_code(main, argv: list[str]) -> int:
    """What the shell would see: a returned code, or a SystemExit's (a message string exits 1)."""
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    if isinstance(code, str):
        return 1
    return code or 0


ENTRY = {
    "prepare": prepare.main,
    "train": lambda argv: train_cli.main(["moejax.main", *argv]),
    "eval": eval_cli.main,
    "generate": generate.main,
    "hf": hf.main,
    "l3_alloc": l3_alloc.main,
    "export": corpus_export.main,
}
TINY = "experiments/tiny_moe.py"

# (entry point, argv with {user}/{out}/{proc} placeholders, a phrase the error must contain)
MATRIX = [
    # prepare: inputs
    ("prepare", ["--source", "a={user}/missing.jsonl", "--out", "{out}/p1"], "does not exist"),
    ("prepare", ["--source", "a={user}/chat.jsonl.gz", "--out", "{out}/p2"], "gunzip"),
    ("prepare", ["--source", "a={user}/chat.jsonl.zst", "--out", "{out}/p3"], "zstd-compressed"),
    ("prepare", ["--source", "a={user}/*.gz", "--out", "{out}/p4"], "decompress it first"),
    ("prepare", ["--source", "a={user}/poems.csv", "--out", "{out}/p5"], "CSV table"),
    ("prepare", ["--source", "a={user}/fake.parquet", "--out", "{out}/p6"], "not a Parquet file"),
    ("prepare", ["--source", "a={user}/blob.bin", "--out", "{out}/p7"], "binary file"),
    ("prepare", ["--source", "a={user}/cut.jsonl", "--out", "{out}/p8", "--workers", "1"], "not valid JSON"),
    ("prepare", ["--source", "a={user}/*.nothing", "--out", "{out}/p9"], "matches no file"),
    ("prepare", ["--source", "a={user}/empty_dir", "--out", "{out}/p10"], "nothing to prepare"),
    ("prepare", ["--source", "{user}/notes.jsonl", "--out", "{out}/p11"], "DOMAIN=PATH"),
    # prepare: outputs
    ("prepare", ["--source", "a={user}/notes.jsonl", "--out", "{user}/afile"], "not a prepared dataset"),
    ("prepare", ["--source", "a={user}/notes.jsonl", "--out", "{user}/afile/sub"], "where a directory should be"),
    ("prepare", ["--source", "a={user}/notes.jsonl", "--out", "{proc}"], "cannot create the directory"),
    ("prepare", ["--source", "a={user}/notes.jsonl", "--out", "{user}/occupied"], "not a prepared dataset"),
    ("prepare", ["--source", "a={user}/notes.jsonl", "--out", "{out}/p12", "--seq-len", "0"], "--seq-len 0"),
    ("prepare", ["--out", "{user}/empty_dir", "--verify"], "not a prepared dataset"),
    # training
    ("train", ["--config", "{user}/missing.py", "--workdir", "{out}/t1"], "not found"),
    ("train", ["--config", "{user}/notes.jsonl", "--workdir", "{out}/t2"], "could not be loaded"),
    ("train", ["--config", TINY, "--workdir", "{user}/afile"], "is a file"),
    ("train", ["--config", TINY, "--workdir", "{user}/afile/run"], "where a directory should be"),
    ("train", ["--config", TINY, "--workdir", "{proc}"], "cannot create the directory"),
    ("train", ["--config", TINY, "--workdir", "{out}/t3", "--config.data.path={user}/missing"], "does not exist"),
    ("train", ["--config", TINY, "--workdir", "{out}/t4", "--config.data.path={user}/notes.jsonl"],
     "is a file, not a prepared dataset"),
    ("train", ["--config", TINY, "--workdir", "{out}/t5", "--config.data.path={user}/occupied"],
     "not a prepared dataset"),
    ("train", ["--config", TINY, "--workdir", "{out}/t6", "--config.data.mixture_file={user}/mixture_cut.json"],
     "not valid JSON"),
    ("train", ["--config", TINY, "--workdir", "{out}/t7", "--config.data.mixture_file={user}/missing.json"],
     "does not exist"),
    ("train", ["--config", TINY, "--workdir", "{out}/t8", "--config.data.schedule=[[0, {{\"code\": 1}}"],
     "not valid JSON"),
    ("train", ["--config", TINY, "--workdir", "{out}/t9", "--config.checkpoint.init_from={user}/missing"],
     "checkpoint.init_from"),
    ("train", ["--config", TINY, "--workdir", "{out}/t10", "--config.model.l3.after_layers=(1,)",
               "--config.model.l3.allocation={user}/missing.json"], "does not exist"),
    # eval
    ("eval", ["--workdir", "{user}/missing"], "does not exist"),
    ("eval", ["--workdir", "{user}/afile"], "does not exist"),
    ("eval", ["--workdir", "{user}/empty_dir"], "does not exist"),
    ("eval", ["--workdir", "{user}/run", "--step", "7"], "no checkpoint at step 7"),
    ("eval", ["--workdir", "{user}/run", "--tasks", "{user}/tasks_cut.jsonl"], "tasks_cut.jsonl"),
    ("eval", ["--workdir", "{user}/run", "--tasks", "{user}/missing.jsonl"], "missing.jsonl"),
    ("eval", ["--workdir", "{user}/run", "--tasks"], "refusing to overwrite"),  # step_0.json, other settings
    ("eval", ["--workdir", "{user}/run", "--max-items", "-1"], "must be positive"),
    # generate
    ("generate", ["--workdir", "{user}/missing", "--prompt", "hi"], "does not exist"),
    ("generate", ["--workdir", "{user}/afile", "--prompt", "hi"], "does not exist"),
    ("generate", ["--workdir", "{user}/run", "--prompt", "hi", "--step", "7"], "no checkpoint at step 7"),
    ("generate", ["--workdir", "{user}/run", "--prompt", "hi", "--max-new-tokens", "100000"], "--beyond-context"),
    ("generate", ["--workdir", "{user}/run", "--prompt", "hi", "--top-p", "2"], "--top-p"),
    # Hugging Face import / export
    ("hf", ["import", "--hf-dir", "{user}/missing", "--workdir", "{out}/h1"], "has no config.json"),
    ("hf", ["import", "--hf-dir", "{user}/hf_model", "--workdir", "{out}/h2"], "not readable JSON"),
    ("hf", ["import", "--hf-dir", "{user}/hf_bad_weights", "--workdir", "{out}/h3"], "cannot be read as safetensors"),
    ("hf", ["import", "--hf-dir", "{user}/hf_model", "--workdir", "{user}/occupied"], "refusing to overwrite"),
    ("hf", ["import", "--hf-dir", "{user}/hf_model", "--workdir", "{user}/afile"], "is a file"),
    ("hf", ["export", "--workdir", "{user}/missing", "--hf-dir", "{out}/h4"], "no config.json"),
    ("hf", ["export", "--workdir", "{user}/afile", "--hf-dir", "{out}/h5"], "no config.json"),
    ("hf", ["export", "--workdir", "{user}/run", "--hf-dir", "{user}/hf_model"], "refusing to overwrite"),
    ("hf", ["export", "--workdir", "{user}/run", "--hf-dir", "{user}/occupied"], "refusing to overwrite"),
    ("hf", ["export", "--workdir", "{user}/run", "--hf-dir", "{user}/afile"], "is a file"),
    ("hf", ["export", "--workdir", "{user}/run", "--hf-dir", "{proc}/hf"], "cannot create the directory"),
    ("hf", ["export", "--workdir", "{user}/run", "--hf-dir", "{out}/h6", "--step", "7"], "no checkpoint at step 7"),
    # L3 allocation and corpus export
    ("l3_alloc", ["--budget", "300", "--max-rows", "2", "--method", "uniform", "--out", "{user}/afile"],
     "already exists"),
    ("l3_alloc", ["--budget", "300", "--max-rows", "2", "--method", "uniform", "--out", "{user}/occupied"],
     "is a directory"),
    ("l3_alloc", ["--budget", "300", "--max-rows", "2", "--data-path", "{user}/notes.jsonl"],
     "not a prepared dataset"),
    ("l3_alloc", ["--budget", "300", "--max-rows", "2", "--method", "uniform", "--out", "{proc}/a.json"],
     "cannot create the directory"),
    ("export", ["--out", "{user}/occupied"], "refusing to overwrite"),
    ("export", ["--out", "{user}/afile"], "is a file"),
]


def _fill(argv: list[str], drill: Path) -> list[str]:
    return [a.format(user=drill / "user", out=drill / "out", proc=PROC) for a in argv]


@pytest.mark.parametrize("cli,argv,phrase", MATRIX, ids=[f"{m[0]}-{i}" for i, m in enumerate(MATRIX)])
def test_bad_input_exits_2_with_one_paragraph_and_leaves_user_files_alone(cli, argv, phrase, drill, capsys):
    before = _tree_hash(drill / "user")
    code = _exit_code(ENTRY[cli], _fill(argv, drill))
    err = capsys.readouterr().err
    assert code == 2, f"exit {code}; stderr:\n{err}"
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1, err
    assert phrase in errors[0], errors[0]
    assert _tree_hash(drill / "user") == before
    assert not (drill / "out" / "t3").exists()  # a refused training run leaves no directory behind


# Ctrl-C: one line saying what was saved and how to resume, exit status 130.
INTERRUPTS = [
    ("prepare", "moejax.data.prepare.prepare_dataset", ["--source", "a={user}/notes.jsonl", "--out", "{out}/i1"],
     "rerun the same command to resume"),
    ("eval", "moejax.eval.__main__._evaluate", ["--workdir", "{user}/run"], "rerun the command"),
    ("generate", "moejax.generate._generate", ["--workdir", "{user}/run", "--prompt", "hi", "--max-new-tokens", "4"],
     "rerun the command"),
    ("hf", "moejax.interop.hf.export_from_workdir", ["export", "--workdir", "{user}/run", "--hf-dir", "{out}/i2"],
     "nothing was written"),
    ("train", "moejax.train.loop.train", ["--config", TINY, "--workdir", "{out}/i3"], "rerun the same command"),
]


@pytest.mark.parametrize("cli,target,argv,phrase", INTERRUPTS, ids=[i[0] for i in INTERRUPTS])
def test_ctrl_c_prints_one_line_and_exits_130(cli, target, argv, phrase, drill, capsys, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(target, interrupted)
    code = _exit_code(ENTRY[cli], _fill(argv, drill))
    err = capsys.readouterr().err
    assert code == 130, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert phrase in err.lower()


def _launch(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "MOEJAX_PYTHON": sys.executable, "MOEJAX_ALLOCATOR": "system"}
    return subprocess.run([str(ROOT / "launch.sh"), *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


def test_launch_sh_resolves_relative_paths_where_the_user_is(drill):
    """launch.sh runs from the repository; relative paths still mean the user's directory."""
    here = drill / "elsewhere"
    here.mkdir()
    shutil.copy(drill / "user" / "notes.jsonl", here / "logs.jsonl")
    (here / "some_file").write_text("mine\n")
    done = _launch(["python", "-m", "moejax.data.prepare", "--source", "logs=logs.jsonl", "--out", "ds",
                    "--workers", "1", "--seq-len", "32", "--heldout-fraction", "0.3"], here)
    assert done.returncode == 0, done.stderr
    assert (here / "ds" / "dataset.json").is_file() and not (ROOT / "ds").exists()

    missing = _launch(["python", "-m", "moejax.data.prepare", "--source", "logs=nothere.jsonl", "--out", "ds2"], here)
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert str(here / "nothere.jsonl") in missing.stderr  # says where it looked

    wrong = _launch(["--workdir", "some_file", "--config.train.steps=2"], here)
    assert wrong.returncode == 2 and "Traceback" not in wrong.stderr
    assert f"--workdir {here / 'some_file'} is a file" in wrong.stderr
    assert (here / "some_file").read_text() == "mine\n"
