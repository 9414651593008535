"""Hugging Face interop: imported checkpoints compute transformers' logits; exports load back in it.

Tiny random float32 models of every supported architecture, built with transformers itself, with
non-trivial biases, norm scales and selection biases (their defaults, zeros and ones, would hide
mapping mistakes) and weights large enough that routing decisions are sharp.
"""

import functools
import json
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402

from moejax.config import default_config, from_dict  # noqa: E402
from moejax.interop import hf as interop  # noqa: E402
from moejax.model.balancing import balancer_from_config  # noqa: E402
from moejax.model.transformer import Transformer  # noqa: E402
from moejax.schema import ModelConfig  # noqa: E402
from moejax.train.checkpoint import load_params  # noqa: E402

TOLERANCE = 1e-4  # max abs logit difference, float32
COMMON = dict(
    vocab_size=300, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
    initializer_range=0.1,
)


def hf_config(name):
    """One tiny config per architecture, each exercising that architecture's features."""
    if name == "llama":  # dense: every layer a SwiGLU MLP
        return transformers.LlamaConfig(**COMMON, intermediate_size=48)
    if name == "qwen2":  # dense, q/k/v biases, tied embeddings
        return transformers.Qwen2Config(**COMMON, intermediate_size=48, tie_word_embeddings=True)
    if name == "qwen3":  # dense, qk-norm, explicit head_dim
        return transformers.Qwen3Config(**COMMON, head_dim=24, intermediate_size=48)
    if name == "mixtral":
        return transformers.MixtralConfig(**COMMON, intermediate_size=32, num_local_experts=4, num_experts_per_tok=2)
    if name == "qwen2_moe":  # q/k/v biases, gated shared expert, a dense first layer, no top-k renorm
        return transformers.Qwen2MoeConfig(
            **COMMON, intermediate_size=48, moe_intermediate_size=32, shared_expert_intermediate_size=40,
            num_experts=8, num_experts_per_tok=2, mlp_only_layers=[0], norm_topk_prob=False,
        )
    if name == "qwen3_moe":  # qk-norm, explicit head_dim, tied embeddings, top-k renorm
        return transformers.Qwen3MoeConfig(
            **COMMON, head_dim=16, intermediate_size=48, moe_intermediate_size=32, num_experts=8,
            num_experts_per_tok=2, norm_topk_prob=True, tie_word_embeddings=True,
        )
    # dots1: DeepSeek-V3 MoE (sigmoid, selection bias, group-limited top-k, scaling, 2 shared experts)
    return transformers.Dots1Config(
        **COMMON, intermediate_size=48, moe_intermediate_size=16, n_routed_experts=8, num_experts_per_tok=3,
        n_shared_experts=2, first_k_dense_replace=1, n_group=4, topk_group=2, routed_scaling_factor=2.5,
        norm_topk_prob=True,
    )


IDS = np.random.default_rng(1).integers(0, COMMON["vocab_size"], (2, 16))


def hf_logits(model):
    with torch.no_grad():
        return model(torch.from_numpy(IDS)).logits.numpy()


@functools.cache
def hf_checkpoint(name, root):
    """(directory written by save_pretrained, transformers' logits on IDS)."""
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(hf_config(name), dtype=torch.float32).eval()
    with torch.no_grad():
        for key, tensor in [*model.named_parameters(), *model.named_buffers()]:
            if key.endswith(("bias", "norm.weight", "layernorm.weight")):
                tensor.normal_(1.0 if key.endswith("weight") else 0.0, 0.3)
    path = f"{root}/{name}"
    model.save_pretrained(path)
    return path, hf_logits(model)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return str(tmp_path_factory.mktemp("hf"))


def moejax_logits(params, model_cfg, balancer=None, balance_state=None):
    graphdef, _ = nnx.split(nnx.eval_shape(lambda: Transformer(ModelConfig.from_config(model_cfg), rngs=nnx.Rngs(0))))
    positions = jnp.broadcast_to(jnp.arange(IDS.shape[1]), IDS.shape)

    @jax.jit
    def forward(params, balance_state):
        model = nnx.merge(graphdef, params)
        segments = jnp.ones(IDS.shape, jnp.int32)
        return model(jnp.asarray(IDS), positions, segments, balancer=balancer, balance_state=balance_state)[0]

    return np.asarray(forward(params, balance_state))


def random_params(model_cfg, seed):
    """Normal(0, 0.1) weights, norm scales around 1 (quicker than initialising a Transformer)."""
    rng = np.random.default_rng(seed)
    draw = lambda path, s: (float(path[-1].key == "scale") + rng.normal(0, 0.1, s.shape)).astype(s.dtype)  # noqa: E731
    return jax.tree_util.tree_map_with_path(draw, interop.abstract_params(model_cfg))


