"""Sparse upcycling: a dense model (HF Llama/Qwen2 or a moejax workdir) becomes an MoE whose start
computes the dense model (copy, fine-grained slices, a shared expert), or whose experts differ by
re-initialised units (drop); the result trains, resumes and exports to a transformers MoE.

Tiny random float32 models built with transformers (nothing downloaded), module-scoped.
"""

import json
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402

from moejax.config import from_dict  # noqa: E402
from moejax.interop import hf as interop  # noqa: E402
from moejax.model.transformer import Transformer  # noqa: E402
from moejax.schema import ModelConfig  # noqa: E402
from moejax.train.checkpoint import load_params  # noqa: E402
from moejax.upcycle import Plan, RECORD_FILE, function_preserving, upcycle, upcycle_layer  # noqa: E402
from moejax.upcycle.cli import main as upcycle_main  # noqa: E402

COMMON = dict(vocab_size=272, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              intermediate_size=96, initializer_range=0.1)
IDS = np.random.default_rng(1).integers(0, COMMON["vocab_size"], (2, 16))


def save_hf(config, path):
    """A random transformers model, norm scales and biases randomised too, saved to ``path``."""
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        for key, tensor in model.named_parameters():
            if key.endswith(("bias", "norm.weight", "layernorm.weight")):
                tensor.normal_(1.0 if key.endswith("weight") else 0.0, 0.3)
    model.save_pretrained(path)
    return path, hf_logits(model)


def hf_logits(model):
    with torch.no_grad():
        return model(torch.from_numpy(IDS)).logits.numpy()


def workdir_logits(workdir, step=None):
    with open(os.path.join(workdir, "config.json")) as f:
        m = from_dict(json.load(f)).model
    params, _ = load_params(workdir, interop.abstract_params(m), step)
    graphdef, _ = nnx.split(nnx.eval_shape(lambda: Transformer(ModelConfig.from_config(m), rngs=nnx.Rngs(0))))
    positions = jnp.broadcast_to(jnp.arange(IDS.shape[1]), IDS.shape)
    model = nnx.merge(graphdef, params)
    return np.asarray(model(jnp.asarray(IDS), positions, jnp.ones(IDS.shape, jnp.int32))[0])


def max_diff(a, b):
    return float(np.max(np.abs(a - b)))


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("upcycle")


@pytest.fixture(scope="module")
def llama(root):
    """(HF Llama directory, transformers' logits)."""
    return save_hf(transformers.LlamaConfig(**COMMON), str(root / "llama"))


@pytest.fixture(scope="module")
def dense(root, llama):
    """(the Llama imported into a moejax workdir, every layer dense; its logits)."""
    workdir = str(root / "dense")
    interop.import_to_workdir(llama[0], workdir)
    return workdir, workdir_logits(workdir)


def test_the_imported_dense_model_is_the_hf_one(dense, llama, root):
    assert max_diff(dense[1], llama[1]) < 1e-4
    with pytest.raises(interop.InteropError, match="every layer is dense .* `moejax upcycle` makes an MoE"):
        interop.export_from_workdir(dense[0], str(root / "dense_hf"))


@pytest.mark.parametrize("plan", [
    Plan(experts=4, top_k=2),  # every expert the dense MLP
    Plan(experts=4, top_k=1, shared_expert=True),  # halves: shared + routed = dense
    Plan(experts=8, top_k=4, expert_width=24),  # 4 slices of 24 units, 2 replicas each
], ids=["copy", "shared", "fine_grained"])
def test_copy_upcycling_starts_at_the_dense_logits(plan, root, dense):
    out = str(root / f"copy_{plan.experts}_{plan.top_k}_{plan.expert_width}_{plan.shared_expert}")
    record = upcycle(dense[0], out, plan)
    assert record["function_preserving"] and json.load(open(os.path.join(out, RECORD_FILE))) == record
    assert max_diff(workdir_logits(out), dense[1]) <= 1e-5


