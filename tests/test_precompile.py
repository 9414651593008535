"""The loop's background compile (moejax/train/precompile.py) is the one the first calls find."""

import jax

from moejax import sharding
from moejax.train.precompile import Precompile
from moejax.train.state import abstract_batch, init_state, make_init, setup, to_global
from moejax.train.step import make_eval_step, make_train_step
from tests.test_sharding import batches, tiny_cfg

COMPILE_EVENTS = ("/jax/core/compile/backend_compile_duration", "/jax/compilation_cache/compile_requests_use_cache")
_seen: list[str] | None = None


def _record(event, *args, **kwargs):
    if _seen is not None and event in COMPILE_EVENTS:
        _seen.append(event)


jax.monitoring.register_event_listener(_record)
jax.monitoring.register_event_duration_secs_listener(_record)


def compiles(fn):
    """fn()'s result and the compiles (or persistent-cache lookups) it triggered: one per jitted
    function call that missed JAX's in-memory cache."""
    global _seen
    _seen = []
    try:
        return fn(), len(_seen)
    finally:
        _seen = None


def test_first_calls_after_precompile_compile_nothing():
    accum = 2
    cfg = tiny_cfg(accum=accum)
    cfg.train.seed = 5  # a program no other test compiled
    cfg.train.global_batch_size = 16  # each micro-batch splits over the 8 devices
    mesh = sharding.make_mesh({"data": 2, "fsdp": 2, "expert": 2, "tensor": 1})  # 8 fake devices
    run = setup(cfg, mesh)
    t = cfg.train
    init, train_step, eval_step = make_init(cfg, run), make_train_step(cfg, run), make_eval_step(cfg, run)
    train_sharding, eval_sharding = run.batch_sharding(True), run.batch_sharding(False)
    with Precompile(mesh, {
        "init": lambda: init.lower(t.seed),
        "eval step": lambda: eval_step.lower(
            run.abstract_state["params"], abstract_batch(eval_sharding, t.global_batch_size, None, t.seq_len),
            run.abstract_state["balance"]),
        "train step": lambda: train_step.lower(
            run.abstract_state, abstract_batch(train_sharding, t.global_batch_size, accum, t.seq_len)),
    }) as precompile:
        pass
    assert precompile.seconds > 0
    batch = batches(cfg, 1)[0]
    with jax.set_mesh(mesh):
        state, n_init = compiles(lambda: init_state(cfg, run, init))
        _, n_eval = compiles(lambda: jax.block_until_ready(
            eval_step(state["params"], to_global(batch, eval_sharding, None), state["balance"])))
        _, n_train = compiles(lambda: jax.block_until_ready(
            train_step(state, to_global(batch, train_sharding, accum))))
        # The check can see a miss: a train step that was not compiled ahead compiles on its call.
        state = init_state(cfg, run, init)
        _, n_fresh = compiles(lambda: jax.block_until_ready(
            make_train_step(cfg, run)(state, to_global(batch, train_sharding, accum))))
    assert (n_init, n_eval, n_train) == (0, 0, 0)
    assert n_fresh >= 1


def test_a_failing_job_is_left_to_the_call():
    mesh = sharding.make_mesh({"data": 8, "fsdp": 1, "expert": 1, "tensor": 1})

    def broken():
        raise ValueError("bad shapes")

    ran = []
    with Precompile(mesh, {"broken": broken, "next": lambda: ran.append(1) or jax.jit(lambda x: x + 1).lower(1.0)}):
        pass  # no exception here: the call that needs it raises it with its own traceback
    assert ran == [1]  # and the jobs after it still ran


def test_persistent_cache_defaults_under_the_corpus_cache_and_respects_the_environment(monkeypatch, tmp_path):
    from moejax.train.precompile import use_persistent_cache

    before = jax.config.jax_compilation_cache_dir
    try:
        monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
        monkeypatch.setenv("MOEJAX_CACHE", str(tmp_path))
        jax.config.update("jax_compilation_cache_dir", None)
        assert use_persistent_cache() == str(tmp_path / "xla")
        jax.config.update("jax_compilation_cache_dir", None)
        monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", "")  # empty: no cache (the sweep runner's opt-out)
        assert use_persistent_cache() is None
    finally:
        jax.config.update("jax_compilation_cache_dir", before)
