"""Any Hugging Face tokenizer, end to end: prepare with it, import a model with it, train and
generate with it, export it so transformers reads it; every mistake stops early, by name.

The tokenizers are built here (BPE and Unigram/SentencePiece-style; Llama-style and Qwen-style
special tokens); nothing is downloaded.
"""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from tokenizers.implementations import SentencePieceUnigramTokenizer

from moejax.data import prepare
from moejax.errors import DataError
from moejax.data.tokenizer import load_tokenizer
from moejax.interop import hf as interop

TEXTS = [f"Document {i}: the quick brown fox jumps over the lazy dog {i % 7} times, said Ada." for i in range(300)]
SAMPLE = "Document 5: the quick brown fox, said Ada."
QWEN_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
                r"\s+(?!\S)|\s+")


def qwen_style(directory: Path) -> None:
    """Byte-level BPE with Qwen2's normalizer and split pattern (transformers' Qwen2Tokenizer sets
    them); <|endoftext|>, <|im_start|>, <|im_end|>; no BOS, EOS <|im_end|>, PAD <|endoftext|>."""
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(TEXTS, trainers.BpeTrainer(
        vocab_size=320, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "tokenizer_class": "Qwen2Tokenizer"}))


def llama_style(directory: Path) -> None:
    """SentencePiece-style BPE (▁ for spaces, byte fallback); <unk>, <s>, </s>; no PAD (EOS is used)."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.train_from_iterator(TEXTS, trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"],
                                                       show_progress=False))
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": {"content": "<s>", "__type": "AddedToken"}, "eos_token": "</s>", "pad_token": None,
         "unk_token": "<unk>", "add_bos_token": True, "tokenizer_class": "LlamaTokenizer"}))


def unigram_style(directory: Path) -> None:
    """SentencePiece Unigram; special tokens named only by special_tokens_map.json."""
    tok = SentencePieceUnigramTokenizer()
    tok.train_from_iterator(TEXTS, vocab_size=120, special_tokens=["<pad>", "</s>", "<unk>"], unk_token="<unk>",
                            show_progress=False)
    tok.save(str(directory / "tokenizer.json"))
    (directory / "special_tokens_map.json").write_text(json.dumps({"eos_token": "</s>", "pad_token": "<pad>"}))


STYLES = {"qwen": qwen_style, "llama": llama_style, "unigram": unigram_style}
EXPECTED_SPECIALS = {
    "qwen": {"bos": None, "eos": "<|im_end|>", "pad": "<|endoftext|>"},
    "llama": {"bos": "<s>", "eos": "</s>", "pad": "</s>"},
    "unigram": {"bos": None, "eos": "</s>", "pad": "<pad>"},
}


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """Tokenizer directories (one per style) and a JSONL source."""
    root = tmp_path_factory.mktemp("hf_tok")
    for name, build in STYLES.items():
        (root / name).mkdir()
        build(root / name)
    with open(root / "docs.jsonl", "w") as f:
        for i in range(400):
            f.write(json.dumps({"text": f"Document {i}: the quick brown fox jumps over the lazy dog {i % 7} times, "
                                        "said Ada. " * 3}) + "\n")
    return root


def run_prepare(root: Path, out: Path, *extra: str) -> str:
    """``python -m moejax.data.prepare`` in-process; returns what it printed (stdout)."""
    import contextlib
    import io
    import warnings

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer), warnings.catch_warnings():
        warnings.simplefilter("ignore", prepare.HeldoutWarning)  # a small source: a small held-out split
        code = prepare.main(["--source", f"web={root / 'docs.jsonl'}", "--out", str(out), "--seq-len", "32",
                             "--heldout-fraction", "0.1", "--workers", "1", *extra])
    assert code == 0
    return buffer.getvalue()


@pytest.mark.parametrize("style", STYLES)
def test_prepare_with_a_hf_tokenizer_records_prints_and_decodes_it(root, tmp_path, style):
    tok = load_tokenizer(root / style)  # the model directory: special tokens from its files
    assert tok.name.startswith(f"hf-{tok.vocab_size}-") and tok.special_tokens == EXPECTED_SPECIALS[style]
    assert tok.decode(tok.encode(SAMPLE)) == SAMPLE
    printed = run_prepare(root, tmp_path / "ds", "--tokenizer", str(root / style))
    assert f"tokenizer {tok.name} (from {root / style}; " in printed
    dataset = json.loads((tmp_path / "ds" / "dataset.json").read_text())
    assert dataset["tokenizer"] == tok.name and dataset["tokenizer_options"]["special_tokens"] == tok.special_tokens
    from moejax.data.dataset import open_dataset

    data = open_dataset(tmp_path / "ds")
    assert data.tokenizer.name == tok.name
    stream = data.streams("web", "train")[0]
    starts = list(stream.doc_starts) + [stream.num_tokens]
    first = stream.tokens[starts[0]:starts[1]]
    assert first[-1] == tok.eos_id and tok.eos_id not in first[:-1]  # documents end with the tokenizer's EOS
    assert data.tokenizer.decode(first).startswith("Document ")
    # The same tokenizer from another path (a copy, or the dataset itself) has the same id.
    assert load_tokenizer(tmp_path / "ds").name == tok.name


def test_special_token_overrides_and_bad_tokenizers_stop_before_any_work(root, tmp_path):
    tok = load_tokenizer(root / "llama", {"eos": "<s>", "pad": "<unk>"})
    assert (tok.eos_id, tok.pad_id, tok.bos_id) == (1, 0, 1)
    assert tok.name == load_tokenizer(root / "llama").name  # the id is the vocabulary's, not the specials'
    out = tmp_path / "never"
    source = [f"web={root / 'docs.jsonl'}"]
    with pytest.raises(DataError, match=r"llama/tokenizer.json: the eos token '<\|nope\|>' is not in the tokenizer's "
                                         r"vocabulary\. Allowed: one of its tokens, e\.g\. its special tokens \['<unk>', "
                                         r"'<s>', '</s>'\]\. Pass --eos-token TOKEN"):
        prepare.prepare_dataset(source, out, tokenizer=root / "llama", special_tokens={"eos": "<|nope|>"})
    (tmp_path / "broken.json").write_text('{"model": 1')
    with pytest.raises(DataError, match=r"broken\.json is not a tokenizer file the tokenizers library can read"):
        prepare.prepare_dataset(source, out, tokenizer=tmp_path / "broken.json")
    shutil.copy(root / "llama" / "tokenizer.json", tmp_path / "bare.json")
    # No file names an EOS: the one obvious end-of-text token among its specials is taken ...
    assert load_tokenizer(tmp_path / "bare.json").eos_token == "</s>"  # specials <unk>, <s>, </s>
    (tmp_path / "only").mkdir()
    only = Tokenizer(models.BPE())
    only.add_special_tokens(["<|sep|>"])
    only.save(str(tmp_path / "only" / "tokenizer.json"))
    assert load_tokenizer(tmp_path / "only").eos_token == "<|sep|>"  # its only special token
    # ... and with two candidates (or none) the user says which.
    two = Tokenizer(models.BPE())
    two.add_special_tokens(["<|sep|>", "<|cls|>"])
    two.save(str(tmp_path / "two.json"))
    with pytest.raises(DataError, match=r"two\.json: no EOS token is named .* Pass --eos-token TOKEN, e\.g\. one "
                                         r"of its special tokens \['<\|sep\|>', '<\|cls\|>'\]"):
        prepare.prepare_dataset(source, out, tokenizer=tmp_path / "two.json")
    with pytest.raises(DataError, match=r"--tokenizer '.*nothere': no such file or directory\. Allowed: byte \| bpe"):
        prepare.prepare_dataset(source, out, tokenizer=tmp_path / "nothere")
    with pytest.raises(DataError, match=r"--eos-token apply to a Hugging Face tokenizer"):
        prepare.prepare_dataset(source, out, tokenizer="byte", special_tokens={"eos": "x"})
    assert not out.exists()
    # A dataset holds one tokenizer: other special tokens are another token stream.
    run_prepare(root, tmp_path / "ds", "--tokenizer", str(tmp_path / "bare.json"), "--eos-token", "</s>")
    with pytest.raises(DataError, match=r"asks for \"hf-300-\w+ with special tokens \{'bos': None, 'eos': '<s>'"):
        prepare.prepare_dataset(source, tmp_path / "ds", tokenizer=tmp_path / "bare.json", special_tokens={"eos": "<s>"},
                                seq_len=32, heldout_fraction=0.1)


# --- a model with a tokenizer: import, prepare, train, generate, export --------------------------


def tiny_model_cfg(vocab_size: int):
    from moejax.config import default_config

    m = default_config().model
    m.d_model, m.num_layers, m.mlp_dim, m.vocab_size, m.first_k_dense = 32, 1, 64, vocab_size, 0
    m.num_heads, m.num_kv_heads, m.head_dim = 4, 2, 8
    m.moe.num_experts, m.moe.expert_dim, m.moe.shared_expert_dim, m.moe.tile_size = 4, 16, 16, 8
    return m


def write_hf_model(directory: Path, vocab_size: int, tokenizer_dir: Path | None) -> None:
    """A Qwen2-MoE checkpoint with random weights (no torch needed), and the tokenizer's files."""
    import jax

    m = tiny_model_cfg(vocab_size)
    rng = np.random.default_rng(0)
    draw = lambda path, s: (float(path[-1].key == "scale") + rng.normal(0, 0.1, s.shape)).astype(s.dtype)  # noqa: E731
    params = jax.tree_util.tree_map_with_path(draw, interop.abstract_params(m))
    arch = interop.choose_architecture(m)
    tensors = interop.params_to_hf(interop.adapt_params(params, m, arch), interop.adapted_config(m, arch), arch)
    interop.write_hf_dir(str(directory), interop.hf_config_from_model(m, arch), tensors)
    for file in (tokenizer_dir.iterdir() if tokenizer_dir else ()):
        shutil.copy(file, directory / file.name)


