"""Large Lookup Layer: the math against a per-token reference, masking, no [tokens, rows] array,
sharding, host-resident tables, config errors, resume guard, and training through the train step."""

import math

import jax
import jax.extend.core as jex
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from moejax import sharding
from moejax.checks import validate
from moejax.config import default_config
from moejax.errors import ConfigError
from moejax.model.l3_allocation import save_allocation
from moejax.model.decode import init_cache
from moejax.model.l3 import HostTables, L3Layer, l3_forward_flops
from moejax.model.l3_allocation import RowOffsets
from moejax.model.transformer import Transformer, layer_runs, param_counts
from moejax.schema import ModelConfig
from moejax.train.state import check_l3_allocation_matches, init_state, setup, to_global
from moejax.train.step import forward_loss, make_train_step
from tests.test_sharding import batches, tiny_cfg

ONE = {"data": 1, "fsdp": 1, "expert": 1, "tensor": 1}
EIGHT = {"data": 2, "fsdp": 2, "expert": 2, "tensor": 1}


def offsets_from_rows(rows_v) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(rows_v)]).astype(np.int64)


def random_rows(vocab: int, max_rows: int, multiple: int = 1, seed: int = 0) -> np.ndarray:
    """Rows per token in [1, max_rows], at least one token at each end, total a multiple of ``multiple``."""
    rows = np.random.default_rng(seed).integers(1, max_rows + 1, vocab)
    rows[:2] = (1, max_rows)
    while rows.sum() % multiple:
        rows[2 + np.argmax(rows[2:] < max_rows)] += 1
    return rows


def layer_cfg(output="concat", tied=False, key_dim=0, d=16, vocab=40, max_rows=5):
    cfg = default_config().model
    cfg.d_model, cfg.vocab_size = d, vocab
    l3 = cfg.l3
    l3.after_layers, l3.max_rows, l3.output, l3.tied, l3.key_dim = (0,), max_rows, output, tied, key_dim
    l3.value_dim, l3.up_dim = (0 if tied else 12), 10
    return cfg


def make_layer(cfg, seed=0):
    """An L3 layer with random rows per token and every parameter random (incl. norms, W_skip)."""
    offsets = offsets_from_rows(random_rows(cfg.vocab_size, cfg.l3.max_rows, seed=seed))
    cfg.l3.budget = int(offsets[-1])
    layer = L3Layer(cfg, RowOffsets(offsets, "test"), rngs=nnx.Rngs(seed), dtype=jnp.float32, param_dtype=jnp.float32)
    key = jax.random.key(seed + 1)
    for _, variable in nnx.iter_graph(layer):
        if isinstance(variable, nnx.Param):
            key, sub = jax.random.split(key)
            variable[...] = variable[...] + 0.3 * jax.random.normal(sub, variable[...].shape)
    return layer, offsets


def inputs(cfg, b=2, t=7, seed=0):
    x = jax.random.normal(jax.random.key(seed), (b, t, cfg.d_model))
    tokens = jax.random.randint(jax.random.key(seed + 1), (b, t), 0, cfg.vocab_size)
    return x, tokens.at[0, :2].set(jnp.array([0, 1]))  # the 1-row and the max_rows token


def naive_reference(layer: L3Layer, offsets, x_btd, tokens_bt) -> np.ndarray:
    """Loops over tokens; each uses only its own rows [offsets[t], offsets[t + 1]) (float64)."""
    get = lambda p: None if p is None else np.asarray(p[...], np.float64)
    keys, values = get(layer.keys_rq), get(layer.values_rw)
    values = keys if values is None else values
    w_query, w_up, w_out, w_skip = get(layer.w_query_dq), get(layer.w_up_wu), get(layer.w_out_ud), get(layer.w_skip_dd)
    rms = lambda v, scale: v / np.sqrt(np.mean(v * v) + layer.norm.eps) * get(scale)
    x = np.asarray(x_btd, np.float64)
    out = np.zeros_like(x)
    for b, t in np.ndindex(*tokens_bt.shape):
        token = int(tokens_bt[b, t])
        lo, hi = offsets[token], offsets[token + 1]
        query = rms(x[b, t], layer.norm.scale)
        query = query if w_query is None else query @ w_query
        scores = keys[lo:hi] @ query / math.sqrt(keys.shape[1])
        attn = np.exp(scores - scores.max())
        attn /= attn.sum()
        o = (values[lo:hi].T @ attn) @ w_up
        out[b, t] = x[b, t] + rms(o, layer.out_norm.scale) @ w_out
        if w_skip is not None:
            out[b, t] += x[b, t] @ w_skip
    return out


