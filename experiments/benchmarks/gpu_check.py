"""A GPU run in one command: its own jax[cuda12] environment, then the GPU benchmarks, one JSON.

    python3 experiments/benchmarks/gpu_check.py [--out results/gpu_check.json] [--venv .venv-gpu]
    .venv/bin/python experiments/benchmarks/gpu_check.py --smoke     # the same steps, tiny, on CPU

Without ``--smoke`` (on a machine with an NVIDIA GPU and its driver; run from the repository):

1. Makes ``--venv`` (default ``.venv-gpu``) unless it exists, with the Python running this script,
   and installs moejax with the pinned JAX for CUDA 12 into it:
   ``pip install -c constraints.txt -e . "jax[cuda12]==<the jax pin of constraints.txt>"``
   (pip's ordinary client; the CUDA libraries come as pip wheels, nothing system-wide changes).
2. Re-runs itself in that environment, which checks that JAX sees a GPU (or stops, naming what
   it sees), then runs, each as its own process so that one failure leaves the others' results:

   - ``gpu_mfu``: MFU of a 0.97B-total / 0.27B-active bfloat16 MoE train step, dropless through
     ``jax.lax.ragged_dot`` (``grouped_matmul=auto`` off CPU), attention through
     ``jax.nn.dot_product_attention`` (cuDNN's fused kernel where it applies);
   - ``llep``: LLEP against standard expert parallelism on the real devices (needs at least 2
     devices: on one GPU it is recorded as skipped);
   - ``peer_step``: the PyTorch peer's architecture (:mod:`.peer_arch`) as a moejax train step,
     dropless, capacity and the dense model of equal active FLOPs, interleaved (no torch here).

3. Writes one JSON (``--out``): every part's JSON, return code and last output lines, and the
   machine (``nvidia-smi`` if present, JAX devices).

``--smoke`` skips the environment and runs the same three parts at tiny sizes on this
environment's CPU (``gpu_mfu --smoke``; ``llep`` on 8 fake CPU devices, small shapes, one round;
the peer step, one round): a check that the command works end to end, not a measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def jax_pin() -> str:
    """The jax version pinned in constraints.txt."""
    with open(os.path.join(REPO, "constraints.txt")) as f:
        for line in f:
            m = re.match(r"^jax==(\S+)", line.strip())
            if m:
                return m.group(1)
    raise SystemExit("gpu_check: error: constraints.txt pins no jax version (a line jax==X.Y.Z)")


def make_env(venv: str) -> str:
    """The environment's python, made and filled with the pinned jax[cuda12] if it does not exist."""
    python = os.path.join(venv, "bin", "python")
    if os.path.exists(python):
        return python
    print(f"gpu_check: making {venv} with jax[cuda12]=={jax_pin()} (pip; a few minutes)", flush=True)
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    subprocess.run([python, "-m", "pip", "install", "--upgrade", "pip"], check=True)
    subprocess.run(
        [python, "-m", "pip", "install", "-c", "constraints.txt", "-e", ".", f"jax[cuda12]=={jax_pin()}"],
        check=True, cwd=REPO,
    )
    return python


def parts(smoke: bool, tmp: str) -> dict[str, list[str]]:
    """name -> command line (a module of experiments.benchmarks with its arguments)."""
    out = lambda name: ["--out", os.path.join(tmp, f"{name}.json")]
    if smoke:
        return {
            "gpu_mfu": ["-m", "experiments.benchmarks.gpu_mfu", "--smoke", "--steps", "2", *out("gpu_mfu")],
            "llep": ["-m", "experiments.benchmarks.llep", "--rounds", "1", "--tokens", "512", "--seq", "64",
                     "--d-model", "32", "--expert-dim", "32", *out("llep")],
            "peer_step": ["-m", "experiments.benchmarks.gpu_check", "--peer-step", "--rounds", "1", *out("peer_step")],
        }
    return {
        "gpu_mfu": ["-m", "experiments.benchmarks.gpu_mfu", *out("gpu_mfu")],
        "llep": ["-m", "experiments.benchmarks.llep", *out("llep")],
        "peer_step": ["-m", "experiments.benchmarks.gpu_check", "--peer-step", *out("peer_step")],
    }


