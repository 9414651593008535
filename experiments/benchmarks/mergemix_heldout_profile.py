"""Where a merge's held-out losses spend their time: calls, shapes, recompiles, and the forward's variants.

    ./launch.sh python -m experiments.benchmarks.mergemix_heldout_profile --base DIR --experts DIR
        [--merges-per-call 8] [--rounds 5] [--out results/mergemix_heldout_profile.json]

The held-out losses of MergeMix's batched scorer (``data_mixture/mergemix/batched.py``) are one
jitted call per held-out batch (domains x ``loss_batches`` calls of the run's training batch shape),
each looping over the merges of the stack. On one held-out batch and a stack of C merges, timed in
interleaved rounds (medians, seconds per merge and batch; ``experiments/benchmarks/timing.py``):

- ``loop_1`` / ``loop_C``: the scorer's own call for 1 or C merges of the stack;
- ``vmap_C``: ``jax.vmap`` of the same forward over the C merges;
- ``concat``: one merge on the domain's ``loss_batches`` batches concatenated into one call;
- ``logits_only``: the forward without the cross-entropy (what the loss itself costs);
- ``impl_<name>``: the same forward with the dropless grouped matmul forced to ``tiled`` /
  ``hybrid`` / ``ragged`` (``model.moe.grouped_matmul``; ``auto`` is what the run uses);

plus the scorer's compiled-program counts after the whole evaluation of two stacks (recompiles),
the FLOPs XLA's cost analysis gives the held-out call, and every variant's largest relative
difference from ``loop_1``'s per-row log-probabilities.
"""

from __future__ import annotations

import argparse
import os

import numpy as np

DOMAINS = ("code", "prose", "math", "knowledge")


