"""Model behaviour users rely on: causality, document isolation, RoPE, routing, layer pattern, counts."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from moejax.config import default_config
from moejax.model.layers import Attention, rope
from moejax.model.balancing.switch import grouped_switch_loss
from moejax.model.router import Router, Routing
from moejax.model.transformer import Transformer, is_moe_layer, layer_runs, param_counts
from moejax.schema import ModelConfig, MoEConfig


def small_model_cfg(**moe):
    cfg = default_config().model
    cfg.d_model, cfg.num_layers, cfg.mlp_dim = 32, 3, 64
    cfg.num_heads, cfg.num_kv_heads, cfg.head_dim = 4, 2, 8
    cfg.moe.num_experts, cfg.moe.expert_dim, cfg.moe.shared_expert_dim = 4, 16, 16
    cfg.moe.tile_size = 8
    for k, v in moe.items():
        cfg.moe[k] = v
    return cfg


def _attn_inputs(seed=0, b=2, t=12, d=32):
    x = jax.random.normal(jax.random.key(seed), (b, t, d))
    pos = jnp.broadcast_to(jnp.arange(t), (b, t))
    return x, pos


def test_attention_is_causal():
    cfg = small_model_cfg()
    attn = Attention(cfg, out_std=0.02, rngs=nnx.Rngs(0), dtype=jnp.float32, param_dtype=jnp.float32)
    x, pos = _attn_inputs()
    seg = jnp.ones(pos.shape, jnp.int32)
    y = attn(x, pos, seg)
    x2 = x.at[:, 7:].set(123.0)  # change the future
    np.testing.assert_allclose(attn(x2, pos, seg)[:, :7], y[:, :7], atol=1e-6)
    assert not np.allclose(attn(x2, pos, seg)[:, 7:], y[:, 7:])


def test_attention_never_crosses_documents():
    cfg = small_model_cfg()
    attn = Attention(cfg, out_std=0.02, rngs=nnx.Rngs(0), dtype=jnp.float32, param_dtype=jnp.float32)
    x, _ = _attn_inputs(t=10)
    seg = jnp.array([[1] * 4 + [2] * 6] * 2)
    pos = jnp.array([list(range(4)) + list(range(6))] * 2)
    y = attn(x, pos, seg)
    # The second document alone, at its own positions, gives the same outputs.
    y_alone = attn(x[:, 4:], pos[:, 4:], seg[:, 4:])
    np.testing.assert_allclose(y[:, 4:], y_alone, atol=1e-5)


def test_rope_scores_depend_only_on_relative_position():
    q = jax.random.normal(jax.random.key(1), (1, 1, 1, 16))
    k = jax.random.normal(jax.random.key(2), (1, 1, 1, 16))
    def score(pq, pk):
        return jnp.sum(rope(q, jnp.array([[pq]]), 1e4) * rope(k, jnp.array([[pk]]), 1e4))
    np.testing.assert_allclose(score(5, 2), score(105, 102), rtol=1e-4)
    assert not np.isclose(score(5, 2), score(5, 4))


@pytest.mark.parametrize("score_func", ["softmax", "sigmoid"])
def test_router_topk_renormalised_and_scaled(score_func):
    cfg = small_model_cfg(score_func=score_func, routed_scaling=2.5)
    router = Router(32, MoEConfig.from_config(cfg.moe), std=0.5, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(0), (2, 5, 32)).astype(jnp.bfloat16)
    r = router(x)
    assert r.logits_bte.dtype == jnp.float32 and r.weight_btk.dtype == jnp.float32
    np.testing.assert_allclose(r.weight_btk.sum(-1), 2.5, rtol=1e-5)
    np.testing.assert_allclose(r.probs_bte.sum(-1), 1.0, rtol=1e-5)
    top = np.argsort(-np.asarray(r.logits_bte), axis=-1)[..., :2]  # monotone scores: same top-k as logits
    np.testing.assert_array_equal(np.sort(top, -1), np.sort(np.asarray(r.idx_btk), -1))


def test_router_bias_and_group_limit_move_the_choice_not_the_weights():
    cfg = small_model_cfg(score_func="sigmoid", router_bias=True, num_groups=2, topk_groups=1)
    router = Router(32, MoEConfig.from_config(cfg.moe), std=0.5, rngs=nnx.Rngs(0))
    router.select_bias_e[...] = jnp.array([0.0, 0.0, 0.0, 2.0])  # group {2, 3} now beats any {0, 1}
    r = router(jax.random.normal(jax.random.key(0), (2, 5, 32)))
    np.testing.assert_array_equal(np.sort(np.asarray(r.idx_btk), -1), np.broadcast_to([2, 3], (2, 5, 2)))
    scores = jax.nn.sigmoid(r.logits_bte)[..., 2:]  # the unbiased scores of the chosen experts
    np.testing.assert_allclose(
        np.sort(np.asarray(r.weight_btk), -1), np.sort(scores / scores.sum(-1, keepdims=True), -1), rtol=1e-6
    )


def test_switch_loss_is_one_when_uniform_and_larger_when_collapsed():
    e, k = 4, 2
    idx = jnp.array([[[0, 1], [2, 3]]], jnp.int32)
    uniform = Routing(idx, jnp.ones((1, 2, k)), jnp.full((1, 2, e), 1 / e), jnp.zeros((1, 2, e)))
    assert float(grouped_switch_loss(uniform, None)) == pytest.approx(1.0)
    collapsed = Routing(jnp.zeros((1, 2, k), jnp.int32), jnp.ones((1, 2, k)),
                        jnp.array([[[1.0, 0, 0, 0]] * 2]), jnp.zeros((1, 2, e)))
    assert float(grouped_switch_loss(collapsed, None)) == pytest.approx(4.0)


def test_layer_pattern_first_dense_then_every_other():
    cfg = small_model_cfg()
    cfg.num_layers, cfg.first_k_dense, cfg.moe_every = 5, 1, 2
    assert [is_moe_layer(cfg, layer) for layer in range(5)] == [False, True, False, True, False]
    assert layer_runs(cfg) == [(False, 1), (True, 1), (False, 1), (True, 1), (False, 1)]
    cfg.moe_every = 1
    assert layer_runs(cfg) == [(False, 1), (True, 4)]
    model = Transformer(ModelConfig.from_config(cfg), rngs=nnx.Rngs(0))
    assert model.layers[1].mlp.w_gate_edf.shape == (4, cfg.moe.num_experts, cfg.d_model, cfg.moe.expert_dim)


@pytest.mark.parametrize("tie", [True, False])
def test_param_counts_match_the_model(tie):
    cfg = small_model_cfg()
    cfg.tie_embeddings, cfg.first_k_dense = tie, 1
    # The optional parameters (q/k/v biases, qk-norm scales, shared gate, router bias) in one case.
    cfg.attn_bias = cfg.qk_norm = cfg.moe.shared_gate = cfg.moe.router_bias = not tie
    model = Transformer(ModelConfig.from_config(cfg), rngs=nnx.Rngs(0))
    actual = sum(x.size for x in jax.tree.leaves(nnx.state(model)))
    assert param_counts(cfg)["total"] == actual


def test_forward_shapes_dtypes_and_aux():
    cfg = small_model_cfg()
    model = Transformer(ModelConfig.from_config(cfg), rngs=nnx.Rngs(0), compute_dtype="bfloat16")
    tokens = jnp.zeros((2, 6), jnp.int32)
    pos = jnp.broadcast_to(jnp.arange(6), (2, 6))
    logits, aux = model(tokens, pos, jnp.ones((2, 6), jnp.int32))
    assert logits.shape == (2, 6, cfg.vocab_size) and logits.dtype == jnp.float32
    assert aux["load_le"].shape == (3, 4)
    np.testing.assert_allclose(aux["load_le"].sum(-1), 1.0, rtol=1e-6)
    assert model.layers[0].mlp.router.w_de[...].dtype == jnp.float32


def test_with_routing_returns_what_each_router_sees():
    """``with_routing`` adds each MoE layer's routing and router input, in depth order (a dense
    layer and an L3 lookup in between): the router logits recomputed from the returned inputs are
    the model's routing logits. Without it, neither is kept."""
    cfg = small_model_cfg()
    cfg.num_layers, cfg.first_k_dense = 4, 1  # dense, then three MoE layers in two runs (L3 after layer 1)
    cfg.l3.after_layers, cfg.l3.budget, cfg.l3.max_rows = (1,), 2 * cfg.vocab_size, 4
    model = Transformer(ModelConfig.from_config(cfg), rngs=nnx.Rngs(0), compute_dtype="bfloat16")
    tokens = jax.random.randint(jax.random.key(1), (2, 6), 0, cfg.vocab_size)
    pos, seg = jnp.broadcast_to(jnp.arange(6), (2, 6)), jnp.ones((2, 6), jnp.int32)
    _, aux = model(tokens, pos, seg, with_routing=True)
    x_lbtd = aux["router_input_lbtd"]
    assert x_lbtd.shape == (3, 2, 6, cfg.d_model) and x_lbtd.dtype == jnp.float32
    w_lde = jnp.concatenate([
        blocks.mlp.router.w_de[...] for (is_moe, _), blocks in zip(model.runs, model.layers) if is_moe
    ])
    np.testing.assert_allclose(
        np.einsum("lbtd,lde->lbte", np.asarray(x_lbtd, np.float64), np.asarray(w_lde, np.float64)),
        aux["routing"].logits_bte, rtol=1e-5, atol=1e-5,
    )
    _, plain = model(tokens, pos, seg)
    assert "routing" not in plain and "router_input_lbtd" not in plain
