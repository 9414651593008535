"""How many held-out batches MergeMix needs to rank merges: ranking noise and time against ``--loss-batches``.

    ./launch.sh python -m experiments.benchmarks.mergemix_heldout_batches [--base DIR --experts DIR]
        [--max-batches 8] [--ks 1,2,4,8] [--random 11] [--boot 1000]
        [--out results/mergemix_heldout_batches.json]

Without ``--base``, the short default-tiny base and experts of ``mergemix_speed.train_runs`` are
trained into ``--root`` first (resumed). The merges: the simplex vertices (each expert), the uniform
merge and ``--random`` Dirichlet(1) points, scored by MergeMix's batched scorer
(``data_mixture/mergemix/batched.py``) in stacks of ``--merges-per-call``. Each merge's summed nats
and scored tokens are recorded once per held-out batch and domain at ``--max-batches`` batches per
domain; since ``loss_batches=k`` scores a fixed prefix of those batches, the losses at ``k`` batches
are the first ``k`` columns. The ranking is by the mean over domains of the held-out losses (lower
is better). For each ``k`` of ``--ks``:

- ``seconds_per_merge``: the held-out losses of one stack at ``k`` batches, timed (wall time / merges);
- ``spearman``: the merges' mean losses at ``k`` batches against those at ``--max-batches``;
- ``flip_rate``: the share of merge pairs ordered differently at ``k`` batches than at ``--max-batches``,
  and ``max_flipped_gap``: the largest difference of mean loss (nats, at ``--max-batches``) of a
  flipped pair;
- ``regret``: how much higher (nats, at ``--max-batches``) the mean loss of the merge ranked best at
  ``k`` batches is than the best merge's;
- ``boot``: the flip rate and regret when each domain's ``k`` batches are drawn with replacement
  from the ``--max-batches`` recorded (``--boot`` draws): the flip rate's mean and 5/50/95th
  percentiles, the regret's mean and 95th percentile: the noise of a ``k``-batch subset that is not
  the particular prefix.

The same figures over the interior merges only (uniform and random, no vertex), which are closer to
one another than the experts are, and what a search compares.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from data_mixture.mergemix.rank import spearman

DOMAINS = ("code", "prose", "math", "knowledge")


def subset_mean_loss(sums_mdb2: np.ndarray, index_db: np.ndarray) -> np.ndarray:
    """Each merge's mean over domains of its held-out loss (summed nats over summed tokens) on the
    batches ``index_db[d]`` of domain ``d`` (repeats allowed). ``sums_mdb2``: [merges, domains,
    batches, (nats, tokens)]."""
    index = np.broadcast_to(np.asarray(index_db)[None, :, :, None], (sums_mdb2.shape[0], *np.shape(index_db), 2))
    picked_mdb2 = np.take_along_axis(sums_mdb2, index, axis=2)
    totals_md2 = picked_mdb2.sum(axis=2)
    return (totals_md2[..., 0] / totals_md2[..., 1]).mean(axis=1)


def flipped_pairs(score_m: np.ndarray, ref_m: np.ndarray) -> np.ndarray:
    """Whether each pair (i < j, ``np.triu_indices`` order) is ordered differently by ``score_m``
    than by ``ref_m`` (a tie on one side and not on the other counts as a flip)."""
    i, j = np.triu_indices(len(ref_m), k=1)
    return np.sign(score_m[i] - score_m[j]) != np.sign(ref_m[i] - ref_m[j])


def flip_rate(score_m: np.ndarray, ref_m: np.ndarray) -> float:
    """The share of merge pairs that ``score_m`` and ``ref_m`` order differently."""
    return float(np.mean(flipped_pairs(score_m, ref_m)))


def regret(score_m: np.ndarray, ref_m: np.ndarray) -> float:
    """How much worse, by ``ref_m``, the merge ``score_m`` ranks best (lowest) is than ``ref_m``'s best."""
    return float(ref_m[np.argmin(score_m)] - ref_m.min())


def bootstrap_losses(sums_mdb2: np.ndarray, k: int, draws: int, rng: np.random.Generator) -> np.ndarray:
    """[draws, merges]: the merges' mean losses on ``draws`` subsets of ``k`` batches per domain, each
    domain's drawn with replacement from its recorded batches."""
    _, domains, batches, _ = sums_mdb2.shape
    return np.stack([subset_mean_loss(sums_mdb2, rng.integers(0, batches, size=(domains, k))) for _ in range(draws)])


