"""Per-merge wall time of MergeMix's merge evaluation: one at a time (moejax.eval) vs batched, side by side.

    ./launch.sh python -m experiments.benchmarks.mergemix_speed [--base DIR --experts DIR]
        [--merges-per-call 8] [--rounds 2] [--max-items 64] [--loss-batches 4] [--out results/mergemix_speed.json]

The model is the default tiny one (``experiments/configs/tiny_moe.py``). Without ``--base``, a short base
(``--base-steps``) and one expert per domain (``--expert-steps``, constant learning rate, 100% of
its domain) are trained into ``--root`` first (resumed, so a rerun reuses them); ``--experts`` is a
directory holding ``<domain>/`` workdirs (e.g. a mergemix ``OUT/experts`` run's ``expert_<domain>``
need ``--experts-prefix expert_``).

Two evaluators of the same merge set and settings (the mergemix defaults, 10 tasks x 64 items and
4 held-out batches per domain), no cache:

- **one at a time**: ``MergeEvaluator(merges_per_call=0)``, each merge scored by ``moejax.eval``'s
  ``Evaluator`` (what every merge cost before the batched scorer);
- **batched**: ``MergeEvaluator(merges_per_call=C)``, C merges per compiled call
  (``data_mixture/mergemix/batched.py``).

Each round draws C alphas (Dirichlet(1)); the first path evaluates them one by one, the second in
one ``evaluate_many`` call; per-merge time is wall time / C, merge included. The first round of
each path is its compile (reported apart); the steady state is the median over the later rounds,
and the ratio is taken per round (the machine is shared: absolute times move with the load, the
ratio measured side by side is the result). Compile time is what the first merge (one at a time)
and the first call (batched) took beyond the steady state, with JAX's persistent compilation cache
off (as on a fresh machine). Every alpha's scores are compared: held-out losses to
1e-5 relative, benchmark scores exactly. Also timed: the merge alone, where the one-at-a-time
evaluation spends its time (losses, multiple choice), and one held-out batch of C merges scored by
the batched scorer's loop over the stack against ``jax.vmap`` over it (the alternative the
batched scorer does not use).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

from moejax.log import add_verbosity_flags, setup_logging

DOMAINS = ("code", "prose", "math", "knowledge")
LOSS_RTOL = 1e-5


def train_runs(root: str, base_steps: int, expert_steps: int) -> tuple[str, str]:
    """A short default-tiny base and one expert per domain (resumable); returns (base, experts dir)."""
    from experiments.configs.tiny_moe import get_config
    from moejax.train.loop import train

    def config(steps: int):
        cfg = get_config()
        cfg.train.steps, cfg.checkpoint.every_steps = steps, steps
        cfg.train.eval_every, cfg.train.log_every = 10 * steps, max(1, steps // 3)
        cfg.optim.warmup_steps = max(1, steps // 10)
        return cfg

    base = os.path.join(root, "base")
    train(config(base_steps), base)
    for domain in DOMAINS:
        cfg = config(expert_steps)
        cfg.checkpoint.init_from, cfg.checkpoint.init_step = base, base_steps
        cfg.optim.schedule = "constant"
        cfg.data.mixture = {d: (1.0 if d == domain else 0.0) for d in cfg.data.mixture}
        train(cfg, os.path.join(root, "experts", domain))
    return base, os.path.join(root, "experts")


def compare(got: dict, want: dict) -> tuple[float, list[str]]:
    """(largest relative loss difference, benchmark keys whose scores differ)."""
    rel = max(abs(got[k] - want[k]) / abs(want[k]) for k in want if k.startswith("loss:"))
    return rel, [k for k in want if k.startswith("bench:") and got[k] != want[k]]


def stack_probe(scorer, merge_set, capacity: int, rng) -> dict:
    """Seconds per merge of one held-out batch of ``capacity`` merges: the scorer's loop over the stack
    vs ``jax.vmap`` over it (after a compile call each), and whether they agree."""
    import functools

    import jax

    from data_mixture.mergemix import batched
    from experiments.benchmarks.timing import interleaved

    run = merge_set.erun.run
    stack = scorer.merge(rng.dirichlet(np.ones(merge_set.num_experts), size=capacity))
    balance, batch = merge_set.base.balance, scorer.heldout[0][1]
    count = jax.numpy.int32(capacity)
    vmapped = jax.jit(jax.vmap(functools.partial(batched._row_logprob, graphdef=run.graphdef, balancer=run.balancer),
                               in_axes=(0, None, None)))
    with jax.set_mesh(run.mesh):
        fns = {"loop": lambda: jax.block_until_ready(scorer._rows(stack, count, balance, batch)),
               "vmap": lambda: jax.block_until_ready(vmapped(stack, balance, batch))}
        secs = interleaved(fns, rounds=3)
        loop, vmap = jax.device_get(fns["loop"]()), jax.device_get(fns["vmap"]())
    return {"merges": capacity, "loop_s_per_merge": secs["loop"] / capacity, "vmap_s_per_merge": secs["vmap"] / capacity,
            "max_rel_diff": float(np.max(np.abs(loop["logprob_b"] - vmap["logprob_b"]) / np.abs(loop["logprob_b"])))}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default="", help="base workdir (default: train one into --root)")
    ap.add_argument("--experts", default="", help="directory of expert workdirs, one per domain")
    ap.add_argument("--experts-prefix", default="", help="expert workdir name = prefix + domain")
    ap.add_argument("--root", default="results/mergemix_speed_runs", help="where the short runs are trained")
    ap.add_argument("--base-steps", type=int, default=30)
    ap.add_argument("--expert-steps", type=int, default=6)
    ap.add_argument("--merges-per-call", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2, help="rounds of C merges per path, the first one compiles")
    ap.add_argument("--max-items", type=int, default=64)
    ap.add_argument("--loss-batches", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="results/mergemix_speed.json")
    add_verbosity_flags(ap)
    args = ap.parse_args(argv)
    setup_logging(args.verbosity)
    if args.rounds < 2 or args.merges_per_call < 1:
        ap.error("--rounds must be >= 2 (the first compiles) and --merges-per-call >= 1")

    import jax

    from data_mixture.mergemix.merge import MergeEvaluator, MergeSet
    from experiments.benchmarks.timing import machine, write_json
    from moejax.eval.evaluate import Evaluator, make_settings
    from moejax.eval.restore import Checkpoint

    base, experts = args.base, args.experts
    if not base:
        base, experts = train_runs(args.root, args.base_steps, args.expert_steps)
    elif not experts:
        ap.error("--base needs --experts")
    # compile times as a fresh machine pays them: no executables read back from JAX's disk cache
    jax.config.update("jax_enable_compilation_cache", False)
    load_before = machine()["load_avg_1m"]
    merge_set = MergeSet.open(base, None, {d: (os.path.join(experts, args.experts_prefix + d), None) for d in DOMAINS})
    settings = make_settings(merge_set.erun, max_items=args.max_items, loss_batches=args.loss_batches)
    evaluator = Evaluator(merge_set.erun, settings, progress=False)
    c = args.merges_per_call
    one = MergeEvaluator(merge_set, settings, evaluator=evaluator, merges_per_call=0)
    batched = MergeEvaluator(merge_set, settings, evaluator=evaluator, merges_per_call=c)
    rng = np.random.default_rng(args.seed)
    print(f"{len(settings.tasks)} tasks x {settings.max_items} items, {settings.loss_batches} held-out batches per "
          f"domain; {c} merges per round and call; {args.rounds} rounds (load {load_before:.1f})", flush=True)

    rounds, max_rel, mismatches = [], 0.0, []
    for r in range(args.rounds):
        alpha_nk = rng.dirichlet(np.ones(len(DOMAINS)), size=c)
        start = time.perf_counter()
        want = [one.evaluate(alpha_nk[0])]
        first_s = time.perf_counter() - start
        want += [one.evaluate(a) for a in alpha_nk[1:]]
        one_s = (time.perf_counter() - start) / c
        start = time.perf_counter()
        got = batched.evaluate_many(alpha_nk)
        batched_s = (time.perf_counter() - start) / c
        for g, w in zip(got, want):
            rel, bad = compare(g, w)
            max_rel, mismatches = max(max_rel, rel), mismatches + bad
        rounds.append({"one_at_a_time_s_per_merge": one_s, "batched_s_per_merge": batched_s,
                       "ratio": one_s / batched_s, "one_at_a_time_first_merge_s": first_s,
                       "load_avg_1m": os.getloadavg()[0]})
        print(f"round {r}{' (compiles)' if r == 0 else ''}: one at a time {one_s:6.2f} s/merge, batched "
              f"{batched_s:6.2f} s/merge, x{one_s / batched_s:.2f} (load {rounds[-1]['load_avg_1m']:.1f})", flush=True)

    # Where the time goes: the merge alone, the one-at-a-time evaluation's phases, merge + score apart.
    alpha = rng.dirichlet(np.ones(len(DOMAINS)))
    merge_ms = []
    for _ in range(5):
        start = time.perf_counter()
        jax.block_until_ready(merge_set.merge(alpha))
        merge_ms.append(1e3 * (time.perf_counter() - start))
    result = evaluator.evaluate(Checkpoint(merge_set.base.step, merge_set.merge(alpha), merge_set.base.balance))
    phases = {k: round(v["seconds"], 2) for k, v in result["throughput"].items()}
    tokens = {k: v["tokens"] for k, v in result["throughput"].items()}
    scorer = batched.scorer
    start = time.perf_counter()
    stack = jax.block_until_ready(scorer.merge(rng.dirichlet(np.ones(len(DOMAINS)), size=c)))
    stack_merge_s = time.perf_counter() - start
    start = time.perf_counter()
    metrics = scorer.metrics(stack, c)
    score_s = time.perf_counter() - start
    probe = stack_probe(scorer, merge_set, c, rng)

    steady = rounds[1:]
    summary = {
        "one_at_a_time_s_per_merge": statistics.median(x["one_at_a_time_s_per_merge"] for x in steady),
        "batched_s_per_merge": statistics.median(x["batched_s_per_merge"] for x in steady),
        "ratio": statistics.median(x["ratio"] for x in steady),
        "ratio_range": [min(x["ratio"] for x in steady), max(x["ratio"] for x in steady)],
    }
    # compile: the first merge (one at a time) and the first call of C merges (batched) beyond steady state
    summary["compile_s"] = {
        "one_at_a_time": rounds[0]["one_at_a_time_first_merge_s"] - summary["one_at_a_time_s_per_merge"],
        "batched": c * (rounds[0]["batched_s_per_merge"] - summary["batched_s_per_merge"])}
    payload = {
        "machine": {**machine(), "load_avg_1m_before": load_before}, "base": os.path.abspath(base),
        "experts": os.path.abspath(experts), "settings": {"tasks": list(settings.tasks), "max_items": settings.max_items,
                                                          "loss_batches": settings.loss_batches, "batch_size": settings.batch_size},
        "merges_per_call": c, "rounds": rounds, "summary": summary,
        "same_scores": {"max_loss_rel_diff": max_rel, "loss_rtol": LOSS_RTOL, "bench_mismatches": mismatches},
        "where_time_goes": {
            "merge_ms_median": statistics.median(merge_ms),
            "one_at_a_time_phase_seconds": phases, "one_at_a_time_phase_tokens": tokens,
            "batched_merge_of_stack_s": stack_merge_s, "batched_score_s_per_merge": score_s / c,
            "batched_tokens_per_merge": metrics[0]["eval_tokens"],
        },
        "stack_loop_vs_vmap": probe,
    }
    print(f"steady state: one at a time {summary['one_at_a_time_s_per_merge']:.2f} s/merge, batched "
          f"{summary['batched_s_per_merge']:.2f} s/merge: x{summary['ratio']:.2f} (target x5); compile "
          + ", ".join(f"{k} {v:.0f} s" for k, v in summary["compile_s"].items()))
    print(f"same scores: largest relative loss difference {max_rel:.2e} (tolerance {LOSS_RTOL:g}), "
          f"benchmark mismatches {mismatches or 'none'}")
    print(f"merge alone {statistics.median(merge_ms):.1f} ms; one-at-a-time phases {phases} (tokens {tokens}); "
          f"batched: {metrics[0]['eval_tokens']:.0f} tokens per merge")
    print(f"one held-out batch of {c} merges: loop {probe['loop_s_per_merge']:.3f} s/merge, vmap "
          f"{probe['vmap_s_per_merge']:.3f} s/merge")
    write_json(args.out, payload)
    if max_rel > LOSS_RTOL or mismatches:
        sys.exit("the batched scores differ from the one-at-a-time scores beyond the tolerance")
    return payload


if __name__ == "__main__":
    main()
