"""Balancing study: one small MoE trained with each balancing objective, same seed and data.

    python -m experiments.balancing_study                       # the main comparison
    python -m experiments.balancing_study --runs phi_alpha0.03,phi_eta0.3 --steps 250
    python -m experiments.balancing_study --report-only         # rebuild table and plot from runs

Model: d_model 128, 4 layers, 16 routed experts (width 128) top-2 plus one shared expert, on the
built-in corpus, 16 x 256 tokens per step, CPU-sized. Every objective is composed with the
router z-loss (1e-3). Runs go to ``OUT/runs/<name>`` (a finished run is not redone; rerunning
resumes an interrupted one); the table goes to ``OUT/table.md`` and ``OUT/table.json`` and the
MaxVio curves to ``OUT/max_vio.png``.

Columns, from the final checkpoint on the held-out batches (2 x 16 x 256 tokens per domain),
routed exactly as in training (selection biases included): held-out loss (mean over the four
domains), held-out MaxVio (global: loads counted over all held-out tokens, max over layers) and
Gini (mean over layers); from training: MaxVio over the last ~100 steps (the logged
``max_vio_global``) and batch MaxVio averaged over the last 50 steps; median step time (on a
shared machine: see experiments/benchmarks/balancing_overhead.py for overhead). ``switch`` uses groups of 4 sequences: the per-device Switch loss of a 4-way data-parallel
run (with the whole batch as its group it would equal ``global_batch``, as the step has one
micro-batch).
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np

from moejax.config import default_config

Z = ("z_loss", {"weight": 1e-3})
RUNS = {  # name -> balancing objectives
    "none": (Z,),
    "switch": (("switch", {"weight": 1e-2, "group_size": 4}), Z),
    "global_batch": (("global_batch", {"weight": 1e-2}), Z),
    "loss_free": (("loss_free", {"u": 1e-3}), Z),
    "phi": (("phi", {"alpha": 1e-2, "eta": 0.65}), Z),
    # Sensitivity of phi-balancing (run on request with --runs).
    "phi_alpha0.03": (("phi", {"alpha": 3e-2, "eta": 0.65}), Z),
    "phi_alpha0.1": (("phi", {"alpha": 1e-1, "eta": 0.65}), Z),
    "phi_eta0.3": (("phi", {"alpha": 1e-2, "eta": 0.3}), Z),
    "phi_eta0.9": (("phi", {"alpha": 1e-2, "eta": 0.9}), Z),
    "phi_sq_l2": (("phi", {"alpha": 1e-2, "potential": "sq_l2"}), Z),
    "switch_alpha0.03": (("switch", {"weight": 3e-2, "group_size": 4}), Z),
    "global_batch_alpha0.03": (("global_batch", {"weight": 3e-2}), Z),
    "loss_free_u0.003": (("loss_free", {"u": 3e-3}), Z),
}
MAIN = ("none", "switch", "global_batch", "loss_free", "phi")


def study_config(objectives, steps: int, batch: int, seed: int = 0):
    c = default_config()
    t = c.train
    t.steps, t.global_batch_size, t.seq_len, t.seed = steps, batch, 256, seed
    t.log_every, t.eval_every, t.eval_batches = 5, steps, 2
    c.checkpoint.every_steps = steps
    c.optim.warmup_steps = max(steps // 10, 1)
    m = c.model
    m.moe.num_experts, m.moe.experts_per_token, m.moe.expert_dim = 16, 2, 128
    m.moe.balancing = objectives
    return c


def read_jsonl(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f]


def held_out(cfg, workdir: str) -> dict:
    """Held-out loss and expert loads of the run's final checkpoint, routed as in training."""
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx

    from moejax import config as config_lib, sharding
    from moejax.data.corpus import DOMAINS
    from moejax.data.pipeline import make_eval_batches
    from moejax.train.checkpoint import Checkpointer
    from moejax.train.metrics import gini, max_vio
    from moejax.train.state import setup, to_global

    mesh = sharding.make_mesh(config_lib.validate(cfg, jax.device_count()))
    run = setup(cfg, mesh)
    checkpointer = Checkpointer(os.path.join(workdir, "checkpoints"), max_to_keep=cfg.checkpoint.max_to_keep)
    state = checkpointer.restore_latest(run.abstract_state).state
    checkpointer.close()

    @jax.jit
    def forward(params, balance, batch):
        model = nnx.merge(run.graphdef, params)
        logits, aux = model(batch["inputs"], batch["positions"], batch["segment_ids"],
                            balancer=run.balancer, balance_state=balance)
        ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"])
        return jnp.sum(ce * batch["loss_mask"]), jnp.sum(batch["loss_mask"]), aux["load_le"]

    t = cfg.train
    batches = make_eval_batches(DOMAINS, seq_len=t.seq_len, batch_size=t.global_batch_size,
                                batches_per_domain=t.eval_batches)
    losses, load_le = [], 0.0
    with jax.set_mesh(mesh):
        for domain_batches in batches.values():
            total = count = 0.0
            for batch in domain_batches:
                ce, n, load = forward(state["params"], state["balance"], to_global(batch, run.batch_sharding(False), None))
                total, count, load_le = total + float(ce), count + float(n), load_le + np.asarray(load, np.float64)
            losses.append(total / count)
    return {"loss": float(np.mean(losses)), "max_vio": float(max_vio(load_le).max()), "gini": float(gini(load_le).mean())}