def ranking_table(sums_mdb2: np.ndarray, ks: list[int], draws: int, seed: int) -> dict[int, dict]:
    """Per ``k``, the first ``k`` batches against all recorded: Spearman, flip rate, the largest
    reference gap (nats) of a flipped pair, the regret of the best merge; and the bootstrap of the
    flip rate and regret (module docstring)."""
    batches = sums_mdb2.shape[2]
    ref_m = subset_mean_loss(sums_mdb2, np.tile(np.arange(batches), (sums_mdb2.shape[1], 1)))
    i, j = np.triu_indices(len(ref_m), k=1)
    gap_p = np.abs(ref_m[i] - ref_m[j])
    out = {}
    for k in ks:
        prefix_m = subset_mean_loss(sums_mdb2, np.tile(np.arange(k), (sums_mdb2.shape[1], 1)))
        flipped = flipped_pairs(prefix_m, ref_m)
        boot_rm = bootstrap_losses(sums_mdb2, k, draws, np.random.default_rng(seed + k))
        flips = np.array([flip_rate(b_m, ref_m) for b_m in boot_rm])
        regrets = np.array([regret(b_m, ref_m) for b_m in boot_rm])
        out[k] = {"spearman": spearman(prefix_m, ref_m), "flip_rate": float(flipped.mean()),
                  "max_flipped_gap": float(gap_p[flipped].max()) if flipped.any() else 0.0,
                  "regret": regret(prefix_m, ref_m),
                  "boot_flip_mean": float(flips.mean()),
                  "boot_flip_p5_p50_p95": [float(q) for q in np.percentile(flips, [5, 50, 95])],
                  "boot_regret_mean": float(regrets.mean()), "boot_regret_p95": float(np.percentile(regrets, 95))}
    return out


