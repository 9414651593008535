"""The real train, eval and generation steps lower for GPU (cuda) and TPU on this CPU-only machine,
the check names what would not, and tokamax's grouped matmul equals ragged_dot on CPU.

What a pass proves and what it does not: experiments/tools/lower_check.py's docstring.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.tools import lower_check
from moejax.errors import ConfigError
from moejax.model import platform
from moejax.model.grouped_matmul import check_config, grouped_ffn, resolve_impl, tokamax_installed
from moejax.schema import IMPLS

needs_tokamax = pytest.mark.skipif(
    not tokamax_installed(), reason='tokamax is not installed (pip install -c constraints.txt -e ".[kernels]")'
)

# Every case of the tool; the tiny model cut to two layers (one dense, one MoE) so the suite stays
# fast: the same ops, fewer of them.
SMALL = {"model.num_layers": 2, "model.first_k_dense": 1}
FAST_CASES = ("tiny_dropless", "tiny_one_device", "tiny_capacity", "tiny_llep", "tiny_l3", "deepseek_16b")


@pytest.fixture(scope="module")
def lowered():
    """case -> the tool's rows (every step, cuda and tpu), lowered once for the module."""
    out = {}
    for case in FAST_CASES:
        out[case] = lower_check.lower_case(lower_check.case_config(case, SMALL if case.startswith("tiny") else {}))
    return out


@pytest.mark.parametrize("case", FAST_CASES)
def test_every_step_lowers_for_cuda_and_tpu(lowered, case):
    rows = lowered[case]
    assert {(r["step"], r["platform"]) for r in rows} == {(s, p) for s in lower_check.STEPS for p in ("cuda", "tpu")}
    bad = [f"{r['step']} on {r['platform']}: {r['problems']}" for r in rows if not r["ok"]]
    assert not bad, bad


def test_the_accelerator_lowering_takes_the_accelerator_paths(lowered):
    """ragged_dot on several devices (not the CPU's tile loop), dot_product_attention, and tokamax's
    own kernels on one device: Triton on cuda, Mosaic on TPU."""
    rows = {(r["step"], r["platform"]): r for r in lowered["tiny_one_device"]}
    if tokamax_installed():
        assert "__gpu$xla.gpu.triton" in rows["train", "cuda"]["custom_calls"]
        assert "tpu_custom_call" in rows["train", "tpu"]["custom_calls"]
    with platform.lowering_for("cuda"):
        assert platform.current() == "gpu"
        assert resolve_impl("auto", 8192, 64) == ("tokamax" if tokamax_installed() else "ragged")
        mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Explicit,))
        with jax.set_mesh(mesh):
            assert resolve_impl("auto", 8192, 64) == "ragged"  # tokamax serves on one device only
    assert platform.current() == "cpu" and resolve_impl("auto", 8192, 64) == "tiled"
    with pytest.raises(ValueError, match="platform must be one of"):
        with platform.lowering_for("metal"):
            pass


def _cpu_only_op():
    """A primitive with a CPU lowering only, as a CPU-only library call would be."""
    from jax.extend.core import Primitive
    from jax.interpreters import mlir

    prim = Primitive("cpu_only_op")
    prim.def_abstract_eval(lambda x: x)
    mlir.register_lowering(prim, mlir.lower_fun(lambda x: x + 1, multiple_results=False), platform="cpu")
    return prim


def test_the_check_names_an_op_that_only_lowers_on_cpu_and_a_host_callback():
    x = jax.ShapeDtypeStruct((4,), jnp.float32)
    prim = _cpu_only_op()
    result = lower_check.lower_one(jax.jit(prim.bind).trace(x), "cuda")
    assert not result["ok"] and "cpu_only_op" in result["problems"][0] and "cuda" in result["problems"][0]
    assert lower_check.lower_one(jax.jit(prim.bind).trace(x), "cpu")["ok"]

    def with_callback(x):
        return jax.pure_callback(np.sin, jax.ShapeDtypeStruct(x.shape, x.dtype), x * 2)

    for target in ("cuda", "tpu"):
        result = lower_check.lower_one(jax.jit(with_callback).trace(x), target)
        assert not result["ok"], result
        assert "host callback" in result["problems"][0] and "pure_callback" in result["problems"][0]
    text = 'stablehlo.custom_call @lapack_sgetrf(%0) : (tensor<4x4xf32>) -> tensor<4x4xf32> loc(#loc3)\n' \
           '#loc3 = loc("jit(f)/lu"(#loc1))\n'
    assert lower_check.custom_call_problems(text, "cuda") == [
        "custom call lapack_sgetrf (from jit(f)/lu) is not one cuda implements"]


