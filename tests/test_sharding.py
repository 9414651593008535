"""The same training steps give the same losses on one device and on 8 fake devices under several meshes."""

import jax
import numpy as np
import pytest

from moejax import sharding
from moejax.config import default_config
from moejax.errors import ConfigError
from moejax.data.tokenizer import ByteTokenizer
from moejax.train.state import init_state, setup, to_global
from moejax.train.step import make_train_step

TEXT = (
    "The quick brown fox jumps over the lazy dog. def add(a, b):\n    return a + b\n"
    "Q: What is 12 * 7?\nA: 84\nMarla Venn was born in Tesk in 1843. "
) * 40


def tiny_cfg(backend="dropless", accum=1):
    cfg = default_config()
    t, m = cfg.train, cfg.model
    t.global_batch_size, t.seq_len, t.grad_accum_steps, t.steps = 8, 32, accum, 10
    m.d_model, m.num_layers, m.mlp_dim, m.first_k_dense = 32, 2, 64, 1
    m.num_heads, m.num_kv_heads, m.head_dim = 4, 2, 8
    m.moe.num_experts, m.moe.expert_dim, m.moe.shared_expert_dim, m.moe.tile_size = 4, 16, 16, 8
    m.moe.backend = backend
    cfg.optim.warmup_steps = 2
    return cfg


def batches(cfg, n=3):
    tokens = ByteTokenizer().encode(TEXT)
    b, s = cfg.train.global_batch_size, cfg.train.seq_len
    rng = np.random.default_rng(0)
    out = []
    for _ in range(n):
        starts = rng.integers(0, len(tokens) - s - 1, size=b)
        window = np.stack([tokens[i : i + s + 1] for i in starts]).astype(np.int32)
        seg = np.where(np.arange(s) < s // 2, 1, 2).astype(np.int32)[None].repeat(b, 0)  # two documents
        pos = np.concatenate([np.arange(s // 2), np.arange(s - s // 2)])[None].repeat(b, 0).astype(np.int32)
        mask = np.ones((b, s), np.float32)
        mask[:, s // 2 - 1] = 0.0
        out.append({"inputs": window[:, :-1], "targets": window[:, 1:], "segment_ids": seg,
                    "positions": pos, "loss_mask": mask})
    return out


def train_losses(cfg, mesh_shape, devices):
    mesh = sharding.make_mesh(mesh_shape, devices)
    run = setup(cfg, mesh)
    state = init_state(cfg, run)
    step = make_train_step(cfg, run)
    losses = []
    with jax.set_mesh(mesh):
        for batch in batches(cfg):
            state, metrics = step(state, to_global(batch, run.batch_sharding(True), cfg.train.grad_accum_steps))
            losses.append(float(metrics["loss"]))
    return np.array(losses), jax.device_get(state["params"])


MESHES = [
    {"data": 8, "fsdp": 1, "expert": 1, "tensor": 1},
    {"data": 2, "fsdp": 2, "expert": 2, "tensor": 1},
    {"data": 1, "fsdp": 4, "expert": 1, "tensor": 2},
]
ONE = {"data": 1, "fsdp": 1, "expert": 1, "tensor": 1}


@pytest.mark.parametrize("backend", ["dropless", "capacity"])
def test_meshes_match_single_device(backend):
    cfg = tiny_cfg(backend)
    ref_losses, ref_params = train_losses(cfg, ONE, jax.devices()[:1])
    assert ref_losses[-1] < ref_losses[0]  # it learns
    for shape in MESHES:
        losses, params = train_losses(cfg, shape, jax.devices())
        np.testing.assert_allclose(losses, ref_losses, rtol=2e-5, err_msg=str(shape))
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=2e-5), params, ref_params)


def test_grad_accumulation_matches_one_big_batch():
    ref, _ = train_losses(tiny_cfg(accum=1), ONE, jax.devices()[:1])
    accum, _ = train_losses(tiny_cfg(accum=2), {"data": 4, "fsdp": 1, "expert": 1, "tensor": 1}, jax.devices()[:4])
    np.testing.assert_allclose(accum, ref, rtol=1e-4)  # equal masked-token counts per micro-batch: same mean


def test_parameters_carry_the_planned_shardings():
    cfg = tiny_cfg()
    mesh = sharding.make_mesh(MESHES[1] | {"fsdp": 2}, jax.devices())
    run = setup(cfg, mesh)
    w = run.state_shardings["params"]["layers"][1]["mlp"]["w_gate_edf"]  # [layers, e, d, f]
    assert w.spec == jax.sharding.PartitionSpec(None, "expert", "fsdp", "tensor")


def test_indivisible_parameter_is_named():
    cfg = tiny_cfg()
    cfg.model.moe.num_experts = 6
    mesh = sharding.make_mesh({"data": 2, "fsdp": 1, "expert": 4, "tensor": 1}, jax.devices())
    with pytest.raises(ConfigError, match=r"w_(gate|up|down)_e\w\w'\] has dimension 1 of size 6, which cannot be split 4 ways"):
        setup(cfg, mesh)