@pytest.fixture(scope="module")
def imported(root, tmp_path_factory):
    """A Qwen-style checkpoint imported through the CLI: (workdir, what the import printed)."""
    import contextlib
    import io

    base = tmp_path_factory.mktemp("import")
    write_hf_model(base / "hf", 384, root / "qwen")
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        interop.main(["import", "--hf-dir", str(base / "hf"), "--workdir", str(base / "workdir")])
    return base / "workdir", buffer.getvalue()


def test_import_copies_the_tokenizer_and_prints_the_prepare_command(root, imported):
    from moejax.eval.restore import latest_meta

    workdir, printed = imported
    qwen = load_tokenizer(root / "qwen")
    assert (workdir / "tokenizer" / "tokenizer.json").read_bytes() == (root / "qwen" / "tokenizer.json").read_bytes()
    assert (workdir / "tokenizer" / "tokenizer_config.json").is_file()
    assert latest_meta(str(workdir))["tokenizer"] == qwen.name
    from moejax.commands import LAUNCH_SCRIPT

    # runnable as printed from any directory: the absolute launch.sh, the absolute tokenizer path
    command = (f"{LAUNCH_SCRIPT} python -m moejax.data.prepare --tokenizer {workdir / 'tokenizer'} --source DOMAIN=PATH "
               "--out datasets/NAME")
    assert command in printed
    assert f"train from it with: {LAUNCH_SCRIPT} {workdir / 'experiment.py'} --workdir runs/NAME" in printed