def test_fine_grained_start_is_the_dense_mlp_only_when_the_slices_divide_top_k():
    """The router is zero (ties pick experts 0..k-1); with k=3 of 2 slices slice 0 counts twice."""
    assert function_preserving(Plan(experts=4, top_k=2, expert_width=48), 96)
    assert not function_preserving(Plan(experts=4, top_k=3, expert_width=48), 96)
    assert not function_preserving(Plan(experts=4, top_k=2, method="drop"), 96)
    layer = upcycle_layer(*dense_mlp(), Plan(experts=4, top_k=2, expert_width=48), np.random.default_rng(0), 0.1)
    assert not np.any(layer["router/w_de"])
    np.testing.assert_array_equal(layer["w_gate_edf"][3], dense_mlp()[0][:, 48:])  # expert 3: slice 1
    np.testing.assert_array_equal(layer["w_down_efd"][2], 2 * dense_mlp()[2][:48])  # x S = 2


def dense_mlp(d=64, width=96):
    rng = np.random.default_rng(7)
    return (rng.normal(0.01, 0.1, (d, width)).astype(np.float32), rng.normal(-0.02, 0.2, (d, width)).astype(np.float32),
            rng.normal(0.0, 0.05, (width, d)).astype(np.float32))


def test_drop_reinitialises_a_share_of_each_experts_units_from_the_dense_statistics():
    gate, up, down = dense_mlp()
    plan = Plan(experts=4, top_k=2, method="drop", drop_ratio=0.5, seed=3)
    layer = upcycle_layer(gate, up, down, plan, np.random.default_rng(plan.seed), 0.1)
    dropped_sets = []
    for j in range(plan.experts):
        changed_gate = np.any(layer["w_gate_edf"][j] != gate, axis=0)
        changed_up = np.any(layer["w_up_edf"][j] != up, axis=0)
        changed_down = np.any(layer["w_down_efd"][j] != down, axis=1)
        assert changed_gate.sum() == 48 and np.array_equal(changed_gate, changed_up)
        assert np.array_equal(changed_gate, changed_down)
        dropped_sets.append(frozenset(np.flatnonzero(changed_gate)))
        for new, old in ((layer["w_gate_edf"][j], gate), (layer["w_up_edf"][j], up)):
            redrawn, replaced = new[:, changed_gate], old[:, changed_gate]
            assert abs(redrawn.mean() - replaced.mean()) < 0.02
            assert abs(redrawn.std() / replaced.std() - 1) < 0.1
    assert len(set(dropped_sets)) == plan.experts  # different units per expert
    again = upcycle_layer(gate, up, down, plan, np.random.default_rng(plan.seed), 0.1)
    assert all(np.array_equal(again[k], layer[k]) for k in layer)  # same seed, same experts
    assert np.any(layer["router/w_de"])


def test_upcycled_llama_exports_as_a_mixtral_that_computes_the_llama(root, dense, llama):
    """HF Llama -> moejax -> copy-upcycled (4 experts, top 2) -> HF Mixtral: transformers' logits match."""
    out = str(root / "mixtral_source")
    upcycle(dense[0], out, Plan(experts=4, top_k=2, seed=1))
    hf_dir = str(root / "mixtral")
    assert interop.export_from_workdir(out, hf_dir) == "mixtral"
    mixtral = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    assert max_diff(hf_logits(mixtral), llama[1]) < 1e-4


