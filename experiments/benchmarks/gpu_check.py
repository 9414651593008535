"""A GPU run in one command: its own jax[cuda12] environment, then the GPU benchmarks, one JSON and a table.

    ./launch.sh gpu-check [--out results/gpu_check.json] [--venv .venv-gpu]
    ./launch.sh gpu-check --smoke                          # the same steps, tiny, on CPU (in the test suite)

(``launch.sh`` runs this file with ``$MOEJAX_BASE_PYTHON``, default ``python3``, for the GPU run,
and with ./.venv's Python for ``--smoke``.)

Without ``--smoke`` (on a machine with an NVIDIA GPU and its driver; run from the repository):

1. Makes ``--venv`` (default ``.venv-gpu``) unless it exists, with the Python running this script,
   and installs moejax with its ``kernels`` extra (tokamax) and the pinned JAX for CUDA 12 into it:
   ``pip install -c constraints.txt -e ".[kernels]" "jax[cuda12]==<the jax pin of constraints.txt>"``
   (pip's ordinary client; the CUDA libraries come as pip wheels, nothing system-wide changes).
2. Re-runs itself in that environment, which checks that JAX sees a GPU (or stops, naming what
   it sees), then runs, each as its own process so that one failure leaves the others' results:

   - ``gpu_mfu``: MFU of bfloat16 train steps on one GPU (:mod:`.gpu_mfu`): a dense model and
     MoEs of 8, 64 and 128 experts of equal active FLOPs, each MoE through ``jax.lax.ragged_dot``
     and through tokamax; attention through ``jax.nn.dot_product_attention``;
   - ``llep``: LLEP against standard expert parallelism on the real devices (needs at least 2
     devices: on one GPU it is recorded as skipped);
   - ``peer_step``: the PyTorch peer's architecture (:mod:`.peer_arch`) as a moejax train step,
     dropless, capacity and the dense model of equal active FLOPs, interleaved (no torch here).

3. Writes one JSON (``--out``): every part's JSON, return code and last output lines, the
   machine (``nvidia-smi`` if present, JAX devices) and the host; prints one table of them.

``--smoke`` skips the environment and runs the same three parts at tiny sizes on this
environment's CPU (``gpu_mfu --smoke`` at 8 experts; ``llep`` on 8 fake CPU devices, small shapes,
one round; the peer step with 2 layers at a tiny batch, one round): a check that the command works end to end,
not a measurement.
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
    print(f"gpu_check: making {venv} with jax[cuda12]=={jax_pin()} and tokamax (pip; a few minutes)", flush=True)
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    subprocess.run([python, "-m", "pip", "install", "-c", "constraints.txt", "--upgrade", "pip"], check=True, cwd=REPO)
    subprocess.run(
        [python, "-m", "pip", "install", "-c", "constraints.txt", "-e", ".[kernels]", f"jax[cuda12]=={jax_pin()}"],
        check=True, cwd=REPO,
    )
    return python


def parts(smoke: bool, tmp: str) -> dict[str, list[str]]:
    """name -> command line (a module of experiments.benchmarks with its arguments)."""
    out = lambda name: ["--out", os.path.join(tmp, f"{name}.json")]
    if smoke:
        return {
            "gpu_mfu": ["-m", "experiments.benchmarks.gpu_mfu", "--smoke", "--steps", "1", "--experts", "8",
                        *out("gpu_mfu")],
            "llep": ["-m", "experiments.benchmarks.llep", "--rounds", "1", "--tokens", "256", "--seq", "32",
                     "--d-model", "16", "--expert-dim", "16", *out("llep")],
            "peer_step": ["-m", "experiments.benchmarks.gpu_check", "--peer-step", "--rounds", "1", "--smoke",
                          *out("peer_step")],
        }
    return {
        "gpu_mfu": ["-m", "experiments.benchmarks.gpu_mfu", *out("gpu_mfu")],
        "llep": ["-m", "experiments.benchmarks.llep", *out("llep")],
        "peer_step": ["-m", "experiments.benchmarks.gpu_check", "--peer-step", *out("peer_step")],
    }


def peer_step(rounds: int, out: str, smoke: bool = False) -> None:
    """The peer architecture's moejax train steps on this process's first device, interleaved
    (``smoke``: 2 layers, 2 sequences of 32 tokens)."""
    from experiments.benchmarks import peer_arch
    from experiments.benchmarks.peer import moejax_stepper
    from experiments.benchmarks.timing import interleaved, machine, write_json
    from moejax.model.transformer import flops_per_token

    def config(name):
        cfg = peer_arch.moejax_config("dropless", dense=True) if name == "dense" else peer_arch.moejax_config(name)
        if smoke:
            cfg.train.global_batch_size, cfg.train.seq_len = 2, 32
            cfg.model.num_layers = 2
            cfg.model.first_k_dense = min(cfg.model.first_k_dense, 2)
        return cfg

    fns = {name: moejax_stepper(config(name)) for name in ("dropless", "capacity", "dense")}
    secs = interleaved(fns, rounds, warmup=1 if smoke else 2)
    cfg = config("dropless")
    tokens = cfg.train.global_batch_size * cfg.train.seq_len
    flops = flops_per_token(cfg.model, cfg.train.seq_len) * tokens
    rows = [{"candidate": n, "step_s": s, "tokens_per_sec": tokens / s, "model_tflops": flops / s / 1e12,
             "ratio_to_dense": secs["dense"] / s} for n, s in secs.items()]
    for r in rows:
        print(f"{r['candidate']:9s} {r['step_s'] * 1e3:8.2f} ms  {r['tokens_per_sec']:9.0f} tokens/s  "
              f"x dense {r['ratio_to_dense']:.2f}")
    write_json(out, {"rows": rows, "rounds": rounds, "model_flops_per_step": flops, "machine": machine()})


def summary(report: dict) -> str:
    """One table of the parts' headline numbers (each part's JSON has the rest)."""
    lines = [f"gpu_check on {report['backend']} ({len(report['devices'])} device(s)){' [smoke]' if report['smoke'] else ''}",
             f"{'part':10s} {'candidate':16s} {'step ms':>9s} {'tokens/s':>11s} {'MFU / ratio':>12s}"]
    for name, entry in report["parts"].items():
        result = entry.get("result")
        if result is None:
            why = entry.get("skipped") or f"exit {entry.get('returncode')}: see output_tail"
            lines.append(f"{name:10s} {why}")
        elif name == "gpu_mfu":
            for variant, r in result["rows"].items():
                if "error" in r:
                    lines.append(f"{name:10s} {variant:16s} {r['error']}")
                else:
                    lines.append(f"{name:10s} {variant:16s} {r['step_time_s'] * 1e3:9.1f} {r['tokens_per_sec']:11,.0f} "
                                 f"{r['mfu']:11.1%} MFU")
        elif name == "llep":
            for what, value in result["targets"].items():
                lines.append(f"{name:10s} {what}: {value:.3f}")
        else:
            for r in result["rows"]:
                lines.append(f"{name:10s} {r['candidate']:16s} {r['step_s'] * 1e3:9.1f} {r['tokens_per_sec']:11,.0f} "
                             f"{r['ratio_to_dense']:8.2f} x dense")
    return "\n".join(lines)


def run_parts(smoke: bool, out: str) -> None:
    import jax

    from experiments.benchmarks.timing import write_json

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
    print(summary(report))
    write_json(out, report)
    failed = [n for n, e in report["parts"].items() if e.get("returncode", 0) != 0]
    if failed:
        raise SystemExit(f"gpu_check: error: {', '.join(failed)} failed; their output is in {out}")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="tiny sizes on this environment's CPU; no install")
    p.add_argument("--venv", default=".venv-gpu", help="the GPU environment (made if missing)")
    p.add_argument("--out", default="results/gpu_check.json")
    p.add_argument("--in-env", action="store_true", help=argparse.SUPPRESS)  # running inside --venv
    p.add_argument("--peer-step", action="store_true", help=argparse.SUPPRESS)  # one part, run by the others
    p.add_argument("--rounds", type=int, default=7, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    # A relative --out means what it means where the user ran launch.sh (it runs from the repository).
    args.out = os.path.join(os.environ.get("MOEJAX_CALLER_CWD", os.getcwd()), args.out)
    if args.peer_step:
        peer_step(args.rounds, args.out, args.smoke)
    elif args.smoke or args.in_env:
        run_parts(args.smoke, args.out)
    else:
        python = make_env(os.path.join(REPO, args.venv) if not os.path.isabs(args.venv) else args.venv)
        sys.exit(subprocess.run([python, "-m", "experiments.benchmarks.gpu_check", "--in-env", "--out", args.out],
                                cwd=REPO).returncode)


if __name__ == "__main__":
    if REPO not in sys.path:
        sys.path.insert(0, REPO)
    main()
