"""Peak host memory of the Hugging Face import and export on a synthetic multi-GB checkpoint.

    python -m experiments.benchmarks.hf_interop_memory [--layers 16] [--small-layers 4] \
        [--before-tree /tmp/hfbefore] [--cap-gb 10] [--out results/hf_interop_memory.json]

Builds a Mixtral-shaped bfloat16 checkpoint (d=1024, 8 experts of width 2816, vocab 32000;
``--layers`` 16 gives 2.45 GB) written as 1 GB shards with ``model.safetensors.index.json``, then
runs ``python -m moejax.interop.hf import`` and ``export`` in child processes and reads each
child's peak resident memory (``os.wait4``'s ``ru_maxrss``). ``--before-tree`` names a second
source tree (e.g. ``git archive main | tar -x -C /tmp/hfbefore``): its import and export run
on the same checkpoints, side by side. A smaller checkpoint (``--small-layers``) is measured
too, so the code before has a size it can finish.

A child is killed if its resident memory passes ``--cap-gb`` (checked every 50 ms; its address
space is limited to the cap plus 4 GB as a backstop), so a measurement never pushes the shared
machine into swapping or the OOM killer; a killed child is recorded as such, with the memory it
had reached. The floor (a child that imports moejax's interop and starts JAX, nothing more) is
measured too. The synthetic checkpoints and workdirs are deleted at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import ml_dtypes
import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
D, HEADS, KV, HEAD_DIM, EXPERTS, WIDTH, VOCAB = 1024, 16, 8, 64, 8, 2816, 32000


def hf_config(layers: int) -> dict:
    return {
        "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "vocab_size": VOCAB,
        "hidden_size": D, "intermediate_size": WIDTH, "num_hidden_layers": layers,
        "num_attention_heads": HEADS, "num_key_value_heads": KV, "head_dim": HEAD_DIM,
        "num_local_experts": EXPERTS, "num_experts_per_tok": 2, "rms_norm_eps": 1e-5, "rope_theta": 1e6,
        "tie_word_embeddings": False, "hidden_act": "silu", "sliding_window": None,
        "max_position_embeddings": 4096, "dtype": "bfloat16",
    }


def tensor_shapes(layers: int) -> dict[str, tuple[int, ...]]:
    shapes = {"model.embed_tokens.weight": (VOCAB, D), "model.norm.weight": (D,), "lm_head.weight": (VOCAB, D)}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (D,), p + "post_attention_layernorm.weight": (D,),
            p + "self_attn.q_proj.weight": (HEADS * HEAD_DIM, D), p + "self_attn.k_proj.weight": (KV * HEAD_DIM, D),
            p + "self_attn.v_proj.weight": (KV * HEAD_DIM, D), p + "self_attn.o_proj.weight": (D, HEADS * HEAD_DIM),
            p + "block_sparse_moe.gate.weight": (EXPERTS, D),
        })
        for j in range(EXPERTS):
            e = f"{p}block_sparse_moe.experts.{j}."
            shapes.update({e + "w1.weight": (WIDTH, D), e + "w3.weight": (WIDTH, D), e + "w2.weight": (D, WIDTH)})
    return shapes


def build_checkpoint(path: str, layers: int, shard_bytes: int = 10**9) -> dict:
    """A random bfloat16 Mixtral checkpoint in shards of at most ``shard_bytes`` (with an index)."""
    from safetensors.numpy import save_file

    os.makedirs(path)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(hf_config(layers), f, indent=2)
    rng = np.random.default_rng(0)
    shards, shard, size = [], {}, 0
    names = list(tensor_shapes(layers).items())
    groups: list[list[tuple[str, tuple[int, ...]]]] = [[]]
    for name, shape in names:
        nbytes = int(np.prod(shape)) * 2
        if groups[-1] and size + nbytes > shard_bytes:
            groups.append([])
            size = 0
        groups[-1].append((name, shape))
        size += nbytes
    weight_map = {}
    for k, group in enumerate(groups):
        file = f"model-{k + 1:05d}-of-{len(groups):05d}.safetensors"
        shard = {}
        for name, shape in group:
            value = rng.standard_normal(shape, np.float32) * (1.0 if name.endswith("norm.weight") else 0.02)
            shard[name] = value.astype(ml_dtypes.bfloat16)
            weight_map[name] = file
        save_file(shard, os.path.join(path, file), metadata={"format": "pt"})
        shards.append(file)
        del shard
    total = sum(int(np.prod(s)) * 2 for _, s in names)
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f)
    largest_group = layers * EXPERTS * D * WIDTH * 2  # one moejax parameter: [L, E, d, f] bfloat16
    largest_tensor = VOCAB * D * 2
    return {"layers": layers, "bytes": total, "shards": len(shards), "largest_group_bytes": largest_group,
            "largest_tensor_bytes": largest_tensor}


def run_child(argv: list[str], tree: str, cap_bytes: int) -> dict:
    """Runs ``argv`` with PYTHONPATH=tree; its peak RSS, wall time, exit status (killed past the cap)."""
    env = {**os.environ, "PYTHONPATH": tree, "JAX_PLATFORMS": "cpu"}
    env.pop("LD_PRELOAD", None)  # the default allocator, for both trees alike

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (cap_bytes + 4 * 2**30, cap_bytes + 4 * 2**30))

    start = time.time()
    proc = subprocess.Popen(argv, env=env, cwd=tree, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            preexec_fn=limit)
    killed, seen = [], [0]

    def watch():
        while proc.poll() is None:
            try:
                with open(f"/proc/{proc.pid}/status") as f:
                    rss = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS"))
            except (OSError, StopIteration):
                return
            seen[0] = max(seen[0], rss)
            if rss > cap_bytes:
                killed.append(rss)
                proc.kill()
                return
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    output = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    watcher.join()
    return {
        "argv": argv[2:], "peak_rss_bytes": usage.ru_maxrss * 1024, "seconds": round(time.time() - start, 1),
        "exit_code": proc.returncode, "killed_over_cap": bool(killed), "output_tail": output[-600:],
    }


def measure(label: str, tree: str, hf_dir: str, scratch: str, cap: int, shard_size: str) -> dict:
    python = sys.executable
    workdir, out = os.path.join(scratch, f"{label}_workdir"), os.path.join(scratch, f"{label}_export")
    result = {"import": run_child([python, "-m", "moejax.interop.hf", "import", "--hf-dir", hf_dir,
                                   "--workdir", workdir], tree, cap)}
    if result["import"]["exit_code"] == 0:
        export = [python, "-m", "moejax.interop.hf", "export", "--workdir", workdir, "--hf-dir", out]
        # before: --dtype bfloat16, else it writes float32 (its default then); after: the saved dtype
        export += ["--max-shard-size", shard_size] if label == "after" else ["--dtype", "bfloat16"]
        result["export"] = run_child(export, tree, cap)
        if result["export"]["exit_code"] == 0:
            result["export"]["files"] = sorted(os.listdir(out))
            result["export"]["same_tensors"] = same_tensors(hf_dir, out)
    else:
        result["export"] = {"skipped": "the import did not finish, so there is no workdir to export"}
    for path in (workdir, out):
        shutil.rmtree(path, ignore_errors=True)
    return result


def same_tensors(source: str, exported: str) -> bool:
    """Spot check: a few tensors of the export are bit-identical (and bfloat16) to the source's."""
    from safetensors import safe_open

    def where(directory: str) -> dict[str, str]:
        index = os.path.join(directory, "model.safetensors.index.json")
        if os.path.isfile(index):
            with open(index) as f:
                return {k: os.path.join(directory, v) for k, v in json.load(f)["weight_map"].items()}
        return {k: os.path.join(directory, "model.safetensors") for k in safe_open(
            os.path.join(directory, "model.safetensors"), "numpy").keys()}

    a, b = where(source), where(exported)
    if sorted(a) != sorted(b):
        return False
    for name in ("model.embed_tokens.weight", "model.layers.0.block_sparse_moe.experts.3.w2.weight",
                 "model.layers.0.self_attn.q_proj.weight"):
        with safe_open(a[name], "numpy") as fa, safe_open(b[name], "numpy") as fb:
            x, y = fa.get_tensor(name), fb.get_tensor(name)
            if x.dtype != y.dtype or not np.array_equal(x.view(np.uint16), y.view(np.uint16)):
                return False
    return True


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, default=16, help="layers of the large checkpoint (16: 2.45 GB)")
    p.add_argument("--small-layers", type=int, default=4, help="layers of the small checkpoint (0: skip it)")
    p.add_argument("--before-tree", default="", help="a source tree of the code before (e.g. main)")
    p.add_argument("--after-tree", default=REPO, help="the source tree measured as 'after'")
    p.add_argument("--cap-gb", type=float, default=10.0, help="kill a child whose resident memory passes this")
    p.add_argument("--max-shard-size", default="1GB", help="export shard size of the 'after' runs")
    p.add_argument("--scratch", default="", help="directory for the checkpoints (default: a temporary one)")
    p.add_argument("--out", default="results/hf_interop_memory.json")
    args = p.parse_args()
    cap = int(args.cap_gb * 2**30)
    scratch = tempfile.mkdtemp(prefix="hf_interop_memory.", dir=args.scratch or None)
    trees = {"after": args.after_tree, **({"before": args.before_tree} if args.before_tree else {})}
    report: dict = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "allocator": "glibc",
                                "load_avg": os.getloadavg()},
                    "cap_bytes": cap, "max_shard_size": args.max_shard_size, "trees": trees, "checkpoints": []}
    try:
        report["floor"] = {label: run_child([sys.executable, "-c", "import jax, moejax.interop.hf.workdir; "
                                             "jax.numpy.zeros(8).block_until_ready()"], tree, cap)
                           for label, tree in trees.items()}
        for layers in [n for n in (args.small_layers, args.layers) if n]:
            hf_dir = os.path.join(scratch, f"hf_{layers}")
            t = time.time()
            info = build_checkpoint(hf_dir, layers)
            info["build_seconds"] = round(time.time() - t, 1)
            for label, tree in trees.items():
                info[label] = measure(label, tree, hf_dir, scratch, cap, args.max_shard_size)
                print_row(info, label)
            shutil.rmtree(hf_dir)
            report["checkpoints"].append(info)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    from experiments.benchmarks.timing import write_json  # here: the children measure the import floor

    write_json(args.out, report, announce=False)
    print("floor (import jax + moejax.interop): " + ", ".join(
        f"{k} {v['peak_rss_bytes'] / 1e9:.2f} GB" for k, v in report["floor"].items()))
    print(f"wrote {args.out}")


def print_row(info: dict, label: str) -> None:
    gb = lambda n: f"{n / 1e9:.2f} GB"  # noqa: E731
    for step in ("import", "export"):
        r = info[label][step]
        if "skipped" in r:
            status = r["skipped"]
        else:
            status = (f"peak RSS {gb(r['peak_rss_bytes'])}, {r['seconds']} s, exit {r['exit_code']}"
                      + (" (killed: over the cap)" if r["killed_over_cap"] else "")
                      + (f", files {len(r.get('files', []))}, same tensors {r.get('same_tensors')}"
                         if step == "export" and r["exit_code"] == 0 else ""))
        print(f"{gb(info['bytes'])} checkpoint ({info['layers']} layers, largest group "
              f"{gb(info['largest_group_bytes'])}) {label:6s} {step}: {status}", flush=True)


if __name__ == "__main__":
    main()
