"""Step-time overhead of each balancing objective relative to ``none``, measured side by side.

    python -m experiments.benchmarks.balancing_overhead [--rounds 60] [--out results/balancing_overhead.json]
    python -m experiments.benchmarks.balancing_overhead --model front --only switch,global_batch,loss_free,phi,phi_bias

One process builds a train step per objective for the same model (``--model study``: the first
balancing study's, 16 experts top-2, d_model 128, 4 layers; ``--model front``: the front's, 32
experts top-4 + a shared expert; 16 x 256 tokens) and the same batches, compiles them all,
then times them interleaved step by step: each round runs one step of every objective, in an
order rotated from round to round, so the load of a shared machine hits all of them alike.
Reported: the median over rounds of the step time, its ratio to ``none`` (which still computes
the routing statistics every run logs), and the median of the per-round ratios (paired, the
more robust number). Compilation is excluded.
"""

from __future__ import annotations

import argparse
import time

import jax
import numpy as np

from experiments.benchmarks.timing import write_json
from experiments.studies.which_balancing_objective import front_config, study_config
from moejax import checks, sharding
from moejax.data.pipeline import make_train_iterator
from moejax.train.state import init_state, setup, to_global
from moejax.train.step import make_train_step

OBJECTIVES = {
    "none": (),
    "switch": (("switch", {"weight": 1e-2}),),
    "global_batch": (("global_batch", {"weight": 1e-2}),),
    "seq_aux": (("seq_aux", {"weight": 1e-4}),),
    "z_loss": (("z_loss", {"weight": 1e-3}),),
    "loss_free": (("loss_free", {"u": 1e-3}),),
    "phi": (("phi", {"alpha": 1e-2}),),
    "dpsl": (("dpsl", {"weight": 1e-3}),),
    "phi+z_loss": (("phi", {"alpha": 1e-2}), ("z_loss", {"weight": 1e-3})),
    # phi as a routing adjustment (docs/balancing.md, apply): the variants of the front
    "phi_loads": (("phi", {"alpha": 1e-2, "ema_of": "loads"}),),
    "phi_bias": (("phi", {"apply": "bias", "gamma": 1e-3}),),
    "phi_bias_price": (("phi", {"apply": "bias", "bias_form": "price", "gamma": 1e-1}),),
    "phi_both": (("phi", {"apply": "both", "alpha": 1e-2, "gamma": 1e-3}),),
}
MODELS = {"study": study_config, "front": front_config}


def build(objectives, batch_size: int, model: str):
    cfg = MODELS[model](objectives, steps=1000, batch=batch_size, seed=0)
    mesh = sharding.make_mesh(checks.validate(cfg, jax.device_count()))
    run = setup(cfg, mesh)
    return cfg, mesh, run, init_state(cfg, run), make_train_step(cfg, run)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=60, help="timed steps per objective, interleaved")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--model", choices=MODELS, default="study",
                   help="study: the first study's model; front: the front's (32 experts top-4 + shared)")
    p.add_argument("--only", default="", help="comma-separated subset of: " + ", ".join(OBJECTIVES))
    p.add_argument("--out", default="results/balancing_overhead.json")
    args = p.parse_args()
    names = [n for n in args.only.split(",") if n] or list(OBJECTIVES)
    if "none" not in names:
        names.insert(0, "none")

    unknown = [n for n in names if n not in OBJECTIVES]
    if unknown:
        p.error(f"--only: unknown objective(s) {unknown}; choose from {', '.join(OBJECTIVES)}")
    runs = {name: build(OBJECTIVES[name], args.batch, args.model) for name in names}
    cfg, mesh, run, _, _ = runs["none"]
    data = make_train_iterator(dict(cfg.data.mixture), seq_len=cfg.train.seq_len,
                               global_batch_size=cfg.train.global_batch_size, seed=0)
    batches = [to_global(next(data), run.batch_sharding(True), 1) for _ in range(4)]
    states = {name: r[3] for name, r in runs.items()}

    def timed(name: str, batch) -> float:
        start = time.perf_counter()
        states[name], metrics = runs[name][4](states[name], batch)
        jax.block_until_ready((states[name], metrics))
        return time.perf_counter() - start

    with jax.set_mesh(mesh):
        for name in names:  # compile and warm up
            for batch in batches:
                timed(name, batch)
        samples = {name: [] for name in names}
        for rnd in range(args.rounds):
            order = names[rnd % len(names):] + names[:rnd % len(names)]
            for name in order:
                samples[name].append(timed(name, batches[rnd % len(batches)]))

    base = float(np.median(samples["none"]))
    rows = []
    for name in names:
        med = float(np.median(samples[name]))
        q1, q3 = np.percentile(samples[name], [25, 75])
        # Paired ratios (same round): robust to drifts between rounds.
        paired = float(np.median(np.array(samples[name]) / np.array(samples["none"])))
        rows.append({"objectives": name, "median_step_s": med, "iqr_step_s": [float(q1), float(q3)],
                     "ratio_vs_none": med / base, "paired_ratio_vs_none": paired})
    print(f"{'objectives':<14} {'median step (ms)':>17} {'ratio vs none':>14} {'paired ratio':>13}")
    for r in rows:
        print(f"{r['objectives']:<14} {1e3 * r['median_step_s']:>17.1f} {r['ratio_vs_none']:>14.3f} "
              f"{r['paired_ratio_vs_none']:>13.3f}")
    write_json(args.out, {"backend": jax.default_backend(), "devices": jax.device_count(), "model": args.model,
                          "batch": [args.batch, 256], "rounds": args.rounds, "rows": rows}, indent=1)


if __name__ == "__main__":
    main()