def max_diff(a, b):
    return float(np.max(np.abs(a - b)))


def import_dir(path):
    hf, tensors = interop.read_hf_dir(path)
    model_cfg = interop.model_config_from_hf(hf)
    return model_cfg, interop.params_from_hf(tensors, model_cfg, hf["model_type"]), tensors


@pytest.mark.parametrize("name", interop.IMPORTABLE)
def test_import_computes_transformers_logits(name, root):
    path, reference = hf_checkpoint(name, root)
    model_cfg, params, _ = import_dir(path)
    assert max_diff(moejax_logits(params, model_cfg), reference) < TOLERANCE
    if name in interop.DENSE:  # every layer dense: no router, no experts
        assert model_cfg.first_k_dense == model_cfg.num_layers
        assert not any("router" in "/".join(map(str, p)) for p, _ in jax.tree_util.tree_flatten_with_path(params)[0])


@pytest.mark.parametrize("name", ["mixtral", "qwen2_moe", "qwen3_moe"])
def test_export_gives_back_the_same_tensors_and_logits(name, root, tmp_path):
    path, reference = hf_checkpoint(name, root)
    model_cfg, params, tensors = import_dir(path)
    with open(f"{path}/config.json") as f:
        base = json.load(f)
    arch = interop.choose_architecture(model_cfg, preferred=None)
    assert arch == name  # each import is recognised as what it came from
    exported = interop.params_to_hf(interop.adapt_params(params, model_cfg, arch), model_cfg, arch)
    assert sorted(exported) == sorted(tensors)
    assert all(np.array_equal(exported[k], tensors[k]) for k in tensors)
    interop.write_hf_dir(str(tmp_path), interop.hf_config_from_model(model_cfg, arch, base=base), exported)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32).eval()
    assert max_diff(hf_logits(reloaded), reference) < TOLERANCE


def test_cli_import_workdir_is_a_checkpoint_and_exports_back(root, tmp_path):
    """dots1 (the most features) through the CLI: workdir checkpoint, init_from loading, export."""
    path, reference = hf_checkpoint("dots1", root)
    workdir, out = str(tmp_path / "run"), str(tmp_path / "hf_out")
    interop.main(["import", "--hf-dir", path, "--workdir", workdir])
    with open(f"{workdir}/config.json") as f:
        cfg = from_dict(json.load(f))
    params, step = load_params(workdir, interop.abstract_params(cfg.model))  # what init_from does
    assert step == 0 and max_diff(moejax_logits(params, cfg.model), reference) < TOLERANCE
    interop.main(["export", "--workdir", workdir, "--hf-dir", out])
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert type(reloaded).__name__ == "Dots1ForCausalLM"
    assert max_diff(hf_logits(reloaded), reference) < TOLERANCE


def test_loss_free_selection_bias_exports_as_e_score_correction_bias(root, tmp_path):
    """Export folds the balancing state's selection bias into the router: same routing in HF."""
    path, _ = hf_checkpoint("dots1", root)
    model_cfg, params, _ = import_dir(path)
    cfg = default_config()
    cfg.model = model_cfg
    cfg.model.moe.balancing = (("loss_free", {"u": 1e-3}),)
    bias_le = np.random.default_rng(2).normal(0, 0.3, (2, 8)).astype(np.float32)  # 2 MoE layers, 8 experts
    expected = moejax_logits(params, model_cfg, balancer_from_config(cfg), {"loss_free": {"bias_e": bias_le}})
    assert max_diff(expected, moejax_logits(params, model_cfg)) > 1e-2  # the bias changes the routing
    folded, folded_cfg = interop.fold_selection_bias(params, bias_le, model_cfg)
    tensors = interop.params_to_hf(folded, folded_cfg, "dots1")
    interop.write_hf_dir(str(tmp_path), interop.hf_config_from_model(folded_cfg, "dots1"), tensors)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32).eval()
    assert max_diff(hf_logits(reloaded), expected) < TOLERANCE