def test_import_refuses_a_tokenizer_larger_than_the_embedding(root, tmp_path):
    write_hf_model(tmp_path / "hf", 256, root / "qwen")  # about 300 tokens, 256 embedding rows
    vocab = load_tokenizer(root / "qwen").vocab_size
    with pytest.raises(interop.InteropError, match=rf"hf/tokenizer\.json has a vocabulary of {vocab} tokens, but the model's "
                                                   r"embedding \(.*config\.json: vocab_size 256\) has only 256 rows; "
                                                   r"allowed: a tokenizer of at most 256 tokens"):
        interop.import_to_workdir(str(tmp_path / "hf"), str(tmp_path / "workdir"))
    assert not (tmp_path / "workdir").exists()


def training_cfg(workdir: Path, data_path: Path):
    """The imported experiment (experiment.py: its config.json, init_from the workdir), shortened."""
    from moejax.config import from_dict

    cfg = from_dict(json.loads((workdir / "config.json").read_text()))
    cfg.checkpoint.init_from = str(workdir)
    t = cfg.train
    t.steps, t.global_batch_size, t.seq_len, t.eval_every, t.eval_batches, t.log_every = 2, 8, 32, 2, 1, 1
    cfg.optim.warmup_steps, cfg.checkpoint.every_steps = 1, 2
    cfg.mesh.data, cfg.mesh.fsdp = 8, 1
    cfg.data.mixture = {"web": 1.0}
    cfg.data.path = str(data_path)
    return cfg


