"""The train step as experts grow finer, at equal active parameters and FLOPs, against the dense model.

    ./launch.sh python -m experiments.benchmarks.expert_scaling [--rounds 3] [--backends dropless,capacity]
        [--grouped-matmul auto] [--out results/expert_scaling.json] [--plot results/expert_scaling.png]

The peer architecture of :mod:`experiments.benchmarks.peer_arch` (d 256, 4 layers, batch 16 x 256,
float32, one device, random tokens), with its MoE layers set to each of these shapes, every one of
them 1024 active expert units per token (top_k x expert width, plus the shared expert's width):

- ``8e top-1``: 8 experts of width 1024, top-1
- ``16e top-2``: 16 of width 512, top-2 (the peer's own shape)
- ``64e top-8``: 64 of width 128, top-8
- ``128e top-8``: 128 of width 128, top-8
- ``128e top-8 + shared``: 128 of width 112, top-8, plus one shared expert of width 128 (DeepSeek-style
  fine-grained experts with an always-on expert; 8 x 112 + 128 = 1024)

each with the dropless (with ``--grouped-matmul tiled,hybrid``: once per implementation, named
``dropless[tiled]`` and ``dropless[hybrid]``) and the capacity backend (factor 1.25), and ``dense``: every MoE layer replaced
by a SwiGLU of width 1024 (the same active FLOPs). Routed experts' parameters grow with E (the
optimizer's work too); the active matmul FLOPs do not.

Every candidate is compiled and warmed up, then one step of each is timed per round, interleaved,
and the median per candidate is kept. Reported: seconds per step, the ratio to ``dense`` and to
the ``8e top-1`` step of the same backend (the ratios are the result; absolute times move with the
machine's load, recorded before and after in ``machine_before`` / ``machine_after``). A PNG plot of
the ratios to dense goes to ``--plot``.
"""

from __future__ import annotations

import argparse
import os

import numpy as np

from experiments.benchmarks import peer_arch
from experiments.benchmarks.peer import moejax_stepper
from experiments.benchmarks.timing import machine, matmul_peak_flops, write_json
from moejax.schema import IMPLS

# name -> (routed experts, top-k, routed width, shared width)
SHAPES = {
    "8e top-1": (8, 1, 1024, 0),
    "16e top-2": (16, 2, 512, 0),
    "64e top-8": (64, 8, 128, 0),
    "128e top-8": (128, 8, 128, 0),
    "128e top-8 + shared": (128, 8, 112, 128),
}
ACTIVE = 1024


def shape_config(name: str, backend: str, impl: str = "auto"):
    """The peer architecture with MoE shape ``name`` (:data:`SHAPES`), or the dense model (``"dense"``);
    ``impl``: its ``model.moe.grouped_matmul``."""
    if name == "dense":
        return peer_arch.moejax_config("dropless", dense=True)
    experts, top_k, width, shared = SHAPES[name]
    assert top_k * width + shared == ACTIVE, name
    cfg = peer_arch.moejax_config(backend)
    moe = cfg.model.moe
    moe.num_experts, moe.experts_per_token, moe.expert_dim = experts, top_k, width
    moe.num_shared_experts, moe.shared_expert_dim = (1, shared) if shared else (0, 0)
    moe.grouped_matmul = impl
    return cfg


def timed(fns: dict, rounds: int, warmup: int) -> dict[str, list[float]]:
    """Seconds of every call per candidate, interleaved, the order rotated each round."""
    import time

    for fn in fns.values():
        for _ in range(warmup):
            fn()
    names = list(fns)
    samples: dict[str, list[float]] = {n: [] for n in names}
    for rnd in range(rounds):
        for name in names[rnd % len(names):] + names[:rnd % len(names)]:
            start = time.perf_counter()
            fns[name]()
            samples[name].append(time.perf_counter() - start)
    return samples