def peer_step(rounds: int, out: str) -> None:
    """The peer architecture's moejax train steps on this process's first device, interleaved."""
    from experiments.benchmarks import peer_arch
    from experiments.benchmarks.peer import moejax_stepper
    from experiments.benchmarks.timing import interleaved, machine, write_json
    from moejax.model.transformer import flops_per_token

    fns = {name: moejax_stepper(peer_arch.moejax_config("dropless", dense=True) if name == "dense"
                                else peer_arch.moejax_config(name))
           for name in ("dropless", "capacity", "dense")}
    secs = interleaved(fns, rounds, warmup=2)
    tokens = peer_arch.BATCH * peer_arch.SEQ
    flops = flops_per_token(peer_arch.moejax_config().model, peer_arch.SEQ) * tokens
    rows = [{"candidate": n, "step_s": s, "tokens_per_sec": tokens / s, "model_tflops": flops / s / 1e12,
             "ratio_to_dense": secs["dense"] / s} for n, s in secs.items()]
    for r in rows:
        print(f"{r['candidate']:9s} {r['step_s'] * 1e3:8.2f} ms  {r['tokens_per_sec']:9.0f} tokens/s  "
              f"x dense {r['ratio_to_dense']:.2f}")
    write_json(out, {"rows": rows, "rounds": rounds, "model_flops_per_step": flops, "machine": machine()})


def run_parts(smoke: bool, out: str) -> None:
    import jax

    devices = [str(d) for d in jax.devices()]
    if not smoke and jax.default_backend() != "gpu":
        raise SystemExit(f"gpu_check: error: JAX sees no GPU in this environment ({jax.default_backend()}: "
                         f"{devices}). Check the driver (nvidia-smi) and the jax[cuda12] install, or run "
                         "with --smoke to check the command on CPU.")
    tmp = os.path.join(os.path.dirname(os.path.abspath(out)) or ".", "gpu_check_parts")
    os.makedirs(tmp, exist_ok=True)
    report = {"smoke": smoke, "backend": jax.default_backend(), "devices": devices, "parts": {}}
    if shutil.which("nvidia-smi"):
        report["nvidia_smi"] = subprocess.run(["nvidia-smi", "-q"], capture_output=True, text=True).stdout[-4000:]
    for name, argv in parts(smoke, tmp).items():
        if name == "llep" and not smoke and len(devices) < 2:
            report["parts"][name] = {"skipped": f"needs >= 2 devices for an expert axis; this machine has {len(devices)}"}
            print(f"gpu_check: {name}: skipped (one device)", flush=True)
            continue
        print(f"gpu_check: {name}: {' '.join(argv)}", flush=True)
        start = time.time()
        proc = subprocess.run([sys.executable, *argv], cwd=REPO, capture_output=True, text=True)
        entry = {"argv": argv, "returncode": proc.returncode, "seconds": time.time() - start,
                 "output_tail": (proc.stdout + proc.stderr)[-3000:]}
        path = argv[argv.index("--out") + 1]
        if proc.returncode == 0 and os.path.exists(path):
            with open(path) as f:
                entry["result"] = json.load(f)
        report["parts"][name] = entry
        print(f"gpu_check: {name}: exit {proc.returncode} in {entry['seconds']:.0f} s", flush=True)
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    with open(out, "w") as f:
        json.dump(report, f, indent=2)
    print(f"wrote {out}")
    failed = [n for n, e in report["parts"].items() if e.get("returncode", 0) != 0]
    if failed:
        raise SystemExit(f"gpu_check: error: {', '.join(failed)} failed; their output is in {out}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="tiny sizes on this environment's CPU; no install")
    p.add_argument("--venv", default=".venv-gpu", help="the GPU environment (made if missing)")
    p.add_argument("--out", default="results/gpu_check.json")
    p.add_argument("--in-env", action="store_true", help=argparse.SUPPRESS)  # running inside --venv
    p.add_argument("--peer-step", action="store_true", help=argparse.SUPPRESS)  # one part, run by the others
    p.add_argument("--rounds", type=int, default=7, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.peer_step:
        peer_step(args.rounds, args.out)
    elif args.smoke or args.in_env:
        run_parts(args.smoke, args.out)
    else:
        python = make_env(os.path.join(REPO, args.venv) if not os.path.isabs(args.venv) else args.venv)
        out = os.path.abspath(args.out)
        sys.exit(subprocess.run([python, "-m", "experiments.benchmarks.gpu_check", "--in-env", "--out", out],
                                cwd=REPO).returncode)


if __name__ == "__main__":
    if REPO not in sys.path:
        sys.path.insert(0, REPO)
    main()