@pytest.fixture(scope="module")
def datasets(root, imported, tmp_path_factory):
    """(data prepared with the printed command, data prepared with another tokenizer)."""
    workdir, _ = imported
    base = tmp_path_factory.mktemp("datasets")
    run_prepare(root, base / "right", "--tokenizer", str(workdir / "tokenizer"))  # the printed command
    run_prepare(root, base / "wrong", "--tokenizer", str(root / "llama"))
    return base / "right", base / "wrong"


def test_training_from_the_import_is_refused_on_data_of_another_tokenizer(root, imported, datasets, tmp_path):
    from moejax.checks import check_config
    from moejax.train.loop import train
    from moejax.train.startup import check_init_from_tokenizer

    workdir, _ = imported
    qwen, (right, wrong) = load_tokenizer(root / "qwen"), datasets
    with pytest.raises(DataError, match=r"tokenizer mismatch: data\.path='.*wrong' is tokenized with 'hf-300-\w+', but "
                                         rf"checkpoint\.init_from .*/0 was trained with '{qwen.name}'\. Prepare the data "
                                         rf"with that tokenizer \(python -m moejax\.data\.prepare --tokenizer "
                                         rf"{workdir / 'tokenizer'} "):
        train(training_cfg(workdir, wrong), str(tmp_path / "refused"))  # before anything compiles
    assert not (tmp_path / "refused").exists()
    cfg = training_cfg(workdir, right)  # accepted: the config checks and the warm start's tokenizer check pass
    _, info = check_config(cfg)
    assert info.tokenizer.name == qwen.name
    check_init_from_tokenizer(cfg, info.tokenizer.name)
    # An embedding smaller than the data's vocabulary: the error names the tokenizer file and the fix.
    cfg.model.vocab_size = 256
    with pytest.raises(DataError, match=r"'model\.vocab_size' has value 256; allowed: at least the vocabulary of the "
                                         rf"tokenizer of prepared dataset .*right \({qwen.name}, .*right/tokenizer\.json: "
                                         rf"{qwen.vocab_size} tokens\)\. checkpoint\.init_from's embedding has 256 rows: prepare the data "
                                         r"with the tokenizer that checkpoint was trained with"):
        check_config(cfg)


def as_trained_run(imported_workdir: Path, data_path: Path, run: Path) -> None:
    """The imported checkpoint as a run on ``data_path`` records it (what ``train`` writes in
    checkpoints' meta and config.json), without compiling a train step."""
    shutil.copytree(imported_workdir, run, ignore=shutil.ignore_patterns("tokenizer"))
    meta_file = run / "checkpoints" / "0" / "meta" / "metadata"
    meta = json.loads(meta_file.read_text())
    meta["config"]["data"]["path"], meta["config"]["data"]["mixture"] = str(data_path), {"web": 1.0}
    meta_file.write_text(json.dumps(meta))
    (run / "config.json").write_text(json.dumps(meta["config"]))


def test_eval_and_export_use_the_runs_tokenizer_and_transformers_reads_it(root, imported, datasets, tmp_path):
    from moejax.eval.restore import open_run

    workdir, _ = imported
    qwen, (right, wrong) = load_tokenizer(root / "qwen"), datasets
    as_trained_run(workdir, right, tmp_path / "run")
    erun = open_run(str(tmp_path / "run"))  # what moejax.eval and moejax.generate decode with
    assert erun.tokenizer.name == qwen.name and erun.tokenizer.eos_id == qwen.eos_id
    as_trained_run(workdir, wrong, tmp_path / "wrong_run")
    with pytest.raises(DataError, match=r"tokenizer mismatch: data\.path='.*wrong' is tokenized with 'hf-300-"):
        open_run(str(tmp_path / "wrong_run"))

    interop.main(["export", "--workdir", str(tmp_path / "run"), "--hf-dir", str(tmp_path / "from_data")])
    interop.main(["export", "--workdir", str(workdir), "--hf-dir", str(tmp_path / "from_import")])
    assert (tmp_path / "from_import" / "tokenizer_config.json").read_bytes() == (
        root / "qwen" / "tokenizer_config.json").read_bytes()  # an import's own files, as they were
    transformers = pytest.importorskip("transformers")
    generated = np.random.default_rng(0).integers(3, qwen.vocab_size, 24)
    for out in ("from_data", "from_import"):
        assert load_tokenizer(tmp_path / out).name == qwen.name
        auto = transformers.AutoTokenizer.from_pretrained(str(tmp_path / out))
        assert auto(SAMPLE, add_special_tokens=False)["input_ids"] == erun.tokenizer.encode(SAMPLE).tolist()
        assert auto.decode(generated.tolist(), skip_special_tokens=True) == erun.tokenizer.decode(generated)
        assert auto.eos_token == "<|im_end|>" and auto.pad_token == "<|endoftext|>"
        hf_config = json.loads((tmp_path / out / "config.json").read_text())
        assert (hf_config["eos_token_id"], hf_config["pad_token_id"]) == (qwen.eos_id, qwen.pad_id)