def test_command_reports_a_table_and_fails_on_an_unknown_case(capsys):
    with pytest.raises(SystemExit):
        lower_check.main(["--cases", "tiny_moe_huge"])
    assert "unknown tiny_moe_huge" in capsys.readouterr().err


@needs_tokamax
def test_tokamax_equals_ragged_on_cpu_forward_and_gradients():
    """tokamax.ragged_dot on CPU is its XLA reference: the same values and gradients as ragged_dot."""
    assert "tokamax" in IMPLS
    rng = np.random.default_rng(0)
    sizes_e = np.array([5, 0, 19, 8], np.int32)  # an empty expert, 32 rows of 36 in use
    x_md = rng.normal(size=(36, 8)).astype(np.float32)
    ws = [rng.normal(size=s).astype(np.float32) / 3 for s in ((4, 8, 12), (4, 8, 12), (4, 12, 8))]
    dy_md = rng.normal(size=(36, 8)).astype(np.float32)

    def value_and_grads(impl):
        ffn = functools.partial(grouped_ffn, group_sizes_e=sizes_e, impl=impl)
        loss = lambda x, *ws: jnp.sum(ffn(x, *ws) * dy_md)
        return jax.jit(ffn)(x_md, *ws), jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))(x_md, *ws)

    (y_tok, g_tok), (y_rag, g_rag) = value_and_grads("tokamax"), value_and_grads("ragged")
    np.testing.assert_allclose(y_tok, y_rag, rtol=1e-6, atol=1e-6)
    assert np.abs(np.asarray(y_tok[32:])).max() == 0  # rows past the groups give zeros
    for name, a, b in zip(("x", "gate", "up", "down"), g_tok, g_rag):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=name)


def test_tokamax_config_errors_before_any_compile(monkeypatch):
    from moejax.configs import tiny_moe

    cfg = tiny_moe.get_config()
    cfg.model.moe.grouped_matmul = "tokamax"
    if tokamax_installed():
        check_config(cfg.model, {"data": 1, "fsdp": 1, "expert": 1, "tensor": 1})
        with pytest.raises(ConfigError, match="'tokamax' on a mesh of 8 devices; allowed on one device only"):
            check_config(cfg.model, {"data": 4, "fsdp": 1, "expert": 2, "tensor": 1})
    monkeypatch.setattr("moejax.model.grouped_matmul.tokamax_installed", lambda: False)
    with pytest.raises(ConfigError, match=r"tokamax package is not installed; install the kernels extra"):
        check_config(cfg.model, {"data": 1, "fsdp": 1, "expert": 1, "tensor": 1})


def test_the_cuda_lowering_holds_ragged_dot_where_cpu_holds_the_tile_loop():
    """The grouped SwiGLU traced for cuda is XLA's ragged_dot (no CPU tile loop); for CPU, the loop."""
    x = jax.ShapeDtypeStruct((512, 16), jnp.float32)
    ws = [jax.ShapeDtypeStruct(s, jnp.float32) for s in ((8, 16, 32), (8, 16, 32), (8, 32, 16))]
    sizes = jax.ShapeDtypeStruct((8,), jnp.int32)
    ffn = lambda x, g, u, d, s: grouped_ffn(x, g, u, d, s, impl="auto")
    mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))  # as moejax's meshes
    with jax.set_mesh(mesh):  # several devices: ragged_dot, as on a GPU mesh
        with platform.lowering_for("cuda"):
            cuda = jax.jit(ffn).trace(x, *ws, sizes).lower(lowering_platforms=("cuda",)).as_text()
        cpu = jax.jit(ffn).trace(x, *ws, sizes).lower(lowering_platforms=("cpu",)).as_text()
    assert "ragged_dot" in cuda and "stablehlo.while" not in cuda
    assert "ragged_dot" not in cpu and "stablehlo.while" in cpu
