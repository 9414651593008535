"""Expert pruning that shrinks the checkpoint: which experts should go?

    python -m experiments.studies.which_experts_to_prune [--checkpoints tiny mid16 hf] [--max-items 32]

Three methods (:mod:`moejax.prune`: ``schur_astar``, ``step``, ``least_used``) at 25/50/75% of each
MoE layer's experts removed, on the same checkpoints:

- ``tiny``: the default tiny run (``experiments/configs/tiny_moe.py``, 8 experts top-2, 4 layers,
  400 steps), ``runs/tiny``;
- ``mid16``: the largest run the shared 2-core machine allowed next to it: the tiny config with 6
  layers and 16 experts of width 128 (400 steps), ``runs/mid16`` (small_moe itself, 100M
  parameters, does not train on these CPUs in the time there was);
- ``hf``: a random-init Hugging Face ``Qwen2MoeForCausalLM`` (8 experts top-2, shared expert with
  its gate, q/k/v biases) built with ``transformers``, imported with ``moejax.interop.hf``, then
  written as a moejax-data workdir by one training step at learning rate 1e-12 without weight
  decay (an update below float32 resolution: the parameters stay as imported, checked against the
  import in the study). It is **untrained**: its numbers check the pipeline only.

Stages, each skipped when its output exists (delete a file to redo it):

1. ``prune``: per checkpoint, calibration once (4096 training-split tokens), then per method and
   ratio the choice of experts (timed) and the pruned workdir under ``runs/prune_study/``
   (not committed). Each layer's reconstruction error of the pruned layer is measured on a second,
   independent draw of 2048 training-split tokens.
2. ``eval``: the unpruned checkpoint and every pruned one through ``moejax.eval``'s Evaluator
   (held-out loss per domain, the built-in benchmarks with ``gold_logprob``, tokens/s), and each
   held-out sequence's loss, for paired bootstrap intervals against least-used.
3. ``ablation`` (run with ``--checkpoints tiny --stages ablation``): Step's selection without its
   refit, and Schur-A*'s selection with Step's refit, evaluated the same way.
4. ``report``: ``results/which_experts_to_prune/{results.json,table.md,<ckpt>.png}``.

Intervals: 95% paired bootstrap over held-out sequences (2000 resamples) of the difference in
mean loss (nats/token) between a method and least-used at the same ratio. Pruning is
deterministic given the calibration sample, so seeds enter only through the calibration draw
(one draw here); the interval covers the evaluation sample, not the calibration sample.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402
from absl import logging as absl_logging  # noqa: E402

from moejax.eval.evaluate import Evaluator, make_settings, mean_score  # noqa: E402
from moejax.eval.restore import open_run  # noqa: E402
from moejax.log import setup_logging  # noqa: E402
from moejax.prune.calibration import collect  # noqa: E402
from moejax.prune.objectives import pruned_layer_error  # noqa: E402
from moejax.prune.prune import METHODS, Budget, choose  # noqa: E402
from moejax.prune.step import refit_down  # noqa: E402
from moejax.prune.write import write_pruned  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results", "which_experts_to_prune")
RUNS = "runs/prune_study"
RATIOS = (0.25, 0.5, 0.75)
CHECKPOINTS = {"tiny": "runs/tiny", "mid16": "runs/mid16", "hf": f"{RUNS}/hf_moejax"}
CALIB_TOKENS, ERROR_TOKENS = 4096, 2048


def _dump(path: str, value) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(value, f, indent=1)
    os.replace(path + ".tmp", path)


def _load(path: str):
    with open(path) as f:
        return json.load(f)


def build_hf_checkpoint() -> str:
    """The random-init Qwen2-MoE, imported and rewritten as a moejax-data workdir (untrained)."""
    workdir = CHECKPOINTS["hf"]
    if os.path.isdir(os.path.join(workdir, "checkpoints")):
        return workdir
    import torch
    import transformers

    from moejax.interop.hf import import_to_workdir

    hf_dir, imported = f"{RUNS}/hf_qwen2_moe", f"{RUNS}/hf_import"
    if not os.path.isfile(os.path.join(hf_dir, "config.json")):
        torch.manual_seed(0)
        config = transformers.Qwen2MoeConfig(
            vocab_size=272, hidden_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=512, moe_intermediate_size=128, shared_expert_intermediate_size=256, num_experts=8,
            num_experts_per_tok=2, norm_topk_prob=True, max_position_embeddings=256, initializer_range=0.02,
        )
        transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(hf_dir)
    if not os.path.isdir(imported):
        import_to_workdir(hf_dir, imported)
    # One step at learning rate 1e-12 without weight decay: an update far below float32 resolution
    # of the weights, so the parameters stay as imported, in a workdir on moejax's byte tokenizer
    # and data, which evaluation can read.
    subprocess.run([sys.executable, "-m", "moejax.main", "--config", f"{imported}/experiment.py", "--workdir",
                    workdir, "--config.train.steps=1", "--config.train.eval_every=1", "--config.optim.lr=1e-12",
                    "--config.optim.weight_decay=0.0", "--config.train.eval_windows=first"], check=True)
    return workdir


def import_drift(erun, ckpt) -> float:
    """Largest |parameter change| of the hf workdir against the imported checkpoint it started from."""
    from moejax.train.checkpoint import load_params

    imported, _ = load_params(f"{RUNS}/hf_import", erun.run.abstract_state["params"])
    pairs = zip(jax.tree.leaves(jax.device_get(ckpt.params)), jax.tree.leaves(jax.device_get(imported)))
    return float(max(np.max(np.abs(np.asarray(a) - np.asarray(b))) for a, b in pairs))


def prune_stage(name: str, workdir: str) -> None:
    record_path = os.path.join(RESULTS, name, "prune.json")
    if os.path.isfile(record_path):
        return
    erun = open_run(workdir)
    ckpt = erun.load()
    start = time.perf_counter()
    cal = collect(erun, ckpt, tokens=CALIB_TOKENS)
    calib_seconds = time.perf_counter() - start
    held = collect(erun, ckpt, tokens=ERROR_TOKENS, seed_offset=2)
    route = dict(top_k=cal.top_k, renormalize=cal.renormalize, scaling=cal.routed_scaling, score_func=cal.score_func)
    rows = []
    for ratio in RATIOS:
        for method in METHODS:
            out = f"{RUNS}/{name}/{method}_{int(ratio * 100)}"
            start = time.perf_counter()
            chosen = choose(cal, method, Budget(ratio=ratio))
            seconds = time.perf_counter() - start
            errors = []
            for data, keep, new in zip(held.layers, chosen["keep"], chosen["replaced"]):
                weights = None if new is None else {
                    "w_gate_edf": data.w_gate_edf, "w_up_edf": data.w_up_edf, "w_down_efd": new["w_down_efd"]}
                errors.append(pruned_layer_error(data, keep, weights=weights, **route))
            if os.path.isdir(out):  # a pruned workdir left by an interrupted stage: redo it
                shutil.rmtree(out)
            record = write_pruned(erun, ckpt, chosen["keep"], out, replaced=chosen["replaced"], record={
                "method": method, "ratio": ratio, "layers": chosen["layers"]})
            rows.append({
                "method": method, "ratio": ratio, "workdir": out, "keep": record["keep"],
                "choose_seconds": seconds, "prune_seconds": calib_seconds + seconds,
                "recon_error_heldout": errors, "recon_error_mean": float(np.mean(errors)),
                "objective": [info["objective"] for info in chosen["layers"]],
                "optimal": [info.get("optimal") for info in chosen["layers"]],
                "params": record["params_after"], "param_bytes": record["param_bytes_after"],
            })
            print(f"{name}: {method} {ratio:.2f} -> {record['experts_per_layer']}, recon {np.mean(errors):.4f}, "
                  f"{seconds:.1f} s", flush=True)
    base = {"params": record["params_before"], "param_bytes": record["param_bytes_before"]}
    if name == "hf":
        base["max_abs_change_vs_import"] = import_drift(erun, ckpt)
    _dump(record_path, {"workdir": workdir, "step": ckpt.step, "calib_tokens": cal.num_tokens,
                        "error_tokens": held.num_tokens, "calib_seconds": calib_seconds, "base": base, "rows": rows})


ABLATIONS = ("step_norefit", "schur_astar_refit")


def ablation_stage(name: str, workdir: str, max_items: int) -> None:
    """Step's two parts apart: its selection without the refit, and Schur-A*'s selection with it."""
    path = os.path.join(RESULTS, name, "ablation.json")
    if not os.path.isfile(path):
        erun = open_run(workdir)
        ckpt = erun.load()
        cal = collect(erun, ckpt, tokens=CALIB_TOKENS)
        held = collect(erun, ckpt, tokens=ERROR_TOKENS, seed_offset=2)
        route = dict(top_k=cal.top_k, renormalize=cal.renormalize, scaling=cal.routed_scaling,
                     score_func=cal.score_func)
        rows = []
        for ratio in RATIOS:
            for variant in ABLATIONS:
                base = "step" if variant == "step_norefit" else "schur_astar"
                keep = choose(cal, base, Budget(ratio=ratio))["keep"]
                replaced: list = [None] * len(keep)
                if variant == "schur_astar_refit":
                    replaced = [{"w_down_efd": refit_down(data, cal.loss_t, k, **route).w_down_efd}
                                for data, k in zip(cal.layers, keep)]
                errors = [pruned_layer_error(data, k, weights=None if new is None else {
                    "w_gate_edf": data.w_gate_edf, "w_up_edf": data.w_up_edf, "w_down_efd": new["w_down_efd"]},
                    **route) for data, k, new in zip(held.layers, keep, replaced)]
                out = f"{RUNS}/{name}/{variant}_{int(ratio * 100)}"
                if os.path.isdir(out):
                    shutil.rmtree(out)
                write_pruned(erun, ckpt, keep, out, replaced=replaced, record={"method": variant, "ratio": ratio})
                rows.append({"method": variant, "ratio": ratio, "workdir": out, "keep": [list(k) for k in keep],
                             "recon_error_mean": float(np.mean(errors))})
        _dump(path, {"rows": rows})
    for row in _load(path)["rows"]:
        tag = f"{row['method']}_{int(row['ratio'] * 100)}"
        evaluate_one(row["workdir"], os.path.join(RESULTS, name, "eval", f"{tag}.json"), max_items)
        print(f"{name}: evaluated {tag}", flush=True)


def ablation_lines(name: str) -> list[str]:
    path = os.path.join(RESULTS, name, "ablation.json")
    if not os.path.isfile(path):
        return []
    lines = [f"### {name}: Step's selection and refit apart (loss; recon err)", "",
             "| removed | step | step_norefit | schur_astar | schur_astar_refit | least_used |", "|---|---|---|---|---|---|"]
    recon = {f"{r['method']}_{int(r['ratio'] * 100)}": r["recon_error_mean"] for r in _load(path)["rows"]}
    record = _load(os.path.join(RESULTS, name, "prune.json"))
    recon.update({f"{r['method']}_{int(r['ratio'] * 100)}": r["recon_error_mean"] for r in record["rows"]})
    for ratio in RATIOS:
        tag = int(ratio * 100)
        cells = []
        for method in ("step", "step_norefit", "schur_astar", "schur_astar_refit", "least_used"):
            ev = _load(os.path.join(RESULTS, name, "eval", f"{method}_{tag}.json"))
            cells.append(f"{ev['losses']['loss_mean']:.4f}; {recon[f'{method}_{tag}']:.3f}")
        lines.append(f"| {tag}% | " + " | ".join(cells) + " |")
    lines.append("")
    for ratio in RATIOS:
        tag = int(ratio * 100)
        ev = lambda method: _load(os.path.join(RESULTS, name, "eval", f"{method}_{tag}.json"))  # noqa: E731
        a = paired_interval(ev("schur_astar_refit"), ev("step"))
        b = paired_interval(ev("step_norefit"), ev("schur_astar"))
        lines.append(f"- {tag}% removed: schur_astar_refit minus step {a[0]:+.4f} [{a[1]:+.4f}, {a[2]:+.4f}]; "
                     f"step_norefit minus schur_astar {b[0]:+.4f} [{b[1]:+.4f}, {b[2]:+.4f}]")
    return lines + [""]


def evaluate_one(workdir: str, path: str, max_items: int) -> dict:
    if os.path.isfile(path):
        return _load(path)
    erun = open_run(workdir)
    ckpt = erun.load()
    evaluator = Evaluator(erun, make_settings(erun, max_items=max_items), progress=False)
    result = evaluator.evaluate(ckpt)
    losses_b, tokens_b = [], []
    for batches in evaluator.eval_batches.values():
        for batch in batches:
            out = evaluator.scorer(ckpt.params, ckpt.balance, batch)
            losses_b.extend((-out["logprob_b"]).tolist())
            tokens_b.extend(out["tokens_b"].tolist())
    small = {
        "losses": result["losses"], "throughput": result["throughput"],
        "benchmarks": {k: {m: v.get(m) for m in ("kind", "accuracy", "exact_match", "gold_logprob", "items")}
                       for k, v in result["benchmarks"].items()},
        "benchmark_mean": mean_score(result["benchmarks"]),
        "gold_logprob_mean": float(np.mean([v["gold_logprob"] for v in result["benchmarks"].values()
                                            if v.get("gold_logprob") is not None])),
        "seq_loss": losses_b, "seq_tokens": tokens_b,
    }
    _dump(path, small)
    return small


def eval_stage(name: str, workdir: str, max_items: int) -> None:
    record = _load(os.path.join(RESULTS, name, "prune.json"))
    evaluate_one(workdir, os.path.join(RESULTS, name, "eval", "unpruned.json"), max_items)
    for row in record["rows"]:
        tag = f"{row['method']}_{int(row['ratio'] * 100)}"
        evaluate_one(row["workdir"], os.path.join(RESULTS, name, "eval", f"{tag}.json"), max_items)
        print(f"{name}: evaluated {tag}", flush=True)


def paired_interval(a: dict, b: dict, draws: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """Mean loss per token of a minus b, and its 95% paired bootstrap interval over sequences."""
    la, lb, t = (np.asarray(x, np.float64) for x in (a["seq_loss"], b["seq_loss"], a["seq_tokens"]))
    keep = t > 0
    la, lb, t = la[keep], lb[keep], t[keep]
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, t.size, (draws, t.size))
    diffs = (la[idx].sum(1) - lb[idx].sum(1)) / t[idx].sum(1)
    return float((la.sum() - lb.sum()) / t.sum()), float(np.quantile(diffs, 0.025)), float(np.quantile(diffs, 0.975))


def report_stage(names: list[str]) -> None:
    out: dict = {}
    lines = ["# Which experts to prune: results", "",
             "Generated by `python -m experiments.studies.which_experts_to_prune` (docs/pruning.md). loss: mean "
             "held-out loss (nats/token) over the four domains; intervals: 95% paired bootstrap over held-out "
             "sequences; bench: mean benchmark score; gold_logprob: mean over tasks of the gold answer's "
             "log-probability; recon err: mean over MoE layers of the pruned layer's relative reconstruction "
             "error on 2048 tokens pruning did not see; eval tok/s: measured on a 2-core machine shared with "
             "other jobs (noise, not a property of the method); prune s: calibration + choice, without writing.", ""]
    for name in names:
        record = _load(os.path.join(RESULTS, name, "prune.json"))
        base = _load(os.path.join(RESULTS, name, "eval", "unpruned.json"))
        evals = {f"{r['method']}_{int(r['ratio'] * 100)}": _load(os.path.join(
            RESULTS, name, "eval", f"{r['method']}_{int(r['ratio'] * 100)}.json")) for r in record["rows"]}
        domains = list(base["losses"]["domains"])
        lines += [f"## {name} ({record['workdir']}, step {record['step']}; calibration {record['calib_tokens']} "
                  f"tokens in {record['calib_seconds']:.1f} s)", "",
                  f"unpruned: loss {base['losses']['loss_mean']:.4f}, bench {base['benchmark_mean']:.3f}, "
                  f"gold_logprob {base['gold_logprob_mean']:.3f}, params {record['base']['params']:,} "
                  f"({record['base']['param_bytes'] / 2 ** 20:.2f} MiB), "
                  + (f"largest parameter change against the import {record['base']['max_abs_change_vs_import']:.1e}, "
                     if "max_abs_change_vs_import" in record["base"] else "") + "eval "
                  f"{base['throughput']['total']['tokens_per_sec']:.0f} tok/s", "",
                  "| removed | method | loss | d loss vs least_used [95% CI] | "
                  + " | ".join(domains) + " | bench | gold_logprob | recon err | optimal | params MiB | eval tok/s "
                  "| prune s |", "|" + "---|" * (11 + len(domains))]
        rows = []
        for r in record["rows"]:
            tag = f"{r['method']}_{int(r['ratio'] * 100)}"
            ev, ref = evals[tag], evals[f"least_used_{int(r['ratio'] * 100)}"]
            diff = paired_interval(ev, ref) if r["method"] != "least_used" else (0.0, 0.0, 0.0)
            row = {**{k: r[k] for k in ("method", "ratio", "recon_error_mean", "prune_seconds", "param_bytes",
                                          "params", "optimal")},
                   "loss": ev["losses"]["loss_mean"], "domains": {d: ev["losses"]["domains"][d]["loss"] for d in domains},
                   "bench": ev["benchmark_mean"], "gold_logprob": ev["gold_logprob_mean"],
                   "tokens_per_sec": ev["throughput"]["total"]["tokens_per_sec"], "d_loss_vs_least_used": diff}
            rows.append(row)
            optimal = "-" if r["method"] != "schur_astar" else ("all" if all(r["optimal"]) else "NO")
            ci = "-" if r["method"] == "least_used" else f"{diff[0]:+.4f} [{diff[1]:+.4f}, {diff[2]:+.4f}]"
            lines.append(
                f"| {int(r['ratio'] * 100)}% | {r['method']} | {row['loss']:.4f} | {ci} | "
                + " | ".join(f"{row['domains'][d]:.3f}" for d in domains)
                + f" | {row['bench']:.3f} | {row['gold_logprob']:.3f} | {row['recon_error_mean']:.4f} | {optimal} | "
                f"{r['param_bytes'] / 2 ** 20:.2f} | {row['tokens_per_sec']:.0f} | {r['prune_seconds']:.1f} |")
        lines.append("")
        for ratio in RATIOS:
            tag = int(ratio * 100)
            d = paired_interval(evals[f"step_{tag}"], evals[f"schur_astar_{tag}"])
            lines.append(f"- {tag}% removed: loss of step minus schur_astar {d[0]:+.4f} [{d[1]:+.4f}, {d[2]:+.4f}]")
            out.setdefault("step_minus_schur", {}).setdefault(name, {})[tag] = d
        lines.append("")
        out[name] = {"record": {k: v for k, v in record.items() if k != "rows"},
                     "unpruned": {"loss": base["losses"]["loss_mean"], "bench": base["benchmark_mean"],
                                  "gold_logprob": base["gold_logprob_mean"],
                                  "tokens_per_sec": base["throughput"]["total"]["tokens_per_sec"]},
                     "rows": rows}
        lines += ablation_lines(name)
        plot(name, out[name], os.path.join(RESULTS, f"{name}.png"))
    _dump(os.path.join(RESULTS, "results.json"), out)
    with open(os.path.join(RESULTS, "table.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


def plot(name: str, study: dict, path: str) -> None:
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for method in METHODS:
        rows = [r for r in study["rows"] if r["method"] == method]
        x = [0] + [100 * r["ratio"] for r in rows]
        axes[0].plot(x, [study["unpruned"]["loss"]] + [r["loss"] for r in rows], "o-", label=method)
        axes[1].plot(x, [study["unpruned"]["gold_logprob"]] + [r["gold_logprob"] for r in rows], "o-", label=method)
        axes[2].plot(x[1:], [r["recon_error_mean"] for r in rows], "o-", label=method)
    for ax, label in zip(axes, ("held-out loss (nats/token)", "benchmark gold_logprob (mean)",
                                "layer reconstruction error (relative)")):
        ax.set_xlabel("experts removed per MoE layer (%)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"pruning {name}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoints", nargs="+", default=list(CHECKPOINTS), choices=list(CHECKPOINTS))
    parser.add_argument("--max-items", type=int, default=32, help="items per benchmark task")
    parser.add_argument("--stages", nargs="+", default=["prune", "eval", "report"],
                        help="prune, eval, ablation (tiny: Step's selection and refit apart), report")
    args = parser.parse_args()
    setup_logging()
    absl_logging.set_verbosity(absl_logging.ERROR)
    for name in args.checkpoints:
        workdir = build_hf_checkpoint() if name == "hf" else CHECKPOINTS[name]
        if "prune" in args.stages:
            prune_stage(name, workdir)
        if "eval" in args.stages:
            eval_stage(name, workdir, args.max_items)
        if "ablation" in args.stages:
            ablation_stage(name, workdir, args.max_items)
    if "report" in args.stages:
        report_stage(args.checkpoints)


if __name__ == "__main__":
    main()