@pytest.mark.parametrize("output,tied,key_dim", [("concat", False, 0), ("concat", True, 8), ("residual", False, 8),
                                                 ("residual", True, 0)])
def test_layer_matches_per_token_reference(output, tied, key_dim):
    cfg = layer_cfg(output, tied, key_dim)
    layer, offsets = make_layer(cfg)
    x, tokens = inputs(cfg)
    np.testing.assert_allclose(layer(x, tokens), naive_reference(layer, offsets, x, tokens), rtol=1e-5, atol=1e-5)
    assert (layer.w_skip_dd is None) == (output == "residual")
    assert (layer.values_rw is None) == tied and (layer.w_query_dq is None) == (key_dim == 0)


def test_rows_past_a_token_get_zero_attention_and_zero_gradient():
    cfg = layer_cfg()
    layer, offsets = make_layer(cfg)
    x, tokens = inputs(cfg)
    rows = layer.gather(tokens)
    count_bt = np.diff(offsets)[np.asarray(tokens)]
    past_btk = np.arange(cfg.l3.max_rows) >= count_bt[..., None]
    assert past_btk.any() and (~past_btk).all(-1).any()  # some tokens own fewer than k rows, some all k
    probs = np.asarray(layer.attention(x, rows.keys_btkq, rows.mask_btk))
    assert (probs[past_btk] == 0).all() and (probs[~past_btk] > 0).all()
    np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=1e-6)

    def loss(keys_btkq, values_btkw):
        return jnp.sum(jnp.sin(layer.attend(x, rows._replace(keys_btkq=keys_btkq, values_btkw=values_btkw))))

    for grad_btkd in jax.grad(loss, argnums=(0, 1))(rows.keys_btkq, rows.values_btkw):
        assert (np.asarray(grad_btkd)[past_btk] == 0).all()
        assert (np.abs(np.asarray(grad_btkd)[~past_btk & (count_bt > 1)[..., None]]).sum(-1) > 0).all()
    # Table gradients (scatter-add of the gathered rows) land on the rows of the tokens present only.
    graphdef, params = nnx.split(layer)
    table_grads = jax.grad(lambda p: jnp.sum(jnp.sin(nnx.merge(graphdef, p)(x, tokens))))(params)
    owned_r = np.zeros(int(offsets[-1]), bool)
    for token in np.unique(np.asarray(tokens)):
        owned_r[offsets[token]:offsets[token + 1]] = True
    touched = lambda grad_rd: np.abs(np.asarray(grad_rd[...])).sum(-1) > 0
    np.testing.assert_array_equal(touched(table_grads["values_rw"]), owned_r)
    # Keys: the same, less the rows of one-row tokens (a softmax over one score is constant).
    assert not (touched(table_grads["keys_rq"]) & ~owned_r).any()


def _largest_intermediate(jaxpr) -> int:
    largest = 0
    for eqn in jaxpr.eqns:
        for var in eqn.outvars:
            largest = max(largest, math.prod(getattr(var.aval, "shape", ())))
        for sub in jex.jaxprs_in_params(eqn.params):
            largest = max(largest, _largest_intermediate(sub))
    return largest


def test_no_tokens_by_rows_array_forward_or_backward():
    cfg = layer_cfg(d=8, vocab=1024, max_rows=8)
    cfg.l3.value_dim = cfg.l3.up_dim = 8
    layer, offsets = make_layer(cfg)
    x, tokens = inputs(cfg, b=4, t=64)
    graphdef, params = nnx.split(layer)
    loss = lambda p, x: jnp.sum(nnx.merge(graphdef, p)(x, tokens) ** 2)
    jaxpr = jax.make_jaxpr(jax.value_and_grad(loss, argnums=(0, 1)))(params, x).jaxpr
    tokens_by_rows = tokens.size * int(offsets[-1])  # 256 x ~4600
    tables = int(offsets[-1]) * 8
    assert _largest_intermediate(jaxpr) <= max(tables, tokens.size * cfg.l3.max_rows * 8) < tokens_by_rows / 16


