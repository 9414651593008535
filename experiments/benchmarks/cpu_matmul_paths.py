"""XLA:CPU's matmul paths side by side: the dense step, the MoE step (dropless, capacity) and the
grouped matmul alone, once per ``XLA_FLAGS`` option, interleaved over rounds, results checked.

    ./launch.sh python -m experiments.benchmarks.cpu_matmul_paths [--rounds 5] [--options default,eigen,...]
        [--out results/cpu_matmul_paths.json]
    ./launch.sh python -m experiments.benchmarks.cpu_matmul_paths --smoke     # tiny shapes, 1 round, seconds

XLA flags are read once per process, so every option (:data:`OPTIONS`) runs in its own child
process (this script with ``--child``). Each child builds and compiles the workloads once, runs
``--check-steps`` train steps from the same initial state on the same batch (the losses are the
numbers checked), then waits; the parent asks each child in turn for one timed round
(``--steps-per-round`` calls of each workload), the order of the options rotated every round, so a
load from other processes hits every option alike. Reported per option and workload: tokens/s
(grouped matmul: GFLOP/s of its 2 m d f flops), the median over rounds and the spread
((max - min) / median), the ratio to ``default``, the largest relative and absolute difference of the losses
(grouped matmul: of the output) from ``default``'s, and which kernels the compiled step uses
(the counts of ``ynn_fusion`` / ``xnn_fusion`` / ``onednn_fusion`` / plain ``dot`` ops in its
optimized HLO: an option that leaves them as ``default`` has them is a no-op here). An option
whose results differ from ``default``'s by more than ``--tolerance`` (relative; float
reassociation stays far below it) is marked ``out``; one whose child dies (some flags crash the
compiler or run instructions the CPU lacks) is listed as failed, with its exit status and the
end of its stderr (exit status -9 is a kill, usually the kernel's out-of-memory killer), and the
others go on. Every child keeps its compiled workloads alive: at the peer's shapes one holds about
3-6.5 GB, so a 24 GB host times about four options per run (``--options``; ``default`` is always
built, as the reference).

Workloads: the peer architecture of :mod:`experiments.benchmarks.peer_arch` (d 256, 4 layers,
16 experts top-2 of width 512, batch 16 x 256, float32, random tokens) as its dropless and
capacity MoE step and its dense step of equal active FLOPs, and the grouped matmul of one of its
MoE layers' up projections (``--gmm-impl``, random routing). ``--smoke``: every shape tiny.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from typing import IO

# name -> XLA_FLAGS. What jax/jaxlib 0.10.2 offers for XLA:CPU's dots (flags read from the
# jaxlib's own strings): by default the dots and the elementwise/reduce ops around them go to
# YNNPACK fusions; with those off a dot is Eigen's; oneDNN takes dots as its own fusions or as
# custom calls; XNNPACK is the older library path.
YNN_OFF = "--xla_cpu_experimental_ynn_fusion_type="
OPTIONS = {
    "default": "",
    "ynn_dot_only": "--xla_cpu_experimental_ynn_fusion_type=LIBRARY_FUSION_TYPE_DOT",
    "eigen": YNN_OFF,
    "xnnpack": f"{YNN_OFF} --xla_cpu_use_xnnpack=true --xla_cpu_experimental_xnn_fusion_type=LIBRARY_FUSION_TYPE_DOT",
    "xnn_graph": f"{YNN_OFF} --xla_cpu_use_xnnpack=true "
                 "--xla_cpu_experimental_xnn_graph_fusion_mode=XNN_GRAPH_FUSION_MODE_GREEDY",
    "onednn_fusion": f"{YNN_OFF} --xla_cpu_use_onednn=true --xla_cpu_experimental_onednn_fusion_type=LIBRARY_FUSION_TYPE_DOT",
    "onednn_custom_call": f"{YNN_OFF} --xla_cpu_use_onednn=true --xla_cpu_experimental_onednn_custom_call=true",
    "vector_width_512": "--xla_cpu_prefer_vector_width=512",
}
WORKLOADS = ("dense", "dropless", "capacity", "gmm")
_STDERR: dict[str, IO[str]] = {}  # each child's stderr, read back if it dies
KERNELS = {"ynn": r"%ynn_fusion", "xnn": r"%xnn_fusion", "onednn": r"onednn", "dot": r" dot\("}


def _configs(smoke: bool) -> dict:
    from experiments.benchmarks import peer_arch

    cfgs = {"dense": peer_arch.moejax_config("dropless", dense=True),
            "dropless": peer_arch.moejax_config("dropless"), "capacity": peer_arch.moejax_config("capacity")}
    if smoke:
        for c in cfgs.values():
            m = c.model
            m.d_model, m.num_layers, m.num_heads, m.num_kv_heads, m.head_dim, m.vocab_size = 32, 1, 2, 2, 16, 64
            m.moe.num_experts, m.moe.expert_dim, m.mlp_dim = 4, 16, 32
            c.train.global_batch_size, c.train.seq_len = 2, 16
        cfgs["dense"].model.first_k_dense = 1
    return cfgs


def _kernels(hlo: str) -> dict[str, int]:
    return {name: len(re.findall(pattern, hlo)) for name, pattern in KERNELS.items()}


def _step_workload(cfg, check_steps: int):
    """(call, tokens per call, losses of the first ``check_steps`` steps, kernel counts)."""
    import jax

    from experiments.benchmarks.profile_step import random_batch
    from moejax import checks, sharding
    from moejax.train.state import init_state, setup
    from moejax.train.step import make_train_step

    mesh = sharding.make_mesh(checks.validate(cfg, 1))
    run = setup(cfg, mesh)
    state = {"s": init_state(cfg, run)}
    step = make_train_step(cfg, run)
    batch = random_batch(cfg)
    with jax.set_mesh(mesh):
        hlo = step.lower(state["s"], batch).compile().as_text()
        losses = []
        for _ in range(check_steps):
            state["s"], metrics = step(state["s"], batch)
            losses.append(float(metrics["loss"]))

    def call():
        with jax.set_mesh(mesh):
            state["s"], metrics = step(state["s"], batch)
            jax.block_until_ready(metrics)

    return call, cfg.train.global_batch_size * cfg.train.seq_len, losses, _kernels(hlo or "")


def _gmm_workload(cfg, impl: str):
    """(call, flops per call, the output's float values (a sample), kernel counts)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from moejax.model.grouped_matmul import grouped_matmul

    m_cfg, t = cfg.model, cfg.train
    e, k, d, f = m_cfg.moe.num_experts, m_cfg.moe.experts_per_token, m_cfg.d_model, m_cfg.moe.expert_dim
    rows = t.global_batch_size * t.seq_len * k
    key_x, key_w = jax.random.split(jax.random.key(0))
    x_md = jax.random.normal(key_x, (rows, d), jnp.float32)
    w_edf = jax.random.normal(key_w, (e, d, f), jnp.float32) / d**0.5
    sizes_e = jnp.asarray(np.bincount(np.random.default_rng(0).integers(0, e, rows), minlength=e).astype(np.int32))
    fn = jax.jit(lambda x, w, gs: grouped_matmul(x, w, gs, impl=impl))
    hlo = fn.lower(x_md, w_edf, sizes_e).compile().as_text()
    out = np.asarray(fn(x_md, w_edf, sizes_e))
    sample = out.reshape(-1)[:: max(1, out.size // 4096)].tolist()
    return (lambda: jax.block_until_ready(fn(x_md, w_edf, sizes_e))), 2.0 * rows * d * f, sample, _kernels(hlo or "")


def child(args) -> None:
    """Build the workloads under this process's XLA_FLAGS, report the checks, then time one round
    per line read from stdin (``round``) until ``quit``."""
    cfgs = _configs(args.smoke)
    built = {name: _step_workload(cfgs[name], args.check_steps) for name in WORKLOADS if name != "gmm"}
    built["gmm"] = _gmm_workload(cfgs["dropless"], args.gmm_impl)
    for call, *_ in built.values():
        call()  # warm-up after the checks
    print(json.dumps({"checks": {n: b[2] for n, b in built.items()}, "kernels": {n: b[3] for n, b in built.items()},
                      "work": {n: b[1] for n, b in built.items()}}), flush=True)
    for line in sys.stdin:
        if line.strip() != "round":
            break
        secs = {}
        for name, (call, *_) in built.items():
            start = time.perf_counter()
            for _ in range(args.steps_per_round):
                call()
            secs[name] = (time.perf_counter() - start) / args.steps_per_round
        print(json.dumps({"secs": secs}), flush=True)


def _spawn(option: str, args) -> subprocess.Popen:
    env = {**os.environ, "XLA_FLAGS": " ".join(filter(None, [os.environ.get("XLA_FLAGS", ""), OPTIONS[option]]))}
    cmd = [sys.executable, "-m", "experiments.benchmarks.cpu_matmul_paths", "--child",
           "--check-steps", str(args.check_steps), "--steps-per-round", str(args.steps_per_round),
           "--gmm-impl", args.gmm_impl] + (["--smoke"] if args.smoke else [])
    err = _STDERR[option] = tempfile.TemporaryFile("w+")  # a file: a full pipe would block a chatty child
    return subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True)


def _read(proc: subprocess.Popen, option: str) -> dict:
    """The child's next report, or ``{"failed": ...}`` (exit status, last stderr lines) if it died."""
    line = proc.stdout.readline() if proc.stdout else ""
    if line:
        return json.loads(line)
    proc.wait(timeout=60)
    _STDERR[option].seek(0)
    err = _STDERR[option].read()
    tail = " | ".join(x.strip() for x in err.splitlines() if x.strip())[-400:]
    print(f"option {option!r} ({OPTIONS[option] or 'no flags'}) failed: exit status {proc.returncode}: {tail}",
          flush=True)
    return {"failed": {"exit_status": proc.returncode, "stderr_tail": tail}}


def _time_round(proc: subprocess.Popen, option: str) -> dict:
    """One timed round of a child, or ``{"failed": ...}`` if it died (before or during the round)."""
    try:
        proc.stdin.write("round\n")  # type: ignore[union-attr]
        proc.stdin.flush()  # type: ignore[union-attr]
    except BrokenPipeError:
        pass  # it died: _read reports how
    return _read(proc, option)


def _rel_diff(a: list[float], b: list[float]) -> float:
    scale = max(max(abs(x) for x in b), 1e-12)
    return max(abs(x - y) for x, y in zip(a, b)) / scale


def summarize(reports: dict[str, dict], secs: dict[str, dict[str, list[float]]], tolerance: float) -> list[dict]:
    """One row per (option, workload): median rate, spread, ratio to default, difference, kernels."""
    rows = []
    for option, report in reports.items():
        for name in WORKLOADS:
            samples = secs[option][name]
            med = statistics.median(samples)
            base = statistics.median(secs["default"][name])
            got, ref = report["checks"][name], reports["default"]["checks"][name]
            diff = _rel_diff(got, ref)
            rows.append({
                "option": option, "xla_flags": OPTIONS[option], "workload": name,
                "rate": report["work"][name] / med, "unit": "GFLOP/s" if name == "gmm" else "tokens/s",
                "median_s": med, "spread": (max(samples) - min(samples)) / med, "samples_s": samples,
                "ratio_to_default": base / med, "max_rel_diff_vs_default": diff, "out": diff > tolerance,
                "max_abs_diff_vs_default": max(abs(x - y) for x, y in zip(got, ref)),
                "kernels": report["kernels"][name],
            })
    return rows


def print_table(rows: list[dict]) -> None:
    print(f"{'option':20s} {'workload':9s} {'rate':>10s} {'unit':9s} {'spread':>7s} {'x default':>9s} "
          f"{'rel diff':>9s}  kernels (ynn/xnn/onednn/dot)")
    for r in rows:
        rate = r["rate"] / 1e9 if r["unit"] == "GFLOP/s" else r["rate"]
        k = r["kernels"]
        print(f"{r['option']:20s} {r['workload']:9s} {rate:10.1f} {r['unit']:9s} {r['spread']:7.1%} "
              f"{r['ratio_to_default']:9.2f} {r['max_rel_diff_vs_default']:9.1e}{' OUT' if r['out'] else '    '}  "
              f"{k['ynn']}/{k['xnn']}/{k['onednn']}/{k['dot']}")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--options", default=",".join(OPTIONS), help=f"comma-separated subset of: {', '.join(OPTIONS)}")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps-per-round", type=int, default=1, help="timed calls of each workload per round")
    p.add_argument("--check-steps", type=int, default=3, help="train steps whose losses are compared to default's")
    p.add_argument("--tolerance", type=float, default=1e-4, help="largest relative difference from default kept")
    p.add_argument("--gmm-impl", default="auto", help="model.moe.grouped_matmul of the grouped-matmul workload")
    p.add_argument("--smoke", action="store_true", help="tiny shapes, 1 round: checks the tool, measures nothing")
    p.add_argument("--out", default="results/cpu_matmul_paths.json")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return child(args)
    options = args.options.split(",")
    unknown = [o for o in options if o not in OPTIONS]
    if unknown:
        p.error(f"--options: {unknown[0]!r} is not one of {', '.join(OPTIONS)}")
    if "default" not in options:
        options.insert(0, "default")
    rounds = 1 if args.smoke else args.rounds
    if rounds < 1 or args.steps_per_round < 1 or args.check_steps < 1:
        p.error("--rounds, --steps-per-round and --check-steps must be at least 1")

    from experiments.benchmarks.timing import host, host_line, write_json

    before = host()
    print(f"host: {host_line(before)}", flush=True)
    procs = {}
    try:
        reports = {}
        for option in options:  # built one after another: compiles do not compete
            procs[option] = _spawn(option, args)
            reports[option] = _read(procs[option], option)
            if "failed" not in reports[option]:
                print(f"built {option}: kernels {reports[option]['kernels']}", flush=True)
        if "failed" in reports["default"]:
            raise SystemExit(f"the default option failed: {reports['default']['failed']}")
        failed = {o: r["failed"] for o, r in reports.items() if "failed" in r}  # grows if one dies while timed
        secs: dict[str, dict[str, list[float]]] = {o: {w: [] for w in WORKLOADS} for o in options}
        for rnd in range(rounds):
            for option in options[rnd % len(options):] + options[: rnd % len(options)]:
                if option in failed:
                    continue
                report = _time_round(procs[option], option)
                if "failed" in report:
                    if option == "default":
                        raise SystemExit(f"the default option died while timed: {report['failed']}")
                    failed[option] = {**report["failed"], "when": f"timed, round {rnd + 1}"}
                    continue
                for name, s in report["secs"].items():
                    secs[option][name].append(s)
            print(f"round {rnd + 1}/{rounds} done", flush=True)
        options = [o for o in options if o not in failed]
        reports = {o: reports[o] for o in options}
        secs = {o: secs[o] for o in options}
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.communicate("quit\n", timeout=60)
    rows = summarize(reports, secs, args.tolerance)
    print_table(rows)
    for option, why in failed.items():
        print(f"{option:20s} FAILED (exit status {why['exit_status']}): {why['stderr_tail'][-200:]}")
    write_json(args.out, {"rows": rows, "failed": failed, "rounds": rounds, "steps_per_round": args.steps_per_round,
                          "check_steps": args.check_steps, "tolerance": args.tolerance, "smoke": args.smoke,
                          "gmm_impl": args.gmm_impl, "host_before": before, "host": host()})


if __name__ == "__main__":
    main()