def test_hf_qwen2_upcycles_trains_resumes_and_exports_to_qwen2_moe(tmp_path, corpus_cache, capsys):
    """Straight from an HF Qwen2 directory, with a shared expert and drop: a run from its
    experiment.py trains and resumes, and its checkpoint exports to a Qwen2-MoE that transformers
    loads and agrees with."""
    import shutil

    from moejax.config import load
    from moejax.train.loop import train

    hf_dir, reference = save_hf(transformers.Qwen2Config(**COMMON), str(tmp_path / "qwen2"))
    out = str(tmp_path / "moe")
    assert upcycle_main(["--from", hf_dir, "--workdir", out, "--experts", "4", "--top-k", "2", "--shared-expert",
                         "--method", "drop", "--drop-ratio", "0.25", "--seed", "5"]) == 0
    assert "drop re-initialises units" in capsys.readouterr().out
    assert max_diff(workdir_logits(out), reference) > 1e-3  # drop moved it off the dense start
    cfg, _ = load(os.path.join(out, "experiment.py"))  # checkpoint.init_from = out
    cfg.train.steps, cfg.train.global_batch_size, cfg.train.seq_len = 2, 8, 32
    cfg.train.log_every, cfg.train.eval_every, cfg.train.eval_batches = 1, 2, 1
    cfg.optim.warmup_steps, cfg.data.cache_dir, cfg.checkpoint.every_steps = 1, corpus_cache, 1
    run = str(tmp_path / "run")
    train(cfg, run)
    shutil.rmtree(os.path.join(run, "checkpoints", "2"))
    assert train(cfg, run)["start_step"] == 1  # resumes
    with open(os.path.join(run, "metrics.jsonl")) as f:
        assert any("max_vio" in json.loads(line) for line in f)  # routing health is logged
    assert interop.export_from_workdir(run, str(tmp_path / "hf_moe")) == "qwen2_moe"
    exported = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf_moe"), dtype=torch.float32)
    assert max_diff(hf_logits(exported.eval()), workdir_logits(run)) < 1e-4


@pytest.fixture(scope="module")
def mixtral_config_dir(root):
    path = root / "mixtral_config"
    path.mkdir()
    (path / "config.json").write_text(json.dumps(transformers.MixtralConfig(**COMMON, num_local_experts=4).to_dict()))
    return str(path)


@pytest.mark.parametrize("args, message", [
    (["--experts", "4", "--top-k", "2"], "is already an MoE: layers [0, 1] of 2"),
    (["--experts", "4", "--top-k", "2", "--expert-width", "40"], "--expert-width 40 does not split the dense MLP's width 96"),
    (["--experts", "6", "--top-k", "2", "--expert-width", "24"], "--experts 6 does not hold a whole number of copies of the 4 slices"),
    (["--experts", "4", "--top-k", "5"], "--top-k 5: allowed 1..--experts (4)"),
    (["--experts", "1", "--top-k", "1"], "--experts 1: an MoE needs at least 2"),
    (["--experts", "4", "--top-k", "2", "--drop-ratio", "0.3"], "--drop-ratio 0.3 is given with --method copy"),
    (["--experts", "4", "--top-k", "2", "--method", "drop", "--drop-ratio", "1.5"], "--drop-ratio 1.5: allowed 0..1"),
], ids=["moe_source", "width", "slices", "top_k", "one_expert", "ratio_with_copy", "ratio_range"])
def test_bad_input_is_one_clear_error_and_writes_nothing(args, message, dense, mixtral_config_dir, tmp_path, capsys):
    source = mixtral_config_dir if message.startswith("is already") else dense[0]
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_info:
        upcycle_main(["--from", source, "--workdir", str(out), *args])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_an_existing_output_is_refused_and_kept(dense, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("keep me")
    with pytest.raises(SystemExit):
        upcycle_main(["--from", dense[0], "--workdir", str(out), "--experts", "4", "--top-k", "2"])
    assert "already holds files; refusing to overwrite it" in capsys.readouterr().err
    assert os.listdir(out) == ["mine.txt"] and (out / "mine.txt").read_text() == "keep me"
    with pytest.raises(SystemExit):
        upcycle_main(["--from", str(tmp_path), "--workdir", str(tmp_path / "new"), "--experts", "4", "--top-k", "2"])
    assert "has no config.json" in capsys.readouterr().err