def test_native_model_exports_as_qwen2_moe_with_an_identity_shared_gate(tmp_path):
    """A default-shaped moejax model (ungated shared expert, tied head, dense first layer) exports
    exactly: Qwen2-MoE's gate sigmoid(0) = 1/2 is undone by a doubled shared down projection."""
    model_cfg = default_config().model
    model_cfg.d_model, model_cfg.num_layers, model_cfg.mlp_dim, model_cfg.vocab_size = 64, 2, 96, 300
    model_cfg.num_heads, model_cfg.num_kv_heads, model_cfg.head_dim = 4, 2, 16
    model_cfg.moe.num_experts, model_cfg.moe.expert_dim, model_cfg.moe.shared_expert_dim = 4, 32, 16
    model_cfg.moe.num_shared_experts, model_cfg.first_k_dense = 2, 1
    params = random_params(model_cfg, seed=3)
    arch = interop.choose_architecture(model_cfg)
    assert arch == "qwen2_moe"
    tensors = interop.params_to_hf(
        interop.adapt_params(params, model_cfg, arch), interop.adapted_config(model_cfg, arch), arch
    )
    interop.write_hf_dir(str(tmp_path), interop.hf_config_from_model(model_cfg, arch), tensors)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32).eval()
    assert max_diff(hf_logits(reloaded), moejax_logits(params, model_cfg)) < TOLERANCE


def test_mla_and_unsupported_architectures_are_refused_by_name():
    deepseek = transformers.DeepseekV3Config(num_hidden_layers=2).to_dict()
    with pytest.raises(interop.InteropError, match="multi-head latent attention"):
        interop.model_config_from_hf(deepseek)
    with pytest.raises(interop.InteropError, match="model_type 'gpt2'; supported: mixtral, qwen2_moe, .*, llama"):
        interop.model_config_from_hf({"model_type": "gpt2"})
    with pytest.raises(interop.InteropError, match="attention_bias=True; moejax supports only false"):
        interop.model_config_from_hf(transformers.LlamaConfig(**COMMON, attention_bias=True).to_dict())
    with pytest.raises(interop.InteropError, match="mlp_bias=True"):
        interop.model_config_from_hf(transformers.LlamaConfig(**COMMON, mlp_bias=True).to_dict())


@pytest.mark.parametrize("change, message", [
    ({"use_sliding_window": True}, "use_sliding_window"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}}, "rope_type"),
    ({"attention_bias": True}, "attention_bias=True"),
    ({"mlp_only_layers": [2]}, "layer pattern MMD"),
])
def test_inexact_config_features_are_refused_by_key(change, message):
    hf = hf_config("qwen3_moe").to_dict()
    hf.update(change)
    with pytest.raises(interop.InteropError, match=message):
        interop.model_config_from_hf(hf)


def test_export_names_why_no_architecture_fits():
    model_cfg = default_config().model
    model_cfg.moe.score_func = "sigmoid"  # sigmoid routing without qk-norm: only dots1 routes so, and it has qk-norm
    with pytest.raises(interop.InteropError, match=r"dots1: model.qk_norm=False \(needs True\)"):
        interop.choose_architecture(model_cfg)


def test_checkpoint_tensor_without_counterpart_stops_the_import(root):
    path, _ = hf_checkpoint("mixtral", root)
    hf, tensors = interop.read_hf_dir(path)
    tensors["model.layers.0.self_attn.o_proj.bias"] = np.zeros(64, np.float32)
    with pytest.raises(interop.InteropError, match="o_proj.bias"):
        interop.params_from_hf(tensors, interop.model_config_from_hf(hf), "mixtral")


def test_a_model_with_l3_layers_is_not_exported():
    model_cfg = default_config().model
    model_cfg.l3.after_layers = (1,)
    with pytest.raises(interop.InteropError, match=r"model.l3.after_layers=\(1,\) \(Large Lookup Layers"):
        interop.choose_architecture(model_cfg)


def test_export_never_overwrites_the_import_source_or_mixes_old_shards(root, tmp_path, capsys):
    """Exporting into the directory a run was imported from is refused (exit 2, files unchanged), with
    --force too; --force replaces a previous sharded export as a whole, leaving no old shard or index
    beside the new file."""
    import hashlib
    import shutil

    path, reference = hf_checkpoint("qwen3_moe", root)
    source = str(tmp_path / "source")
    shutil.copytree(path, source)
    workdir = str(tmp_path / "run")
    interop.main(["import", "--hf-dir", source, "--workdir", workdir])

    def hashes():
        return {p: hashlib.sha256(open(os.path.join(source, p), "rb").read()).hexdigest() for p in os.listdir(source)}

    before = hashes()
    with pytest.raises(SystemExit) as exit_:
        interop.main(["export", "--workdir", workdir, "--hf-dir", source])
    assert exit_.value.code == 2
    assert "holds the Hugging Face checkpoint this run was imported from; refusing to overwrite" in capsys.readouterr().err
    assert hashes() == before
    with pytest.raises(SystemExit):
        interop.main(["import", "--hf-dir", source, "--workdir", workdir])  # the workdir exists
    with pytest.raises(SystemExit) as exit_:  # --force never deletes what an export did not write
        interop.main(["export", "--workdir", workdir, "--hf-dir", source, "--force"])
    assert exit_.value.code == 2
    assert "--force replaces only a previous export" in capsys.readouterr().err
    assert hashes() == before
    out = str(tmp_path / "out")
    interop.main(["export", "--workdir", workdir, "--hf-dir", out, "--max-shard-size", "80KB"])
    assert interop.INDEX_FILE in os.listdir(out)
    interop.main(["export", "--workdir", workdir, "--hf-dir", out, "--force"])
    assert sorted(os.listdir(out)) == ["config.json", "model.safetensors", "moejax_export.json"]
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".")]  # no temporaries left
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert max_diff(hf_logits(reloaded), reference) < TOLERANCE