@pytest.mark.slow
def test_train_generate_and_export_on_a_hf_tokenizer(root, imported, datasets, tmp_path, capsys):
    """The whole path with real training: import, prepare, train two steps, generate, export."""
    from moejax.generate import main as generate_main
    from moejax.train.loop import train

    workdir, _ = imported
    qwen, (right, _) = load_tokenizer(root / "qwen"), datasets
    train(training_cfg(workdir, right), str(tmp_path / "run"))
    capsys.readouterr()
    generate_main(["--workdir", str(tmp_path / "run"), "--prompt", "Document 3: the", "--max-new-tokens", "6"])
    out = capsys.readouterr().out
    assert "--- step 2" in out and "\nDocument 3: the" in out
    interop.main(["export", "--workdir", str(tmp_path / "run"), "--hf-dir", str(tmp_path / "hf_out")])
    assert load_tokenizer(tmp_path / "hf_out").name == qwen.name
    transformers = pytest.importorskip("transformers")
    auto = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf_out"))
    continuation = out.split("Document 3: the", 1)[1].rstrip("\n")
    prompt_ids = qwen.encode("Document 3: the").tolist()
    assert auto.decode(auto("Document 3: the" + continuation, add_special_tokens=False)["input_ids"]) == (
        "Document 3: the" + continuation)
    assert auto("Document 3: the", add_special_tokens=False)["input_ids"] == prompt_ids


@pytest.mark.filterwarnings("ignore::moejax.data.dataset.HeldoutWarning")
def test_byte_and_bpe_runs_export_tokenizers_that_transformers_reads(root, tmp_path):
    """Runs on moejax's own tokenizers export them too; an exported byte tokenizer imports as ``byte``."""
    from moejax.config import default_config
    from moejax.data.bpe import BPETokenizer
    from moejax.data.hf_tokenizer import load_hf_tokenizer
    from moejax.data.tokenizer import ByteTokenizer
    from moejax.interop.hf import tokenizer_files

    transformers = pytest.importorskip("transformers")
    cfg = default_config()
    text = "héllo wörld ✓\n\tDocument 7: the quick brown fox, said Ada. ü"
    assert tokenizer_files.export_tokenizer(str(tmp_path), cfg, "byte", str(tmp_path / "byte")) == "the byte tokenizer"
    auto = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "byte"))
    byte = ByteTokenizer()
    assert auto(text, add_special_tokens=False)["input_ids"] == byte.encode(text).tolist()
    ids = [104, 195, 105, 257, 256, 240, 159, 33]  # specials skipped; broken UTF-8 becomes U+FFFD either way
    assert auto.decode(ids, skip_special_tokens=True) == byte.decode(ids) == "h\ufffdi\ufffd!"
    assert isinstance(load_tokenizer(tmp_path / "byte"), ByteTokenizer)
    assert tokenizer_files.tokenizer_id(load_hf_tokenizer(tmp_path / "byte"), str(tmp_path / "byte")) == "byte"

    prepare.prepare_dataset([f"web={root / 'docs.jsonl'}"], tmp_path / "bpe_ds", tokenizer="bpe", vocab_size=300,
                            seq_len=32, heldout_fraction=0.1, progress=False)
    bpe = load_tokenizer(tmp_path / "bpe_ds")
    assert isinstance(bpe, BPETokenizer)
    cfg.data.path = str(tmp_path / "bpe_ds")
    assert tokenizer_files.export_tokenizer(str(tmp_path), cfg, bpe.name, str(tmp_path / "bpe")) == cfg.data.path
    auto = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "bpe"))
    assert auto(text, add_special_tokens=False)["input_ids"] == bpe.encode(text).tolist()
    assert auto.eos_token == "<|eos|>" and load_tokenizer(tmp_path / "bpe").name.startswith("hf-")