def merge_alphas(num_experts: int, random: int, seed: int) -> tuple[np.ndarray, list[str]]:
    """The vertices, the uniform merge and ``random`` Dirichlet(1) points, with their kinds."""
    alphas = np.concatenate([np.eye(num_experts), np.full((1, num_experts), 1.0 / num_experts),
                             np.random.default_rng(seed).dirichlet(np.ones(num_experts), size=random)])
    return alphas, ["vertex"] * num_experts + ["uniform"] + ["random"] * random


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default="", help="base workdir (default: train one into --root)")
    ap.add_argument("--experts", default="", help="directory holding one workdir per domain")
    ap.add_argument("--root", default="results/mergemix_speed_runs", help="where the short runs are trained")
    ap.add_argument("--base-steps", type=int, default=30)
    ap.add_argument("--expert-steps", type=int, default=6)
    ap.add_argument("--max-batches", type=int, default=8, help="held-out batches per domain recorded")
    ap.add_argument("--ks", default="1,2,4,8", help="batch counts compared with --max-batches")
    ap.add_argument("--random", type=int, default=11, help="random Dirichlet(1) merges besides vertices and uniform")
    ap.add_argument("--merges-per-call", type=int, default=8)
    ap.add_argument("--boot", type=int, default=1000, help="bootstrap draws per k")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="results/mergemix_heldout_batches.json")
    args = ap.parse_args(argv)
    try:
        ks = sorted({int(k) for k in args.ks.split(",")})
    except ValueError:
        ap.error(f"--ks {args.ks!r}: a comma-separated list of batch counts, e.g. 1,2,4,8")
    if not ks or ks[0] < 1 or ks[-1] > args.max_batches:
        ap.error(f"--ks {args.ks!r}: every count must be between 1 and --max-batches ({args.max_batches})")
    if args.random < 0 or args.boot < 1 or args.merges_per_call < 1:
        ap.error("--random must be >= 0, --boot and --merges-per-call >= 1")

    import jax

    from data_mixture.mergemix.batched import BatchedScorer
    from data_mixture.mergemix.merge import MergeSet
    from experiments.benchmarks.mergemix_speed import train_runs
    from experiments.benchmarks.timing import machine, write_json
    from moejax.eval.evaluate import Evaluator, make_settings

    base, experts = args.base, args.experts
    if not base:
        base, experts = train_runs(args.root, args.base_steps, args.expert_steps)
    elif not experts:
        ap.error("--base needs --experts")
    uptime_before = os.popen("uptime").read().strip()
    merge_set = MergeSet.open(base, None, {d: (os.path.join(experts, d), None) for d in DOMAINS})
    settings = make_settings(merge_set.erun, tasks=[], loss_batches=args.max_batches)
    scorer = BatchedScorer(merge_set, Evaluator(merge_set.erun, settings, progress=False), capacity=args.merges_per_call)
    per_domain = {d: sum(1 for dd, *_ in scorer.heldout if dd == d) for d in DOMAINS}
    if min(per_domain.values()) < ks[-1]:
        raise SystemExit(f"held-out batches per domain {per_domain}: fewer than the largest --ks {ks[-1]}")
    batches = min(per_domain.values())
    alphas, kinds = merge_alphas(merge_set.num_experts, args.random, args.seed)
    c = args.merges_per_call
    print(f"{len(alphas)} merges, {batches} held-out batches per domain recorded, stacks of {c}; {uptime_before}",
          flush=True)

    # compile, then time the first stack at each k (the largest k's sums are that stack's record)
    stack = scorer.merge(alphas[:c])
    scorer.heldout_sums(stack, min(c, len(alphas)), batches=1)
    seconds, sums = {}, []
    for k in ks:
        start = time.perf_counter()
        got = scorer.heldout_sums(stack, min(c, len(alphas)), batches=k)
        seconds[k] = (time.perf_counter() - start) / min(c, len(alphas))
        print(f"k={k}: {seconds[k]:.2f} s per merge for the held-out losses (load {os.getloadavg()[0]:.1f})", flush=True)
    sums.append(got if ks[-1] == batches else scorer.heldout_sums(stack, min(c, len(alphas)), batches=batches))
    for s in range(c, len(alphas), c):
        part = alphas[s:s + c]
        sums.append(scorer.heldout_sums(scorer.merge(part), len(part), batches=batches))
    sums_mdb2 = np.concatenate([np.stack([got[d] for d in DOMAINS], axis=1) for got in sums])
    interior = np.array([kind != "vertex" for kind in kinds])
    tables = {"all": ranking_table(sums_mdb2, ks, args.boot, args.seed),
              "interior": ranking_table(sums_mdb2[interior], ks, args.boot, args.seed)}
    full_m = subset_mean_loss(sums_mdb2, np.tile(np.arange(batches), (len(DOMAINS), 1)))

    print(f"\n| merges | k | s/merge | x of {ks[-1]} | spearman | flip rate | largest flipped gap | regret "
          "| boot flip mean [p5, p95] | boot regret mean, p95 |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|---|")
    for name, table in tables.items():
        for k in ks:
            a = table[k]
            print(f"| {name} | {k} | {seconds[k]:.2f} | {seconds[k] / seconds[ks[-1]]:.2f} | {a['spearman']:.3f} | "
                  f"{a['flip_rate']:.3f} | {a['max_flipped_gap']:.4f} | {a['regret']:.4f} | {a['boot_flip_mean']:.3f} "
                  f"[{a['boot_flip_p5_p50_p95'][0]:.3f}, {a['boot_flip_p5_p50_p95'][2]:.3f}] | "
                  f"{a['boot_regret_mean']:.4f}, {a['boot_regret_p95']:.4f} |")
    print(f"mean loss over the {len(alphas)} merges at {batches} batches: min {full_m.min():.4f}, "
          f"max {full_m.max():.4f}; interior: min {full_m[interior].min():.4f}, max {full_m[interior].max():.4f}")
    payload = {
        "machine": {**machine(), "uptime_before": uptime_before, "uptime_after": os.popen("uptime").read().strip()},
        "base": os.path.abspath(base), "experts": os.path.abspath(experts), "jax_backend": jax.default_backend(),
        "batches_recorded": batches, "batch_shape": list(scorer.heldout[0][1]["inputs"].shape),
        "merges": [{"alpha": a.tolist(), "kind": kind, "mean_loss": float(m)} for a, kind, m in zip(alphas, kinds, full_m)],
        "sums_mdb2": sums_mdb2.tolist(), "domains": list(DOMAINS),
        "seconds_per_merge": {str(k): v for k, v in seconds.items()},
        "ranking": {name: {str(k): v for k, v in t.items()} for name, t in tables.items()},
        "boot_draws": args.boot,
    }
    write_json(args.out, payload)
    return payload


if __name__ == "__main__":
    main()
