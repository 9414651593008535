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
from data_mixture import __main__ as dm_cli

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "experiments" / "studies" / "results"
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
    (user / "chat.jsonl.gz").write_bytes(gzip.compress(records.encode())[:200])  # cut short
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
    cfg, run = hf.workdir.one_device_run(cfg)
    meta = {"config": config_lib.to_dict(cfg), "tokenizer": ByteTokenizer().name, "code_version": code_version()}
    checkpointer = Checkpointer(str(path / "checkpoints"), max_to_keep=2)
    checkpointer.save(0, init_state(cfg, run), {}, meta)
    checkpointer.close()
    (path / "config.json").write_text(json.dumps(meta["config"]))
    (path / "eval").mkdir()
    (path / "eval" / "step_0.json").write_text(json.dumps({"settings": {"tasks": ["other"]}, "step": 0}))


def _make_mixture_files(user: Path) -> None:
    """The user's data-mixture files: a runs table and a fit (committed results, so nothing is
    fitted here), each also cut short, and a mixture file (JSON, but not a fit)."""
    runs = (RESULTS / "ladder_runs.csv").read_text()
    (user / "runs.csv").write_text(runs)
    lines = runs.splitlines(keepends=True)
    (user / "runs_cut.csv").write_text("".join(lines[:20]) + ",".join(lines[20].split(",")[:5]))  # cut mid-row
    fit = (RESULTS / "builtin_v1" / "fits" / "regmix_linear.params_total.json").read_text()
    (user / "fit.json").write_text(fit)
    (user / "fit_cut.json").write_text(fit[: len(fit) // 2])
    (user / "mixture.json").write_text(json.dumps({"weights": {"code": 0.5, "prose": 0.5}}))
    (user / "mergemix_out").mkdir()  # an earlier mergemix output: resumed, so never refused
    (user / "mergemix_out" / "cache.jsonl").write_text("")


@pytest.fixture(scope="module")
def drill(tmp_path_factory):
    root = tmp_path_factory.mktemp("drill")
    user = root / "user"
    _make_user_files(user)
    _make_mixture_files(user)
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
    "data_mixture": dm_cli.main,
}
TINY = "experiments/configs/tiny_moe.py"
FIT = ["fit", "--law", "regmix_linear", "--bootstrap", "0", "--no-progress"]
PREDICT = ["predict", "--fit", "{user}/fit.json", "--runs", "{user}/runs.csv"]
OPTIMIZE = ["optimize", "--fit", "{user}/fit.json", "--size", "3e6", "--tokens", "5e8", "--no-bootstrap"]
PLAN = ["plan", "--budget-flops", "3e15", "--target-size", "3e6", "--target-tokens", "5e8", "--no-progress"]
MERGEMIX = ["mergemix", "--base", "{user}/run", "--domains", "notes,other", "--expert-tokens", "1e4"]

# (entry point, argv with {user}/{out}/{proc} placeholders, a phrase the error must contain)
MATRIX = [
    # prepare: inputs
    ("prepare", ["--source", "a={user}/missing.jsonl", "--out", "{out}/p1"], "does not exist"),
    ("prepare", ["--source", "a={user}/chat.jsonl.gz", "--out", "{out}/p2"], "cut short or corrupt"),
    ("prepare", ["--source", "a={user}/chat.jsonl.zst", "--out", "{out}/p3"], "zstd-compressed"),
    ("prepare", ["--source", "a={user}/*.gz", "--out", "{out}/p4"], "gzip -t"),
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
    # data_mixture collect
    ("data_mixture", ["collect", "{user}/missing", "--out", "{out}/d1.csv"], "does not exist"),
    ("data_mixture", ["collect", "{user}/occupied", "--out", "{out}/d2.csv"], "not a moejax workdir"),
    ("data_mixture", ["collect", "{user}/run", "--out", "{user}/runs.csv"], "already exists"),
    ("data_mixture", ["collect", "{user}/run", "--out", "{user}/occupied"], "is a directory"),
    ("data_mixture", ["collect", "{user}/run", "--out", "{proc}/runs.csv"], "cannot create the directory"),
    # data_mixture fit: inputs (refused before any fitting)
    ("data_mixture", [*FIT, "--runs", "{user}/missing.csv", "--out", "{out}/d3.json"], "does not exist"),
    ("data_mixture", [*FIT, "--runs", "{user}/runs_cut.csv", "--out", "{out}/d4.json"], "do not have the header's"),
    ("data_mixture", [*FIT, "--runs", "{user}/fit.json", "--out", "{out}/d5.json"], "a JSON file"),
    ("data_mixture", [*FIT, "--runs", "{user}/chat.jsonl.gz", "--out", "{out}/d6.json"], "gzip-compressed"),
    ("data_mixture", [*FIT, "--runs", "{user}/blob.bin", "--out", "{out}/d7.json"], "a binary file"),
    ("data_mixture", [*FIT, "--runs", "{user}/empty_dir", "--out", "{out}/d8.json"], "is a directory"),
    ("data_mixture", [*FIT, "--runs", "{user}/poems.csv", "--out", "{out}/d9.json"], "params_total"),
    # data_mixture fit: outputs (checked before the table is read)
    ("data_mixture", [*FIT, "--runs", "{user}/runs.csv", "--out", "{proc}/fit.json"], "cannot create the directory"),
    ("data_mixture", [*FIT, "--runs", "{user}/runs.csv", "--out", "{user}/fit.json"], "already exists"),
    ("data_mixture", [*FIT, "--runs", "{user}/runs.csv", "--out", "{user}/afile/fit.json"],
     "where a directory should be"),
    ("data_mixture", [*FIT, "--runs", "{user}/runs.csv", "--out", "{user}/occupied"], "is a directory"),
    # data_mixture predict: the fit file
    ("data_mixture", ["predict", "--fit", "{user}/runs.csv", "--runs", "{user}/runs.csv", "--out", "{out}/d10.csv"],
     "is a CSV table, not JSON"),
    ("data_mixture", ["predict", "--fit", "{user}/fit_cut.json", "--runs", "{user}/runs.csv", "--out", "{out}/d11.csv"],
     "is cut short"),
    ("data_mixture", ["predict", "--fit", "{user}/mixture.json", "--runs", "{user}/runs.csv", "--out", "{out}/d12.csv"],
     "is not a fit file"),
    ("data_mixture", ["predict", "--fit", "{user}/blob.bin", "--runs", "{user}/runs.csv", "--out", "{out}/d13.csv"],
     "binary file"),
    ("data_mixture", ["predict", "--fit", "{user}/missing.json", "--runs", "{user}/runs.csv", "--out", "{out}/d14.csv"],
     "does not exist"),
    ("data_mixture", ["predict", "--fit", "{user}/empty_dir", "--runs", "{user}/runs.csv", "--out", "{out}/d15.csv"],
     "is a directory"),
    ("data_mixture", [*PREDICT[:3], "--runs", "{user}/runs_cut.csv", "--out", "{out}/d16.csv"],
     "do not have the header's"),
    ("data_mixture", [*PREDICT, "--out", "{user}/runs.csv"], "already exists"),
    # data_mixture evaluate: the output directory, checked before any law is fitted
    ("data_mixture", ["evaluate", "--runs", "{user}/runs.csv", "--out-dir", "{user}/occupied"], "refusing to overwrite"),
    ("data_mixture", ["evaluate", "--runs", "{user}/runs.csv", "--out-dir", "{user}/afile"], "is a file"),
    ("data_mixture", ["evaluate", "--runs", "{user}/runs.csv", "--out-dir", "{proc}"], "cannot create the directory"),
    ("data_mixture", ["evaluate", "--runs", "{user}/runs.csv", "{user}/fit.json", "--out-dir", "{out}/d17"],
     "a JSON file"),
    # data_mixture optimize: a dataset or --available that does not match the fit's domains
    ("data_mixture", [*OPTIMIZE, "--dataset", "{user}/dataset", "--out", "{out}/d18.json"],
     "but the fit trains on code, prose, math, knowledge"),
    ("data_mixture", [*OPTIMIZE, "--available", "cod=1e9", "--out", "{out}/d19.json"], "--available names domain(s) cod"),
    ("data_mixture", [*OPTIMIZE, "--dataset", "{user}/afile", "--out", "{out}/d20.json"], "no dataset.json"),
    ("data_mixture", [*OPTIMIZE[:1], "--fit", "{user}/fit_cut.json", *OPTIMIZE[3:], "--out", "{out}/d21.json"],
     "is cut short"),
    ("data_mixture", [*OPTIMIZE, "--out", "{user}/fit.json"], "already exists"),
    ("data_mixture", [*OPTIMIZE, "--out", "{proc}/mixture.json"], "cannot create the directory"),
    # data_mixture plan
    ("data_mixture", [*PLAN, "--prior", "{user}/fit_cut.json", "--out", "{out}/d22.json"], "--prior"),
    ("data_mixture", [*PLAN, "--prior", "{user}/runs.csv", "--out", "{out}/d23.json"], "is a CSV table"),
    ("data_mixture", [*PLAN, "--presets", "{user}/mixture_cut.json", "--out", "{out}/d24.json"], "not valid JSON"),
    ("data_mixture", [*PLAN, "--domains", "a,b", "--config", "{user}/missing.py", "--out", "{out}/d25.json"],
     "--config"),
    ("data_mixture", [*PLAN, "--out", "{user}/fit.json"], "already exists"),
    ("data_mixture", [*PLAN, "--out", "{user}/afile/plan.json"], "where a directory should be"),
    # data_mixture sweep (its --root resumes by design) and mergemix (its --out resumes)
    ("data_mixture", ["sweep", "--plan", "{user}/mixture_cut.json", "--root", "{out}/d26"], "mixture_cut.json"),
    ("data_mixture", ["sweep", "--plan", "{user}/missing.json", "--root", "{out}/d27"], "missing.json"),
    ("data_mixture", ["sweep", "--plan", "{user}/fit.json", "--root", "{user}/afile"], "is a file"),
    ("data_mixture", [*MERGEMIX, "--out", "{user}/occupied"], "not a mergemix output"),
    ("data_mixture", [*MERGEMIX, "--out", "{user}/afile"], "is a file"),
    ("data_mixture", [*MERGEMIX, "--out", "{proc}"], "cannot create the directory"),
    ("data_mixture", [*MERGEMIX[:1], "--base", "{user}/missing", *MERGEMIX[3:], "--out", "{user}/mergemix_out"],
     "missing"),
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
    ("hf", "moejax.interop.hf.workdir.export_from_workdir",
     ["export", "--workdir", "{user}/run", "--hf-dir", "{out}/i2"], "nothing was written"),
    ("train", "moejax.train.loop.train", ["--config", TINY, "--workdir", "{out}/i3"], "rerun the same command"),
    ("data_mixture", "data_mixture.fit.fit_table", [*FIT, "--runs", "{user}/runs.csv", "--out", "{out}/i4.json"],
     "nothing was written"),
    ("data_mixture", "data_mixture.evaluate.evaluate_laws",
     ["evaluate", "--runs", "{user}/runs.csv", "--out-dir", "{out}/i5"], "nothing was written"),
    ("data_mixture", "data_mixture.optimize.optimize_mixture", [*OPTIMIZE, "--out", "{out}/i6.json"],
     "nothing was written"),
    ("data_mixture", "data_mixture.plan.make_plan", [*PLAN, "--domains", "a,b", "--out", "{out}/i7.json"],
     "nothing was written"),
]


@pytest.mark.parametrize("cli,target,argv,phrase", INTERRUPTS,
                         ids=[i[0] if i[0] != "data_mixture" else f"data_mixture-{i[2][0]}" for i in INTERRUPTS])
def test_ctrl_c_prints_one_line_and_exits_130(cli, target, argv, phrase, drill, capsys, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(target, interrupted)
    code = _exit_code(ENTRY[cli], _fill(argv, drill))
    err = capsys.readouterr().err
    assert code == 130, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert phrase in err.lower()


def test_data_mixture_force_replaces_an_output_whole(drill, capsys):
    """--force replaces the user's file with the complete new one, and leaves no temporary file."""
    mine = drill / "out" / "mine"
    mine.mkdir()
    (mine / "pred.csv").write_text("an earlier prediction\n")
    argv = _fill([*PREDICT, "--out", str(mine / "pred.csv")], drill)
    assert _exit_code(ENTRY["data_mixture"], argv) == 2
    assert (mine / "pred.csv").read_text() == "an earlier prediction\n"
    assert _exit_code(ENTRY["data_mixture"], [*argv, "--force"]) == 0
    header = (mine / "pred.csv").read_text().splitlines()[0]
    assert header.startswith("run,") and "pred:code" in header
    assert sorted(p.name for p in mine.iterdir()) == ["pred.csv"]
    assert "wrote" in capsys.readouterr().out


def test_data_mixture_paths_mean_what_the_user_typed(drill, monkeypatch, capsys):
    """Relative paths resolve against the directory launch.sh was run from, ~ expands, and plan's
    default --config (a repository file) is still found."""
    import moejax
    from data_mixture.__main__ import build_parser

    here = drill / "out" / "elsewhere"
    here.mkdir()
    monkeypatch.setattr(moejax, "CALLER_CWD", str(here))
    (here / "fit.json").write_text((drill / "user" / "fit.json").read_text())
    (here / "q.csv").write_text((drill / "user" / "runs.csv").read_text())
    code = _exit_code(ENTRY["data_mixture"], ["predict", "--fit", "fit.json", "--runs", "q.csv", "--out", "p.csv"])
    assert code == 0, capsys.readouterr().err
    assert (here / "p.csv").is_file() and not (ROOT / "p.csv").exists()
    monkeypatch.setenv("HOME", str(here))
    args = build_parser().parse_args(["optimize", "--fit", "~/fit.json", "--size", "1e6", "--tokens", "1e8",
                                      "--dataset", "builtin", "--out", "m.json"])
    assert args.fit == str(here / "fit.json") and args.out == str(here / "m.json") and args.dataset == "builtin"
    args = build_parser().parse_args(["plan", "--budget-flops", "1e15", "--target-size", "1e6", "--target-tokens",
                                      "1e8", "--out", "plan.json"])
    assert args.config == TINY and (ROOT / args.config).is_file()


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
