"""moejax against the PyTorch peer on the same architecture, batch and sequence, in one process.

    python -m experiments.benchmarks.peer [--rounds 7] [--out results/peer.json]

The peer is ``transformers.Qwen2MoeForCausalLM`` (PyTorch CPU, eager, SDPA attention, AdamW with
global-norm clipping) of :mod:`experiments.benchmarks.peer_arch`; moejax runs the same shapes as
its dropless and capacity MoE, and the dense model of equal active FLOPs. Random tokens, one
document per row. Every candidate is warmed up (moejax compiles), then one step of each is timed
per round, interleaved, and the median per candidate is kept; the ratios to the peer are the
result (absolute tokens/s move with the machine's load); ``range`` is the smallest and largest of
the per-round ratios (each round's peer step over the candidate's, kept in the JSON with every
step's seconds). The matmul peak is measured in the same process. Both frameworks use all the machine's cores (torch's intra-op threads = cores).
"""

from __future__ import annotations

import argparse
import os

import jax
import numpy as np

from experiments.benchmarks import peer_arch
from experiments.benchmarks.profile_step import random_batch
from experiments.benchmarks.timing import interleaved_times, machine, matmul_peak_flops, write_json
from moejax import checks, sharding
from moejax.model.transformer import flops_per_token
from moejax.train.state import init_state, setup
from moejax.train.step import make_train_step


def moejax_stepper(cfg):
    """A zero-argument callable that runs one (blocking) moejax train step on a fixed batch."""
    mesh = sharding.make_mesh(checks.validate(cfg, 1))
    run = setup(cfg, mesh)
    holder = {"state": init_state(cfg, run)}
    step = make_train_step(cfg, run)
    batch = random_batch(cfg)

    def call():
        with jax.set_mesh(mesh):
            holder["state"], metrics = step(holder["state"], batch)
            jax.block_until_ready(metrics)

    return call


def torch_stepper():
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    model, optimizer = peer_arch.torch_model()
    tokens = torch.from_numpy(
        np.random.default_rng(0).integers(0, peer_arch.VOCAB, size=(peer_arch.BATCH, peer_arch.SEQ))
    )
    return lambda: peer_arch.torch_step(model, optimizer, tokens).item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--candidates", default="dropless,capacity,dense")
    parser.add_argument("--out", default="results/peer.json")
    args = parser.parse_args()
    if jax.device_count() != 1:
        print(f"note: {jax.device_count()} JAX devices; the race uses one (a 1-device mesh)")

    fns = {"torch_qwen2moe": torch_stepper()}
    for name in args.candidates.split(","):
        cfg = peer_arch.moejax_config("dropless", dense=True) if name == "dense" else peer_arch.moejax_config(name)
        fns[f"moejax_{name}"] = moejax_stepper(cfg)
    times = interleaved_times(fns, args.rounds, warmup=2)
    secs = {name: float(np.median(ts)) for name, ts in times.items()}
    peer_t = np.array(times["torch_qwen2moe"])
    peak = matmul_peak_flops()
    tokens = peer_arch.BATCH * peer_arch.SEQ
    flops_step = flops_per_token(peer_arch.moejax_config().model, peer_arch.SEQ) * tokens
    rows = []
    print(f"peer architecture, batch {peer_arch.BATCH} x {peer_arch.SEQ}; matmul peak {peak / 1e9:.0f} GFLOP/s")
    print(f"{'candidate':18s} {'s/step':>8s} {'tokens/s':>9s} {'x peer':>7s} {'range':>11s} {'of peak':>8s}")
    for name, s in secs.items():
        by_round = peer_t / np.array(times[name])  # the peer's step over this one's, paired by round
        row = {"candidate": name, "step_s": s, "tokens_per_sec": tokens / s, "ratio_to_peer": secs["torch_qwen2moe"] / s,
               "ratio_by_round": by_round.tolist(), "ratio_range": [float(by_round.min()), float(by_round.max())],
               "secs": times[name], "fraction_of_matmul_peak": flops_step / s / peak}
        rows.append(row)
        print(f"{name:18s} {s:8.3f} {row['tokens_per_sec']:9.0f} {row['ratio_to_peer']:7.2f} "
              f"{by_round.min():5.2f}-{by_round.max():4.2f} {row['fraction_of_matmul_peak']:8.0%}")
    write_json(args.out, {"rows": rows, "matmul_peak_flops": peak, "model_flops_per_step": flops_step,
                          "rounds": args.rounds, "machine": machine()})


if __name__ == "__main__":
    main()