# ------------------------------------------------------------------ sharded, bf16, params only


@pytest.fixture(scope="module")
def bf16_round_trip(root, tmp_path_factory):
    """A bfloat16 Mixtral saved by transformers in shards, imported (params only) and exported
    with a tiny --max-shard-size through the CLI: (hf dir, workdir, export dir, float32 logits)."""
    base = tmp_path_factory.mktemp("bf16")
    path, _ = hf_checkpoint("mixtral", root)
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
    source, workdir, out = str(base / "hf"), str(base / "run"), str(base / "hf_out")
    model.save_pretrained(source, max_shard_size="100KB")
    reference = hf_logits(transformers.AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).eval())
    interop.main(["import", "--hf-dir", source, "--workdir", workdir])
    interop.main(["export", "--workdir", workdir, "--hf-dir", out, "--max-shard-size", "60KB"])
    return source, workdir, out, reference


def test_bf16_sharded_checkpoint_round_trips_bit_identically_through_a_params_only_workdir(bf16_round_trip):
    source, workdir, out, reference = bf16_round_trip
    assert os.path.isfile(os.path.join(source, interop.INDEX_FILE))  # the import read shards
    saved = interop.SavedParams(os.path.join(workdir, "checkpoints", "0"))
    try:
        assert saved.items() == ["params"]  # no optimizer state
        assert saved.dtype("embed_vd") == np.dtype("bfloat16")  # bf16 stays bf16
        for key in saved.shapes():  # what export indexes (one layer, one expert) is what a whole read holds
            whole, parts = saved.read(key), saved.view(key)
            assert (parts.shape, parts.dtype) == (whole.shape, whole.dtype)
            index, bits = (0,) * min(whole.ndim, 2), f"u{whole.dtype.itemsize}"
            assert np.array_equal(parts[index].view(bits), np.asarray(whole[index]).view(bits))
    finally:
        saved.close()
    with open(f"{workdir}/config.json") as f:
        cfg = from_dict(json.load(f))
    params, _ = load_params(workdir, interop.abstract_params(cfg.model))  # what init_from does (float32)
    _, original = interop.open_hf_dir(source)
    assert np.array_equal(params["embed_vd"], original["model.embed_tokens.weight"].astype(np.float32))
    expert = original["model.layers.2.block_sparse_moe.experts.3.w2.weight"].astype(np.float32)
    assert np.array_equal(params["layers"][0]["mlp"]["w_down_efd"][2, 3], expert.T)

    with open(os.path.join(out, interop.INDEX_FILE)) as f:
        index = json.load(f)
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 3 and sorted(os.listdir(out)) == sorted(["config.json", interop.INDEX_FILE, *shards,
                                                                  "moejax_export.json"])
    assert all(os.path.getsize(os.path.join(out, s)) < 60_000 + 4_000 for s in shards)  # data + header
    _, exported = interop.open_hf_dir(out)
    assert sorted(exported) == sorted(original)
    for name in original:
        a, b = original[name], exported[name]
        assert b.dtype == a.dtype == np.dtype("bfloat16") and np.array_equal(a.view(np.uint16), b.view(np.uint16))
    with open(os.path.join(out, "config.json")) as f:
        assert json.load(f)["dtype"] == "bfloat16"
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert max_diff(hf_logits(reloaded), reference) == 0


