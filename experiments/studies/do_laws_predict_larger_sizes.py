"""A small ladder of real moejax runs on the built-in corpus, for the data-mixture laws.

Model sizes x training mixtures over the built-in domains (code, prose, math, knowledge), each
trained for a short budget, evaluated at two checkpoints, and collected into one runs table
(``experiments/studies/results/ladder_runs.csv``, the format of docs/mixture/tables.md). It is the
moejax-produced table the leave-one-scale-out comparison of the laws is run on. The committed
table was made with (about 75 minutes of a 2-core machine shared with four other jobs for the
first 15 runs, 13 minutes for the last 6):

    nice -n 10 .venv/bin/python -m experiments.studies.do_laws_predict_larger_sizes --workdir runs/mixture_ladder \
        --sizes s1,s0,s0b --mixtures s1=5,s0=8,s0b=8 --bench-sizes s1 --order mixture \
        --out experiments/studies/results/ladder_runs.csv

Resumable: a run whose final checkpoint exists is not retrained, a checkpoint with an
``eval/step_N.json`` is not re-evaluated (``moejax.eval --all`` reuses it), so rerunning the same
command after an interruption continues where it stopped (and, once every run is done, only
collects). Progress goes to stdout and to ``WORKDIR/ladder.log``; each run's training and
evaluation output to ``WORKDIR/<run>.{train,eval}.log``.

Choices, all sized for a 2-core CPU shared with other jobs:

- sizes (``SIZES``): s0 54k, s0b 115k, s1 191k, s2 600k, s3 1.4M (the tiny default) and s4 3.1M
  active parameters (128k to 8.4M total), by width, depth and expert width, all MoE with 8
  experts top-2 plus a shared expert as the default. Under the machine's load (5 jobs on 2
  cores) one s1 run took 4-6 minutes, so the committed ladder stops at s1: the default size and
  above were out of reach in the time available;
- mixtures (``design_mixtures``): uniform, then points chosen greedily for the largest minimum
  distance (maximin) from 20,000 Dirichlet(1) draws inside per-domain bounds [0.05, 0.55] -- a
  space-filling design on the simplex, deterministic from the seed; a size with fewer mixtures
  trains the first ones of the same sequence. The two smaller sizes get 8 mixtures, so that the
  16 runs below the largest size can identify the parametric laws (13 parameters per domain for
  4 training domains; they need 15 runs);
- budget: ``--steps`` (140) steps of 16 x 128 tokens (2,048 tokens per step), checkpoints at half
  and at the end, so every run gives two rows (two token counts) of the table;
- evaluation: sizes in ``--bench-sizes`` with ``moejax.eval --all --max-items 32 --loss-batches
  4`` (held-out losses on 4 x 16 x 128 = 8,192 tokens per domain; 32 items per benchmark task);
  the others with the training loop's own held-out evaluation on the same 4 batches per domain
  (``train.eval_batches=4``, collected with ``--losses-from-log``), which skips a second process
  and its compilation per run (half of a small run's cost here) and gives no benchmark scores.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from data_mixture.plan import DEFAULT_PRESETS
from experiments.studies import EVAL_WINDOWS

DOMAINS = ("code", "prose", "math", "knowledge")

# name -> model overrides (everything else: the tiny default of moejax/config.py).
SIZES: dict[str, dict[str, int]] = {
    # two sizes below the planner's presets, for a ladder that fits in minutes on 2 CPU cores
    "s0": {"model.d_model": 32, "model.num_layers": 2, "model.num_heads": 1, "model.num_kv_heads": 1,
           "model.mlp_dim": 128, "model.moe.expert_dim": 64, "model.moe.shared_expert_dim": 64},
    "s0b": {"model.d_model": 48, "model.num_layers": 2, "model.num_heads": 2, "model.num_kv_heads": 1,
            "model.mlp_dim": 192, "model.moe.expert_dim": 96, "model.moe.shared_expert_dim": 96},
    # s3 is the tiny default: d_model 128, 4 layers, expert_dim 256
    **{name: DEFAULT_PRESETS[name] for name in ("s1", "s2", "s3", "s4")},
}


def design_mixtures(count: int, *, low: float = 0.05, high: float = 0.55, seed: int = 0,
                    candidates: int = 20_000) -> list[dict[str, float]]:
    """Uniform first, then greedy maximin picks among Dirichlet(1) draws inside [low, high]."""
    rng = np.random.default_rng(seed)
    pool_cm = rng.dirichlet(np.ones(len(DOMAINS)), size=candidates)
    pool_cm = pool_cm[np.all((pool_cm >= low) & (pool_cm <= high), axis=1)]
    chosen_km = [np.full(len(DOMAINS), 1.0 / len(DOMAINS))]
    while len(chosen_km) < count:
        dist_ck = np.linalg.norm(pool_cm[:, None, :] - np.asarray(chosen_km)[None], axis=-1)
        chosen_km.append(pool_cm[np.argmax(dist_ck.min(axis=1))])
    out = []
    for w_m in chosen_km:
        w_m = np.round(w_m, 3)
        w_m[-1] = round(1.0 - float(w_m[:-1].sum()), 3)  # rounded weights that sum to 1 exactly
        out.append({d: float(w) for d, w in zip(DOMAINS, w_m)})
    return out


def log(path: Path, message: str) -> None:
    line = f"{time.strftime('%H:%M:%S', time.gmtime())} {message}"
    print(line, flush=True)
    with open(path, "a") as f:
        f.write(line + "\n")


def run_logged(cmd: list[str], log_path: Path) -> None:
    with open(log_path, "a") as f:
        f.write(f"$ {' '.join(cmd)}\n")
        f.flush()
        proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT)
    if proc.returncode:
        raise RuntimeError(f"command failed with exit code {proc.returncode} (see {log_path}): {' '.join(cmd)}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", default="runs/mixture_ladder")
    parser.add_argument("--out", default="experiments/studies/results/ladder_runs.csv")
    parser.add_argument("--steps", type=int, default=140)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--mixtures", default="5",
                        help="mixtures per size: N for every size, or per size, e.g. s0=8,s1=8,s2=5 (the first N of "
                             "the same greedy design, so a size with fewer mixtures trains a subset)")
    parser.add_argument("--sizes", default=",".join(SIZES), help="comma-separated subset of " + ",".join(SIZES))
    parser.add_argument("--max-items", type=int, default=32)
    parser.add_argument("--bench-sizes", default="",
                        help="comma-separated sizes evaluated on the benchmarks too ('': every size); the others "
                             "get held-out losses only (evaluation is half of a small run's cost on 2 cores)")
    parser.add_argument("--loss-batches", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--order", choices=("size", "mixture"), default="size",
                        help="size: every mixture of one size, then the next size; mixture: mixture k at every "
                             "size, then k+1 (an interrupted ladder then has as many mixtures at each size)")
    args = parser.parse_args(argv)
    root = Path(args.workdir)
    root.mkdir(parents=True, exist_ok=True)
    ladder_log = root / "ladder.log"
    py = sys.executable
    sizes = [s for s in args.sizes.split(",") if s]
    unknown = [s for s in sizes if s not in SIZES]
    if unknown:
        parser.error(f"--sizes names {unknown}; known sizes: {', '.join(SIZES)}")
    try:
        if "=" in args.mixtures:
            per_size = {k.strip(): int(v) for k, v in (p.split("=") for p in args.mixtures.split(","))}
        else:
            per_size = {s: int(args.mixtures) for s in sizes}
    except ValueError:
        parser.error(f"--mixtures {args.mixtures!r}: expected N or SIZE=N,SIZE=N")
    missing = [s for s in sizes if s not in per_size]
    if missing:
        parser.error(f"--mixtures gives no count for size(s) {missing}")
    mixtures = design_mixtures(max(per_size[s] for s in sizes), seed=args.seed)
    (root / "design.json").write_text(json.dumps({"sizes": {s: SIZES[s] for s in sizes}, "mixtures": mixtures,
                                                  "args": vars(args)}, indent=1))
    half = args.steps // 2
    workdirs = []
    t_start = time.time()
    pairs = [(size, k) for size in sizes for k in range(per_size[size])]
    if args.order == "mixture":
        pairs.sort(key=lambda p: (p[1], sizes.index(p[0])))
    for size, k in pairs:
        mixture = mixtures[k]
        name = f"{size}_m{k}"
        bench = not args.bench_sizes or size in args.bench_sizes.split(",")
        wd = root / name
        workdirs.append(str(wd))
        final_ckpt = wd / "checkpoints" / str(args.steps)
        t0 = time.time()
        if not final_ckpt.exists():
            overrides = {
                "train.steps": args.steps, "train.global_batch_size": args.batch,
                "train.seq_len": args.seq_len, "train.eval_every": half, "train.log_every": 10,
                "checkpoint.every_steps": half, "checkpoint.max_to_keep": 4,
                "optim.warmup_steps": max(1, args.steps // 10), "train.seed": args.seed, **SIZES[size],
                **EVAL_WINDOWS,
            }
            if not bench:  # the training log's held-out losses are the evaluation (same batches)
                overrides["train.eval_batches"] = args.loss_batches
            cmd = [py, "-m", "moejax.main", "--config", "experiments/configs/tiny_moe.py", "--workdir", str(wd),
                   f"--config.data.mixture={json.dumps(mixture)}"]
            cmd += [f"--config.{key}={value}" for key, value in overrides.items()]
            log(ladder_log, f"train {name} {mixture}")
            run_logged(cmd, wd.parent / f"{name}.train.log")
        t1 = time.time()
        evals = [wd / "eval" / f"step_{s}.json" for s in (half, args.steps)]
        if bench and not all(p.exists() for p in evals):
            log(ladder_log, f"eval {name}")
            run_logged([py, "-m", "moejax.eval", "--workdir", str(wd), "--all", "--no-progress",
                        "--max-items", str(args.max_items), "--loss-batches", str(args.loss_batches)]
                       + ([] if bench else ["--tasks"]), wd.parent / f"{name}.eval.log")
        t2 = time.time()
        log(ladder_log, f"done {name}: train {t1 - t0:.0f}s eval {t2 - t1:.0f}s, total {t2 - t_start:.0f}s")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    run_logged([py, "-m", "data_mixture", "collect", *workdirs, "--out", str(out), "--losses-from-log"],
               root / "collect.log")
    log(ladder_log, f"wrote {out} ({time.time() - t_start:.0f}s)")


if __name__ == "__main__":
    main()
