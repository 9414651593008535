"""What the train-step speed targets ask of this machine, against what XLA:CPU reaches on it
(the targets: the default job in 3 minutes, 1.5x the PyTorch peer; experiments/benchmarks/LOG.md).

    ./launch.sh python -m experiments.benchmarks.ceiling [--rounds 7] [--peer-json results/peer.json]

For the tiny default and the PyTorch peer's architecture it times, interleaved in one process:

- the jitted 1024 x 1024 x 1024 float32 matmul: the peak the other benchmarks quote, and a hard
  bound (no step of F model FLOPs takes less than F / peak);
- ``flat SwiGLU``: one dense SwiGLU, forward + backward, over all of the step's routed rows
  ([B x T x top_k, d_model] through [d_model, expert_dim] x 2 and back): the step's experts with
  every expert merged into one matmul, no routing and no sort, the best case of any dispatch;
- the whole train step (dropless).

It prints each step's fraction of the peak now and the flat SwiGLU's, and the fraction of the
peak that each target needs, sustained over the whole step (attention, norms and optimizer
included): the default job in 180 s (its fixed costs, ``--job-fixed-s``, subtracted first) and
1.5x the peer (the torch step of the newest ``peer.py`` run, ``--peer-json``, when that file
exists). Writes JSON (``--out``).
"""

from __future__ import annotations

import argparse
import json
import os

import jax
import jax.numpy as jnp

from experiments.benchmarks import peer_arch
from experiments.benchmarks.peer import moejax_stepper
from experiments.benchmarks.timing import interleaved, machine, matmul_peak_flops, write_json
from moejax.config import default_config
from moejax.model.grouped_matmul import swiglu
from moejax.model.transformer import flops_per_token

DEFAULT_JOB_STEPS = 400
DEFAULT_JOB_TARGET_S = 180.0
PEER_TARGET_RATIO = 1.5


def flat_swiglu(cfg):
    """(zero-argument timed call, its FLOPs): one dense SwiGLU fwd+bwd over the step's routed rows."""
    m, t = cfg.model, cfg.train
    rows, d, f = t.global_batch_size * t.seq_len * m.moe.experts_per_token, m.d_model, m.moe.expert_dim
    keys = jax.random.split(jax.random.key(0), 4)
    x, wg, wu = (jax.random.normal(k, s) for k, s in zip(keys, ((rows, d), (d, f), (d, f))))
    wd = jax.random.normal(keys[3], (f, d))
    grad = jax.jit(jax.value_and_grad(lambda *a: jnp.sum(swiglu(*a)), argnums=(0, 1, 2, 3)))
    return (lambda: jax.block_until_ready(grad(x, wg, wu, wd))), 3 * 3 * 2.0 * rows * d * f


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--peer-json", default="results/peer.json")
    parser.add_argument("--job-fixed-s", type=float, default=34.0,
                        help="the default job's time outside its steps: start-up, corpus build and compilation "
                             "(side by side), evaluations, checkpoints (the whole job from an empty MOEJAX_CACHE "
                             "took 220 s at 7c670d8, 400 steps of 0.465 s: 34 s; 50 s before the steps compiled "
                             "alongside the corpus build)")
    parser.add_argument("--out", default="results/ceiling.json")
    args = parser.parse_args()

    configs = {"tiny": default_config(), "peer": peer_arch.moejax_config("dropless")}
    fns, flops = {}, {}
    for name, cfg in configs.items():
        fns[f"{name}/flat_swiglu"], flops[name] = flat_swiglu(cfg)
        fns[f"{name}/step"] = moejax_stepper(cfg)
    secs = interleaved(fns, args.rounds, warmup=2)
    peak = matmul_peak_flops()
    print(f"matmul peak (jitted 1024^3 float32, this process): {peak / 1e9:.0f} GFLOP/s")
    print(f"{'arch':6s} {'model GFLOP':>12s} {'step now':>9s} {'of peak':>8s} {'flat SwiGLU':>12s} {'of peak':>8s}")
    rows = {}
    for name, cfg in configs.items():
        t = cfg.train
        rate = flops[name] / secs[f"{name}/flat_swiglu"]
        step_flops = flops_per_token(cfg.model, t.seq_len) * t.global_batch_size * t.seq_len
        now = secs[f"{name}/step"]
        rows[name] = {"model_flops_per_step": step_flops, "step_s": now, "step_fraction_of_peak": step_flops / now / peak,
                      "flat_swiglu_flops_per_s": rate, "flat_swiglu_fraction_of_peak": rate / peak}
        print(f"{name:6s} {step_flops / 1e9:12.1f} {now:7.3f} s {step_flops / now / peak:8.0%} "
              f"{rate / 1e9:7.0f} GF/s {rate / peak:8.0%}")

    targets = {}
    tiny = rows["tiny"]
    step_budget = (DEFAULT_JOB_TARGET_S - args.job_fixed_s) / DEFAULT_JOB_STEPS
    targets["default_job"] = {"step_s_needed": step_budget,
                              "fraction_of_peak_needed": tiny["model_flops_per_step"] / step_budget / peak}
    print(f"default job in {DEFAULT_JOB_TARGET_S:.0f} s: {args.job_fixed_s:.0f} s fixed leaves {step_budget:.3f} s "
          f"per step = {targets['default_job']['fraction_of_peak_needed']:.0%} of the peak over the whole step "
          f"(now {tiny['step_fraction_of_peak']:.0%}; the flat SwiGLU alone {tiny['flat_swiglu_fraction_of_peak']:.0%})")
    if os.path.isfile(args.peer_json):
        with open(args.peer_json) as f:
            torch_s = next(r["step_s"] for r in json.load(f)["rows"] if r["candidate"].startswith("torch"))
        peer, need = rows["peer"], torch_s / PEER_TARGET_RATIO
        targets["peer"] = {"torch_step_s": torch_s, "step_s_needed": need, "source": args.peer_json,
                           "fraction_of_peak_needed": peer["model_flops_per_step"] / need / peak}
        print(f"{PEER_TARGET_RATIO}x the peer (torch {torch_s:.3f} s/step in {args.peer_json}): {need:.3f} s per step = "
              f"{targets['peer']['fraction_of_peak_needed']:.0%} of the peak over the whole step (now "
              f"{peer['step_fraction_of_peak']:.0%}; the flat SwiGLU alone {peer['flat_swiglu_fraction_of_peak']:.0%})")
    write_json(args.out, {"rows": rows, "targets": targets, "matmul_peak_flops": peak, "rounds": args.rounds,
                          "job_fixed_s": args.job_fixed_s, "machine": machine()})


if __name__ == "__main__":
    main()