def test_training_starts_from_a_params_only_import_with_a_fresh_optimizer(bf16_round_trip, tmp_path):
    """init_from reads the imported parameters (cast to float32) with fresh AdamW moments; resuming
    the import itself is refused by name and leaves its checkpoint in place; evaluation reads it;
    --with-optimizer writes a train state that resumes."""
    from moejax import sharding
    from moejax.train.checkpoint import Checkpointer, ParamsOnlyCheckpoint
    from moejax.train.startup import fresh_state
    from moejax.train.state import setup

    _, workdir, _, _ = bf16_round_trip
    with open(f"{workdir}/config.json") as f:
        cfg = from_dict(json.load(f))
    cfg.train.global_batch_size, cfg.train.seq_len = 2, 16
    cfg.checkpoint.init_from = workdir
    mesh = sharding.make_mesh({"data": 1, "fsdp": 1, "expert": 1, "tensor": 1}, jax.devices()[:1])
    run = setup(cfg, mesh)
    state = fresh_state(cfg, run)
    imported, _ = load_params(workdir, interop.abstract_params(cfg.model))
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(state["params"]), jax.device_get(imported))
    assert state["params"]["embed_vd"].dtype == jnp.float32 and int(state["step"]) == 0
    moments = [x for x in jax.tree.leaves(jax.device_get(state["opt_state"])) if np.ndim(x)]
    assert moments and not any(np.any(x) for x in moments)  # fresh AdamW moments

    checkpointer = Checkpointer(os.path.join(workdir, "checkpoints"), max_to_keep=3)
    with pytest.raises(ParamsOnlyCheckpoint, match=rf"parameters only .*--config.checkpoint.init_from={workdir} "):
        checkpointer.restore_latest(run.abstract_state)
    checkpointer.close()
    assert os.listdir(os.path.join(workdir, "checkpoints")) == ["0"]  # not set aside as corrupt

    from moejax.eval.restore import EvalRun  # evaluation reads it; a balancing state it lacks starts fresh

    cfg.model.moe.balancing = (("loss_free", {"u": 1e-3}),)
    loaded = EvalRun(workdir, cfg, setup(cfg, mesh), None, None, (0,)).load()
    np.testing.assert_array_equal(jax.device_get(loaded.params["embed_vd"]), jax.device_get(imported["embed_vd"]))
    assert loaded.balance["loss_free"]["bias_e"].shape == (3, 4) and not np.any(loaded.balance["loss_free"]["bias_e"])

    full = str(tmp_path / "full")
    interop.main(["import", "--hf-dir", bf16_round_trip[0], "--workdir", full, "--with-optimizer"])
    restored = Checkpointer(os.path.join(full, "checkpoints"), max_to_keep=3).restore_latest(run.abstract_state)
    assert restored.step == 0 and restored.state["params"]["embed_vd"].dtype == jnp.float32
    # a train state saved from device arrays exports too; float32 back to bfloat16 is exact
    interop.main(["export", "--workdir", full, "--hf-dir", str(tmp_path / "out"), "--dtype", "bfloat16"])
    _, original = interop.open_hf_dir(bf16_round_trip[0])
    _, exported = interop.open_hf_dir(str(tmp_path / "out"))
    assert sorted(exported) == sorted(original)
    assert all(np.array_equal(exported[k].view(np.uint16), original[k].view(np.uint16)) for k in original)


def test_missing_shard_and_a_too_small_max_shard_size_are_named_before_any_work(bf16_round_trip, tmp_path, capsys):
    import shutil

    source, workdir, _, _ = bf16_round_trip
    broken = str(tmp_path / "broken")
    shutil.copytree(source, broken)
    with open(os.path.join(broken, interop.INDEX_FILE)) as f:
        shard = sorted(set(json.load(f)["weight_map"].values()))[1]
    os.remove(os.path.join(broken, shard))
    with pytest.raises(SystemExit) as exit_:
        interop.main(["import", "--hf-dir", broken, "--workdir", str(tmp_path / "run")])
    assert exit_.value.code == 2 and not os.path.exists(tmp_path / "run")
    assert f"lists shard '{shard}'" in capsys.readouterr().err

    # the embedding [300, 64] bf16 is the largest tensor: 38400 bytes
    with pytest.raises(SystemExit) as exit_:
        interop.main(["export", "--workdir", workdir, "--hf-dir", str(tmp_path / "out"), "--max-shard-size", "30KB"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and not os.path.exists(tmp_path / "out")
    assert "tensor 'model.embed_tokens.weight' [300, 64] bfloat16 takes 38400 bytes" in err
    assert "more than --max-shard-size 30000 bytes" in err and "Pass --max-shard-size 38400 or more" in err
    assert interop.parse_size("2GiB") == 2**31 and interop.parse_size("5GB") == 5 * 10**9
    with pytest.raises(interop.InteropError, match="'5 apples' is not a size"):
        interop.parse_size("5 apples")
