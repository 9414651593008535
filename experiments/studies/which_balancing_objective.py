"""Balancing study: one small MoE trained with each balancing objective, same seed and data.

    python -m experiments.studies.which_balancing_objective   # the main comparison
    python -m experiments.studies.which_balancing_objective --runs phi_alpha0.03,phi_eta0.3 --steps 250
    python -m experiments.studies.which_balancing_objective --report-only   # rebuild table and plot from runs
    python -m experiments.studies.which_balancing_objective --front   # the loss-vs-MaxVio front of every method
    python -m experiments.studies.which_balancing_objective --front --methods phi_bias,loss_free --seeds 1
    python -m experiments.studies.which_balancing_objective --front --quick   # smoke: 2 strengths x 1 seed x 6 steps
    python -m experiments.studies.which_balancing_objective --front --only none,switch_weight0.1 --seeds 3
        # more seeds, some settings
    python -m experiments.studies.which_balancing_objective --front --shard 0/2 &
    python -m experiments.studies.which_balancing_objective --front --shard 1/2

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

``--front`` (``FRONT``, ``front_config``): every method (switch, global_batch, loss_free and the
phi variants: loss on probs, loss on loads, accumulated bias, price bias, loss + bias) at 4
strengths x 3 seeds, plus ``none``, on 32 experts top-4 + a shared expert, 1000 steps of 16 x 256
tokens; runs in ``OUT/front/runs/<method>_<key><value>_s<seed>``, seed-major (each finished seed
is a whole front), finished runs kept and their held-out numbers cached (``held_out.json``), an
interrupted run resumed; ``OUT/front/front.{md,json,png}``: mean, std and min-max over seeds of
held-out loss and held-out global MaxVio per (method, strength), and which mean points no other
method beats on both.
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np

from moejax.config import default_config
from experiments.studies import EVAL_WINDOWS
from moejax.log import add_verbosity_flags, setup_logging

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
    """Held-out loss, expert loads and drop rate (mean over batches and MoE layers; 0 unless the
    dispatch can drop) of the run's final checkpoint, routed as in training, on ``cfg``'s mesh and
    dispatch (which may differ from the run's: the checkpoint is resharded on restore)."""
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx

    from moejax import checks, sharding
    from moejax.data.corpus import DOMAINS
    from moejax.data.pipeline import make_eval_batches
    from moejax.train.checkpoint import Checkpointer
    from moejax.train.metrics import gini, max_vio
    from moejax.train.state import setup, to_global

    mesh = sharding.make_mesh(checks.validate(cfg, jax.device_count()))
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
        return jnp.sum(ce * batch["loss_mask"]), jnp.sum(batch["loss_mask"]), aux["load_le"], aux["drop_rate_l"]

    t = cfg.train
    batches = make_eval_batches(DOMAINS, seq_len=t.seq_len, batch_size=t.global_batch_size,
                                batches_per_domain=t.eval_batches, windows=EVAL_WINDOWS["train.eval_windows"])
    losses, load_le, drops = [], 0.0, []
    with jax.set_mesh(mesh):
        for domain_batches in batches.values():
            total = count = 0.0
            for batch in domain_batches:
                ce, n, load, drop_l = forward(state["params"], state["balance"],
                                              to_global(batch, run.batch_sharding(False), None))
                total, count, load_le = total + float(ce), count + float(n), load_le + np.asarray(load, np.float64)
                drops.append(float(np.mean(drop_l)))
            losses.append(total / count)
    return {"loss": float(np.mean(losses)), "max_vio": float(max_vio(load_le).max()), "gini": float(gini(load_le).mean()),
            "drop_rate": float(np.mean(drops))}


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


# ---- --front: each method's held-out loss vs imbalance front over its strength, several seeds ----

FRONT_SEEDS = (0, 1, 2)
FRONT_STEPS, FRONT_BATCH = 1000, 16  # 4.1M tokens: 4x the first study's 250 x 16 x 256


def _phi(**hparams):
    return lambda v: (("phi", {**hparams, **({"gamma": v} if "apply" in hparams else {"alpha": v})}),)


# method -> (the hyperparameter swept, its values, value -> objectives); every run adds Z.
FRONT = {
    "switch": ("weight", (3e-3, 1e-2, 3e-2, 1e-1), lambda v: (("switch", {"weight": v, "group_size": 4}),)),
    "global_batch": ("weight", (3e-3, 1e-2, 3e-2, 1e-1), lambda v: (("global_batch", {"weight": v}),)),
    "loss_free": ("u", (3e-4, 1e-3, 3e-3, 1e-2), lambda v: (("loss_free", {"u": v}),)),
    "phi_loss": ("alpha", (3e-3, 1e-2, 3e-2, 1e-1), _phi()),
    "phi_loss_loads": ("alpha", (3e-3, 1e-2, 3e-2, 1e-1), _phi(ema_of="loads")),
    "phi_bias": ("gamma", (1e-3, 3e-3, 1e-2, 3e-2), _phi(apply="bias")),
    "phi_bias_price": ("gamma", (1e-2, 3e-2, 1e-1, 3e-1), _phi(apply="bias", bias_form="price")),
    "phi_both": ("gamma", (1e-3, 3e-3, 1e-2, 3e-2), _phi(apply="both", alpha=1e-2)),
}


def front_config(objectives, steps: int, batch: int, seed: int):
    """32 fine-grained experts (width 32) top-4 plus one shared expert (width 128), d_model 64,
    2 MoE layers: the smallest model with the 32-expert top-4 routing, so that a 1000-step run
    fits a CPU. Fine-grained routing is where balance matters more than in the first study."""
    c = study_config(objectives, steps, batch, seed)
    c.train.log_every = max(1, min(10, steps // 3))
    m = c.model
    m.d_model, m.num_layers, m.num_heads, m.num_kv_heads, m.head_dim, m.mlp_dim = 64, 2, 4, 2, 16, 256
    m.moe.num_experts, m.moe.experts_per_token, m.moe.expert_dim = 32, 4, 32
    m.moe.num_shared_experts, m.moe.shared_expert_dim, m.moe.tile_size = 1, 128, 64
    return c


def front_runs(methods, strengths: int | None, seeds) -> list[tuple[str, str, float, int]]:
    """(run name, method, strength, seed), seed-major: every finished seed is a complete front."""
    out = []
    for seed in seeds:
        out.append((f"none_s{seed}", "none", float("nan"), seed))
        for method in methods:
            key, values, _ = FRONT[method]
            values = values if strengths is None else (values[0], values[-1])[:strengths]
            out += [(f"{method}_{key}{v:g}_s{seed}", method, v, seed) for v in values]
    return out


def front_objectives(method: str, value: float):
    return (Z,) if method == "none" else FRONT[method][2](value) + (Z,)


def finished(workdir: str, steps: int) -> bool:
    path = os.path.join(workdir, "metrics.jsonl")
    return os.path.exists(path) and any(r["step"] == steps and "eval_loss" in r for r in read_jsonl(path))


def front_point(name, method, value, seed, cfg, workdir: str, steps: int) -> dict:
    """One finished run's numbers; the held-out evaluation is cached in ``held_out.json``."""
    cache = os.path.join(workdir, "held_out.json")
    if os.path.exists(cache):
        with open(cache) as f:
            evaluation = json.load(f)
    else:
        evaluation = held_out(cfg, workdir)
        with open(cache, "w") as f:
            json.dump(evaluation, f)
    train_records = [r for r in read_jsonl(os.path.join(workdir, "metrics.jsonl")) if "max_vio" in r]
    return {
        "run": name, "method": method, "strength": value, "seed": seed,
        "objectives": [[n, h] for n, h in front_objectives(method, value)],
        "held_out_loss": evaluation["loss"], "held_out_max_vio": evaluation["max_vio"],
        "held_out_gini": evaluation["gini"], "train_max_vio_window": train_records[-1]["max_vio_global"],
        "step_time_s": float(np.median([r["step_time_s"] for r in train_records[1:] or train_records])),
    }


def front_summary(points: list[dict]) -> list[dict]:
    """Mean and seed spread per (method, strength), and whether the mean point is on the front
    (no other method's mean point has both a lower held-out loss and a lower MaxVio)."""
    groups: dict[tuple, list[dict]] = {}
    for p in points:
        groups.setdefault((p["method"], "nan" if p["method"] == "none" else p["strength"]), []).append(p)
    rows = []
    for (method, strength), ps in groups.items():
        loss, vio = np.array([p["held_out_loss"] for p in ps]), np.array([p["held_out_max_vio"] for p in ps])
        rows.append({
            "method": method, "strength": None if method == "none" else strength,
            "swept": FRONT[method][0] if method in FRONT else None, "seeds": [p["seed"] for p in ps],
            "loss_mean": float(loss.mean()), "loss_std": float(loss.std(ddof=1)) if len(ps) > 1 else 0.0,
            "loss_min": float(loss.min()), "loss_max": float(loss.max()),
            "max_vio_mean": float(vio.mean()), "max_vio_std": float(vio.std(ddof=1)) if len(ps) > 1 else 0.0,
            "max_vio_min": float(vio.min()), "max_vio_max": float(vio.max()),
            "step_time_s": float(np.median([p["step_time_s"] for p in ps])),
        })
    for r in rows:
        r["on_front"] = not any(o["method"] != r["method"] and o["loss_mean"] < r["loss_mean"]
                                and o["max_vio_mean"] < r["max_vio_mean"] for o in rows)
    return rows


def write_front(points: list[dict], out: str, steps: int, batch: int) -> None:
    rows = front_summary(points)
    head = (f"Balancing front: 32 experts (width 32) top-4 + 1 shared (width 128), d_model 64, 2 MoE layers, "
            f"{steps} steps of {batch} x 256 tokens; every objective + z-loss 1e-3; held-out loss (mean of 4 "
            f"domains) and held-out global MaxVio (max over layers), mean +- std over seeds [min, max].")
    lines = [head, "", "| method | strength | seeds | held-out loss | held-out MaxVio | step time (s) | on front |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        strength = "" if r["strength"] is None else f"{r['swept']}={r['strength']:g}"
        lines.append(
            f"| {r['method']} | {strength} | {len(r['seeds'])} | {r['loss_mean']:.4f} +- {r['loss_std']:.4f} "
            f"[{r['loss_min']:.4f}, {r['loss_max']:.4f}] | {r['max_vio_mean']:.3f} +- {r['max_vio_std']:.3f} "
            f"[{r['max_vio_min']:.3f}, {r['max_vio_max']:.3f}] | {r['step_time_s']:.3f} | {'yes' if r['on_front'] else ''} |")
    with open(os.path.join(out, "front.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(out, "front.json"), "w") as f:
        json.dump({"steps": steps, "global_batch_size": batch, "seq_len": 256, "summary": rows, "runs": points}, f, indent=1)
    print("\n".join(lines))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5.5))
    for method in ["none"] + list(FRONT):
        rs = sorted((r for r in rows if r["method"] == method), key=lambda r: r["strength"] or 0.0)
        if not rs:
            continue
        x, y = np.array([r["max_vio_mean"] for r in rs]), np.array([r["loss_mean"] for r in rs])
        xerr = np.array([[r["max_vio_mean"] - r["max_vio_min"], r["max_vio_max"] - r["max_vio_mean"]] for r in rs]).T
        yerr = np.array([[r["loss_mean"] - r["loss_min"], r["loss_max"] - r["loss_mean"]] for r in rs]).T
        style = dict(marker="*", markersize=12, color="k") if method == "none" else dict(marker="o", alpha=0.85)
        line = ax.errorbar(x, y, xerr=xerr, yerr=yerr, label=method, capsize=2, **style)
        if method != "none":
            ax.annotate(f"{rs[0]['strength']:g}", (x[0], y[0]), fontsize=6, color=line[0].get_color())
    ax.set_xscale("log")
    ax.set_xlabel("held-out global MaxVio (max over layers; bars: seed min-max)")
    ax.set_ylabel("held-out loss (nats/token; bars: seed min-max)")
    ax.set_title("loss vs imbalance as each method's strength varies (mean over seeds)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "front.png"), dpi=120)


def run_front(args, error) -> None:
    """``--front``: trains the missing runs of ``--methods`` x ``--seeds`` (``--only``: of those
    settings; finished ones are kept, an interrupted one resumes), then tabulates and plots every
    finished run of the front."""
    methods = [m for m in args.methods.split(",") if m]
    unknown = [m for m in methods if m not in FRONT]
    if unknown:
        error(f"--methods: unknown method(s) {unknown}; choose from {', '.join(FRONT)}")
    steps = args.steps if args.steps is not None else (6 if args.quick else FRONT_STEPS)
    seeds = FRONT_SEEDS[:1] if args.quick else FRONT_SEEDS[: args.seeds]
    out = os.path.join(args.out, "front_quick" if args.quick else "front")
    strengths = 2 if args.quick else None

    def config_of(method, v, seed):
        return front_config(front_objectives(method, v), steps, FRONT_BATCH, seed)

    runs = front_runs(methods, strengths, seeds)
    if args.only:
        only = {n for n in args.only.split(",") if n}
        known = {name.rsplit("_s", 1)[0] for name, *_ in runs}
        if only - known:
            error(f"--only: unknown setting(s) {sorted(only - known)} for --methods {args.methods}; "
                  f"choose from {', '.join(sorted(known))}")
        runs = [r for r in runs if r[0].rsplit("_s", 1)[0] in only]
    shard, shards = args.shard
    runs_dir = os.path.join(out, "runs")
    os.makedirs(runs_dir, exist_ok=True)
    configs = {name: config_of(method, v, seed) for name, method, v, seed in runs}  # all built (and validated) first
    from moejax import checks
    import jax

    for cfg in configs.values():
        checks.validate(cfg, jax.device_count())
    if not args.report_only:
        import time

        from moejax.train.loop import train

        mine = runs[shard::shards]
        todo = [r for r in mine if not finished(os.path.join(runs_dir, r[0]), steps)]
        print(f"front: {len(runs)} runs; shard {shard}/{shards}: {len(mine)} runs, {len(mine) - len(todo)} "
              f"finished, {len(todo)} to do", flush=True)
        for i, (name, *_rest) in enumerate(todo):
            start = time.time()
            print(f"=== [{i + 1}/{len(todo)}] {name}: {front_objectives(*_rest[:2])}", flush=True)
            train(configs[name], os.path.join(runs_dir, name))
            print(f"=== {name}: {time.time() - start:.1f} s wall", flush=True)
    # the report covers every finished run of the whole front, whatever --methods/--only trained
    every = front_runs(list(FRONT), strengths, FRONT_SEEDS)
    points = [front_point(name, method, v, seed, config_of(method, v, seed), os.path.join(runs_dir, name), steps)
              for name, method, v, seed in every if finished(os.path.join(runs_dir, name), steps)]
    write_front(points, out, steps, FRONT_BATCH)


def shard_arg(text: str) -> tuple[int, int]:
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected i/n, e.g. 0/2, got {text!r}") from None
    if not 0 <= i < n:
        raise argparse.ArgumentTypeError(f"expected 0 <= i < n, got {text!r}")
    return i, n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", default=",".join(MAIN), help=f"comma-separated, from: {', '.join(RUNS)}")
    p.add_argument("--steps", type=int, default=None, help="default: 250; --front: 1000 (--quick: 6)")
    p.add_argument("--batch", type=int, default=16, help="sequences of 256 tokens per step")
    p.add_argument("--seed", type=int, default=0, help="parameter init and data order")
    p.add_argument("--out", default="results/balancing_study")
    p.add_argument("--report-only", action="store_true", help="only tabulate runs already in OUT/runs")
    p.add_argument("--front", action="store_true",
                   help="the loss-vs-MaxVio front: each method over 4 strengths x 3 seeds (into OUT/front)")
    p.add_argument("--methods", default=",".join(FRONT), help=f"--front: comma-separated, from: {', '.join(FRONT)}")
    p.add_argument("--seeds", type=int, default=len(FRONT_SEEDS), choices=range(1, len(FRONT_SEEDS) + 1),
                   help="--front: how many of the seeds 0, 1, 2")
    p.add_argument("--only", default="",
                   help="--front: train only these settings (comma-separated run names without the seed, "
                        "e.g. none,switch_weight0.1), e.g. to add seeds to the best ones")
    p.add_argument("--quick", action="store_true",
                   help="--front smoke: 2 strengths x 1 seed x 6 steps per method (into OUT/front_quick)")
    p.add_argument("--shard", default="0/1", type=shard_arg,
                   help="--front: train only runs i, i+n, i+2n, ... of the list (i/n), so that n processes "
                        "(one per core) share the work; each tabulates every finished run")
    add_verbosity_flags(p)
    args = p.parse_args()
    setup_logging(args.verbosity)
    if args.quick and not args.front:
        p.error("--quick goes with --front")
    if args.front:
        run_front(args, p.error)
        return
    args.steps = 250 if args.steps is None else args.steps

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