def plot(rows: list[dict], backends: list[str], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    names = list(SHAPES)
    for backend in backends:
        ratio = [next(r["ratio_to_dense"] for r in rows if r["shape"] == n and r["backend"] == backend) for n in names]
        ax.plot(range(len(names)), ratio, marker="o", label=backend)
    ax.axhline(1.0, color="grey", lw=1, ls="--", label="dense (equal active FLOPs)")
    ax.axhline(1.1, color="grey", lw=1, ls=":", label="target 1.1x dense")
    ax.set_xticks(range(len(names)), names, rotation=15)
    ax.set_ylabel("step time / dense step time")
    ax.set_title("Train step at 1024 active expert units per token (d 256, 4 layers, 16 x 256)")
    ax.legend()
    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1, help="untimed calls per candidate after its compile")
    p.add_argument("--backends", default="dropless,capacity")
    p.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated subset of the shapes")
    p.add_argument("--grouped-matmul", default="auto",
                   help="comma-separated model.moe.grouped_matmul values for the dropless steps (e.g. tiled,hybrid: "
                        "the implementations side by side in one run; backend names become dropless[impl])")
    p.add_argument("--out", default="results/expert_scaling.json")
    p.add_argument("--plot", default="results/expert_scaling.png")
    args = p.parse_args()
    impls = args.grouped_matmul.split(",")
    bad_impl = [i for i in impls if i not in IMPLS]
    if bad_impl:
        p.error(f"--grouped-matmul: {bad_impl[0]!r} is not one of {', '.join(IMPLS)}")
    # (label, backend, impl): one dropless candidate per implementation when several are given
    variants = [(f"{b}[{i}]" if b == "dropless" and len(impls) > 1 else b, b, i if b == "dropless" else "auto")
                for b in args.backends.split(",") for i in (impls if b == "dropless" else ["auto"])]
    backends = [label for label, _, _ in variants]
    shapes = args.shapes.split(",")
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown:
        p.error(f"--shapes: {unknown[0]!r} is not one of {', '.join(SHAPES)}")

    before, uptime_before = machine(), os.popen("uptime").read().strip()
    fns = {"dense": moejax_stepper(shape_config("dense", "dropless"))}
    for backend, base, impl in variants:
        for name in shapes:
            fns[f"{name} | {backend}"] = moejax_stepper(shape_config(name, base, impl))
            print(f"built {name} | {backend}", flush=True)
    samples = timed(fns, args.rounds, args.warmup)
    peak = matmul_peak_flops()
    med = {name: float(np.median(s)) for name, s in samples.items()}
    rows = [{"shape": "dense", "backend": "-", "step_s": med["dense"], "ratio_to_dense": 1.0,
             "ratio_to_8e": None, "samples_s": samples["dense"]}]
    print(f"matmul peak {peak / 1e9:.0f} GFLOP/s; dense step {med['dense']:.3f} s")
    print(f"{'shape':22s} {'backend':9s} {'s/step':>7s} {'x dense':>8s} {'x 8e top-1':>10s}")
    for backend in backends:
        for name in shapes:
            s = med[f"{name} | {backend}"]
            base = med.get(f"8e top-1 | {backend}")
            rows.append({"shape": name, "backend": backend, "step_s": s, "ratio_to_dense": s / med["dense"],
                         "ratio_to_8e": s / base if base else None, "samples_s": samples[f"{name} | {backend}"],
                         "experts": SHAPES[name][0], "top_k": SHAPES[name][1], "expert_dim": SHAPES[name][2],
                         "shared_dim": SHAPES[name][3]})
            r = rows[-1]
            print(f"{name:22s} {backend:9s} {s:7.3f} {r['ratio_to_dense']:8.2f} "
                  f"{r['ratio_to_8e'] if r['ratio_to_8e'] is not None else float('nan'):10.2f}")
    write_json(args.out, {"rows": rows, "rounds": args.rounds, "matmul_peak_flops": peak, "grouped_matmul": impls,
                          "machine_before": before, "machine_after": machine(),
                          "uptime_before": uptime_before, "uptime_after": os.popen("uptime").read().strip()})
    if args.plot and shapes == list(SHAPES):
        plot(rows, backends, args.plot)


if __name__ == "__main__":
    main()