def l3_train_cfg(tmp_path):
    """tiny_cfg, dense (compiles faster), with L3 layers after both layers, from an LZW-like allocation file."""
    cfg = tiny_cfg()
    cfg.model.first_k_dense = 2
    l3 = cfg.model.l3
    rows = random_rows(cfg.model.vocab_size, 6, multiple=4, seed=3)
    path = str(tmp_path / "alloc.json")
    save_allocation(path, offsets_from_rows(rows), method="lzw", max_rows=6, tokenizer="byte", sample_tokens=0)
    l3.after_layers, l3.budget, l3.max_rows, l3.allocation, l3.up_dim = (0, 1), int(rows.sum()), 6, path, 24
    return cfg


def loss_and_grads(cfg, mesh_shape, devices):
    validate(cfg, len(devices))
    mesh = sharding.make_mesh(mesh_shape, devices)
    run = setup(cfg, mesh)
    state = init_state(cfg, run)
    batch = to_global(batches(cfg, 1)[0], run.batch_sharding(accum=False), None)

    def fn(params, balance, batch):
        return jax.value_and_grad(forward_loss, has_aux=True)(
            params, balance, batch, graphdef=run.graphdef, balancer=run.balancer, logits_z_loss=0.0
        )

    with jax.set_mesh(mesh):
        (loss, _), grads = jax.jit(fn)(state["params"], state["balance"], batch)
    return run, float(loss), jax.device_get(grads)


def test_sharded_tables_match_one_device(tmp_path):
    cfg = l3_train_cfg(tmp_path)
    run, ref_loss, ref_grads = loss_and_grads(cfg, ONE, jax.devices()[:1])
    assert run.l3_meta()["method"] == "lzw" and len(run.l3_meta()["sha256"]) == 64
    cfg.train.remat = "full"  # and rematerialised: the same numbers
    run8, loss, grads = loss_and_grads(cfg, EIGHT, jax.devices())
    assert run8.state_shardings["params"]["l3"][0]["keys_rq"].spec == jax.sharding.PartitionSpec(("fsdp", "expert"), None)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
    assert np.abs(np.asarray(ref_grads["l3"][1]["values_rw"])).max() > 0
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), grads, ref_grads)


def test_tiny_model_with_l3_trains_and_guards_its_allocation(tmp_path):
    cfg = l3_train_cfg(tmp_path)
    cfg.optim.lr = 1e-2
    validate(cfg, 8)
    mesh = sharding.make_mesh(EIGHT, jax.devices())
    run = setup(cfg, mesh)
    state = init_state(cfg, run)
    step = make_train_step(cfg, run)
    batch = batches(cfg, 1)[0]  # the same batch each step: the loss must fall
    losses = []
    with jax.set_mesh(mesh):
        for _ in range(6):
            state, metrics = step(state, to_global(batch, run.batch_sharding(True), 1))
            losses.append(float(metrics["loss"]))
    assert losses[-1] < losses[0] - 0.1, losses
    # The allocation is in the graph only: the state (params, optimizer, checkpoint) holds tables, not offsets.
    assert all("offsets" not in jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_flatten_with_path(state)[0])
    check_l3_allocation_matches(run, {"l3_allocation": run.l3_meta()}, "ckpt/6")
    with pytest.raises(ConfigError, match=r"ckpt/6 was trained with the L3 allocation \(uniform, sha256 0+\)"):
        check_l3_allocation_matches(run, {"l3_allocation": {"method": "uniform", "sha256": "0" * 64}}, "ckpt/6")


@pytest.mark.parametrize("memory", ["pinned_host", "numpy"])
def test_host_tables_equal_device_tables(memory, monkeypatch):
    cfg = layer_cfg()
    layer, _ = make_layer(cfg)
    x, tokens = inputs(cfg)
    if memory == "numpy":
        monkeypatch.setattr("moejax.model.l3.host_memory_kind", lambda device: None)
    mesh = sharding.make_mesh(ONE, jax.devices()[:1])
    host = HostTables(layer, mesh)
    assert host.memory_kind == (None if memory == "numpy" else "pinned_host")
    for table in host.tables:
        assert isinstance(table, np.ndarray) if memory == "numpy" else table.sharding.memory_kind == "pinned_host"
    fetched = host.fetch(tokens)
    assert fetched.keys_btkq.shape == (*tokens.shape, cfg.l3.max_rows, cfg.d_model)
    np.testing.assert_array_equal(layer.lookup_from_host(x, tokens, host), layer(x, tokens))