def trace_parts(jitted, args: tuple, calls: int = 3) -> dict[str, float]:
    """Thread-summed milliseconds per call of each part of a jitted function's ops, from a
    ``jax.profiler`` trace (the parts of ``profile_step.PART_OF_FUNCTION``)."""
    import collections
    import glob
    import tempfile

    import jax

    from experiments.benchmarks.profile_step import _stack_functions, part_of

    compiled = jitted.lower(*args).compile()
    ops = _stack_functions(compiled.as_text())
    jax.block_until_ready(jitted(*args))
    totals = collections.Counter()
    with tempfile.TemporaryDirectory() as tmp:
        jax.profiler.start_trace(tmp)
        for _ in range(calls):
            jax.block_until_ready(jitted(*args))
        jax.profiler.stop_trace()
        data = jax.profiler.ProfileData.from_file(sorted(glob.glob(f"{tmp}/**/*.xplane.pb", recursive=True))[-1])
        for plane in data.planes:
            for line in plane.lines:
                for event in line.events:
                    stats = dict(event.stats)
                    name = stats.get("hlo_op")
                    if name is None or not str(stats.get("hlo_module", "")).startswith("jit_fn"):
                        continue
                    if name.startswith(("while", "conditional", "call")):
                        continue
                    op_name, functions = ops.get(name, ("", []))
                    totals[part_of(op_name, functions).replace(" [fwd]", "")] += event.duration_ns / 1e6 / calls
    return dict(totals.most_common())


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True)
    ap.add_argument("--experts", required=True, help="directory holding one workdir per domain")
    ap.add_argument("--merges-per-call", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--loss-batches", type=int, default=4)
    ap.add_argument("--out", default="results/mergemix_heldout_profile.json")
    args = ap.parse_args(argv)

    import jax
    import jax.numpy as jnp
    from flax import nnx

    from data_mixture.mergemix import batched
    from data_mixture.mergemix.merge import MergeSet
    from experiments.benchmarks.timing import interleaved, machine, write_json
    from moejax.eval.evaluate import Evaluator, make_settings
    from moejax.train.state import make_model

    load_before = machine()["load_avg_1m"]
    merge_set = MergeSet.open(args.base, None, {d: (os.path.join(args.experts, d), None) for d in DOMAINS})
    settings = make_settings(merge_set.erun, max_items=1, loss_batches=args.loss_batches)
    evaluator = Evaluator(merge_set.erun, settings, progress=False)
    c = args.merges_per_call
    scorer = batched.BatchedScorer(merge_set, evaluator, capacity=c)
    run, cfg = merge_set.erun.run, merge_set.erun.cfg
    rng = np.random.default_rng(0)
    stack = scorer.merge(rng.dirichlet(np.ones(len(DOMAINS)), size=c))
    balance = merge_set.base.balance
    domain, batch, real = scorer.heldout[0]
    shape = {k: list(v.shape) for k, v in batch.items()}

    # recompiles: the whole held-out evaluation of two stacks of different counts
    scorer.losses(stack, c)
    scorer.losses(stack, 1)
    compiled_programs = scorer._rows._cache_size()

    def row_fn(graphdef, logits_only=False):
        def fn(params, balance, batch):
            if not logits_only:
                return batched._row_logprob(params, balance, batch, graphdef=graphdef, balancer=run.balancer)
            model = nnx.merge(graphdef, params)
            logits_btv, _ = model(batch["inputs"], batch["positions"], batch["segment_ids"],
                                  balancer=run.balancer if balance else None, balance_state=balance)
            return {"logprob_b": jnp.sum(logits_btv[..., 0], axis=-1)}
        return fn

    one = jax.tree.map(lambda x: x[0], stack)
    same = batch.copy()
    concat = {k: jnp.concatenate([b[k] for d, b, _ in scorer.heldout if d == domain]) for k in batch}
    plain = jax.jit(row_fn(run.graphdef))
    vmapped = jax.jit(jax.vmap(row_fn(run.graphdef), in_axes=(0, None, None)))
    logits_only = jax.jit(row_fn(run.graphdef, logits_only=True))
    impls = {}
    for impl in ("tiled", "hybrid", "ragged"):
        icfg = cfg.copy_and_resolve_references()
        icfg.model.moe.grouped_matmul = impl
        graphdef, _ = nnx.split(nnx.eval_shape(lambda icfg=icfg: make_model(icfg, 0)))
        impls[impl] = jax.jit(row_fn(graphdef))
    n1, nc = jnp.int32(1), jnp.int32(c)
    nb = concat["inputs"].shape[0] // batch["inputs"].shape[0]
    with jax.set_mesh(run.mesh):
        fns = {
            "loop_1": (lambda: jax.block_until_ready(scorer._rows(stack, n1, balance, batch)), 1),
            f"loop_{c}": (lambda: jax.block_until_ready(scorer._rows(stack, nc, balance, batch)), c),
            f"vmap_{c}": (lambda: jax.block_until_ready(vmapped(stack, balance, same)), c),
            "plain_1": (lambda: jax.block_until_ready(plain(one, balance, batch)), 1),
            "concat": (lambda: jax.block_until_ready(plain(one, balance, concat)), nb),
            "logits_only": (lambda: jax.block_until_ready(logits_only(one, balance, batch)), 1),
            **{f"impl_{k}": ((lambda f=f: jax.block_until_ready(f(one, balance, batch))), 1) for k, f in impls.items()},
        }
        secs = interleaved({k: f for k, (f, _) in fns.items()}, rounds=args.rounds)
        per = {k: secs[k] / fns[k][1] for k in fns}
        want = np.asarray(jax.device_get(plain(one, balance, batch))["logprob_b"])
        diffs = {}
        for k in ("impl_tiled", "impl_hybrid", "impl_ragged"):
            got = np.asarray(jax.device_get(impls[k[5:]](one, balance, batch))["logprob_b"])
            diffs[k] = float(np.max(np.abs(got - want) / np.abs(want)))
        loop = np.asarray(jax.device_get(scorer._rows(stack, nc, balance, batch))["logprob_b"])
        vm = np.asarray(jax.device_get(vmapped(stack, balance, same))["logprob_b"])
        diffs[f"vmap_{c}"] = float(np.max(np.abs(vm - loop) / np.abs(loop)))
        parts = trace_parts(plain, (one, balance, batch))
        flops = plain.lower(one, balance, batch).compile().cost_analysis()
        flops = flops[0] if isinstance(flops, list) else flops
    payload = {
        "machine": {**machine(), "load_avg_1m_before": load_before, "uptime": os.popen("uptime").read().strip()},
        "calls_per_merge": len(scorer.heldout), "batch_shape": shape, "real_tokens_per_batch": real,
        "heldout_tokens_per_merge": sum(r for *_, r in scorer.heldout),
        "compiled_programs_after_two_stacks": compiled_programs,
        "flops_per_call_one_merge": float(flops.get("flops", float("nan"))),
        "seconds_per_merge_and_batch": per, "max_rel_diff_vs_plain": diffs,
        "ratio_to_loop_1": {k: v / per["loop_1"] for k, v in per.items()},
        "trace_ms_per_call_one_merge": parts,
    }
    for k, v in per.items():
        print(f"{k:14s} {v:.4f} s per merge and batch  (x{v / per['loop_1']:.2f} of loop_1)")
    print(f"calls per merge {payload['calls_per_merge']}, batch {shape}, compiled programs {compiled_programs}, "
          f"GFLOP per call {payload['flops_per_call_one_merge'] / 1e9:.2f}, diffs {diffs}")
    total = sum(parts.values())
    print(f"per-op trace of one merge's held-out call, thread-summed {total:.0f} ms:")
    for part, ms in parts.items():
        print(f"  {part:52s} {ms:9.1f} ms {ms / total:6.1%}")
    write_json(args.out, payload)
    return payload


if __name__ == "__main__":
    main()