def summarise(name: str, records: list[dict], steps: int, evaluation: dict) -> dict:
    train = [r for r in records if "max_vio" in r]
    last = [r for r in train if r["step"] > steps - 50]
    return {
        "run": name,
        "objectives": [[n, h] for n, h in RUNS.get(name, ())],
        "held_out_loss": evaluation["loss"],
        "held_out_max_vio": evaluation["max_vio"],
        "held_out_gini": evaluation["gini"],
        "train_max_vio_window": train[-1]["max_vio_global"],
        "batch_max_vio_last50": float(np.mean([r["max_vio"] for r in last])),
        "router_entropy": train[-1]["router_entropy"],
        "step_time_s": float(np.median([r["step_time_s"] for r in train[1:]])),
        "curve": {k: [r[k] for r in train] for k in ("step", "max_vio", "max_vio_global", "loss")},
    }


def write_report(rows: list[dict], out: str, steps: int, batch: int, seed: int) -> None:
    lines = [
        f"Balancing study: 16 experts top-2 (+1 shared), d_model 128, 4 layers, {steps} steps of "
        f"{batch} x 256 tokens, seed {seed}, every objective + z-loss 1e-3.",
        "",
        "| run | objectives | held-out loss | held-out MaxVio | held-out Gini | MaxVio, last ~100 steps "
        "| batch MaxVio, last 50 | step time (s) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        objectives = " + ".join(f"{n} {h}" for n, h in r["objectives"])
        lines.append(
            f"| {r['run']} | {objectives} | {r['held_out_loss']:.4f} | {r['held_out_max_vio']:.3f} | "
            f"{r['held_out_gini']:.3f} | {r['train_max_vio_window']:.3f} | {r['batch_max_vio_last50']:.3f} | "
            f"{r['step_time_s']:.3f} |"
        )
    with open(os.path.join(out, "table.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(out, "table.json"), "w") as f:
        json.dump({"steps": steps, "global_batch_size": batch, "seq_len": 256, "seed": seed, "runs": rows}, f, indent=1)
    print("\n".join(lines))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=False)
    for r in rows:
        curve = r["curve"]
        axes[0].plot(curve["step"], curve["max_vio"], label=r["run"], alpha=0.8)
        axes[1].plot(curve["step"], curve["max_vio_global"], label=r["run"], alpha=0.8)
    axes[0].set_title("batch MaxVio (max over layers)")
    axes[1].set_title("global MaxVio (~100-step window, max over layers)")
    for ax in axes:
        ax.set_xlabel("step")
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "max_vio.png"), dpi=120)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", default=",".join(MAIN), help=f"comma-separated, from: {', '.join(RUNS)}")
    p.add_argument("--steps", type=int, default=250)
    p.add_argument("--batch", type=int, default=16, help="sequences of 256 tokens per step")
    p.add_argument("--seed", type=int, default=0, help="parameter init and data order")
    p.add_argument("--out", default="results/balancing_study")
    p.add_argument("--report-only", action="store_true", help="only tabulate runs already in OUT/runs")
    args = p.parse_args()

    names = [n for n in args.runs.split(",") if n]
    unknown = [n for n in names if n not in RUNS]
    if unknown:
        p.error(f"unknown run(s) {unknown}; choose from {', '.join(RUNS)}")
    runs_dir = os.path.join(args.out, "runs")
    os.makedirs(runs_dir, exist_ok=True)
    if not args.report_only:
        from moejax.train.loop import train

        for name in names:
            print(f"=== {name}: {RUNS[name]}", flush=True)
            train(study_config(RUNS[name], args.steps, args.batch, args.seed), os.path.join(runs_dir, name))

    rows = []
    for name in RUNS:  # every finished run, in table order
        workdir = os.path.join(runs_dir, name)
        path = os.path.join(workdir, "metrics.jsonl")
        if os.path.exists(path):
            records = read_jsonl(path)
            if any(r["step"] == args.steps and "eval_loss" in r for r in records):
                cfg = study_config(RUNS[name], args.steps, args.batch, args.seed)
                rows.append(summarise(name, records, args.steps, held_out(cfg, workdir)))
    write_report(rows, args.out, args.steps, args.batch, args.seed)


if __name__ == "__main__":
    main()