def test_decode_with_host_rows_never_reads_device_tables():
    cfg = tiny_cfg().model
    cfg.first_k_dense, cfg.l3.after_layers, cfg.l3.budget, cfg.l3.max_rows = 2, (1,), 272 * 3, 4
    model = Transformer(ModelConfig.from_config(cfg), rngs=nnx.Rngs(0))
    mesh = sharding.make_mesh(ONE, jax.devices()[:1])
    hosts = [HostTables(layer, mesh) for layer in model.l3]
    tokens = jax.random.randint(jax.random.key(0), (2, 5), 0, cfg.vocab_size)
    index = jnp.zeros((2,), jnp.int32)
    graphdef, params = nnx.split(model)
    params = nnx.to_pure_dict(params)
    decode = jax.jit(lambda p, rows: nnx.merge(graphdef, p).decode(tokens, init_cache(cfg, 2, 8), index, l3_rows=rows)[0])
    device_logits = decode(params, None)
    params["l3"][0]["keys_rq"] = params["l3"][0]["values_rw"] = jnp.zeros((0, cfg.d_model))  # no device copy
    host_logits = decode(params, tuple(host.fetch(tokens) for host in hosts))
    np.testing.assert_allclose(host_logits, device_logits, atol=1e-6)


def test_runs_split_at_l3_positions_and_counts_match():
    cfg = tiny_cfg().model
    cfg.num_layers, cfg.first_k_dense = 5, 2
    cfg.l3.after_layers, cfg.l3.budget, cfg.l3.max_rows, cfg.l3.tied, cfg.l3.key_dim = (3, 0), 272 * 2, 4, True, 16
    assert layer_runs(cfg) == [(False, 1), (False, 1), (True, 2), (True, 1)]
    model = nnx.eval_shape(lambda: Transformer(ModelConfig.from_config(cfg), rngs=nnx.Rngs(0)))
    assert model.l3_after == (0, 3) and len(model.l3) == 2
    assert param_counts(cfg)["total"] == sum(x.size for x in jax.tree.leaves(nnx.state(model)))
    # Forward FLOPs per token: 2k(q + w) for the rows, 2 x the query, up, out and skip matrices.
    assert l3_forward_flops(cfg) == 2 * 4 * (16 + 16) + 2 * (32 * 16 + 16 * 32 + 32 * 32 + 32 * 32)


@pytest.mark.parametrize("key,value,match", [
    ("after_layers", (0, 2), r"'model.l3.after_layers' has value \(0, 2\); allowed: layer indices in \[0, 1\]"),
    ("after_layers", (1, 1), r"each layer index at most once"),
    ("budget", 100, r"'model.l3.budget' has value 100; allowed: at least model.vocab_size=272"),
    ("budget", 272 * 16 + 4, r"at most model.vocab_size x model.l3.max_rows = 4352"),
    ("budget", 274, r"'model.l3.budget' has value 274; allowed: a multiple of mesh.fsdp x mesh.expert = 4"),
    ("max_rows", 0, r"'model.l3.max_rows' has value 0; allowed: an integer >= 1"),
    ("value_dim", 8, r"'model.l3.value_dim' has value 8; allowed: 0 or the key width 32 when model.l3.tied"),
    ("output", "sum", r"'model.l3.output' has value 'sum'; allowed: concat \| residual"),
])
def test_config_errors_name_the_key(key, value, match):
    cfg = tiny_cfg()
    cfg.mesh.update(EIGHT)
    cfg.model.l3.after_layers, cfg.model.l3.tied = (1,), key == "value_dim"
    cfg.model.l3[key] = value
    with pytest.raises(ConfigError, match=match):
        validate(cfg, 8)


def test_allocation_for_another_vocabulary_is_refused(tmp_path):
    cfg = tiny_cfg()
    path = str(tmp_path / "alloc.json")
    save_allocation(path, offsets_from_rows(np.full(300, 2)), method="lzw", max_rows=4, tokenizer="byte", sample_tokens=0)
    cfg.model.l3.after_layers, cfg.model.l3.budget, cfg.model.l3.max_rows, cfg.model.l3.allocation = (0,), 600, 4, path
    with pytest.raises(ConfigError, match=r"'model.l3.allocation' has value .*alloc.json.*300 tokens but the vocabulary has 272"):
        validate(cfg, 8)
