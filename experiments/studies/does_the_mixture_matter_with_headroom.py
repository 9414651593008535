"""The headroom study: where the mixture matters, does a law's pick beat uniform and the trivial choices?

    python -m experiments.studies.does_the_mixture_matter_with_headroom            # every stage; each skips what exists
    python -m experiments.studies.does_the_mixture_matter_with_headroom --stage pilot

The setting (chosen so that uniform is not the answer by construction):

- **Target**: not the training mix. Attempt 1 scored ``heldout_qa`` (the built-in held-out target
  set: questions about the knowledge domain's facts in forms no run trains on); attempt 2 the
  weighted set ``knowledge=0.6,math=0.2,prose=0.2``; attempt 3 ``knowledge=0.5,prose=0.5``;
  attempt 4 (the one that passed) ``knowledge=0.75,prose=0.25`` (``ATTEMPTS`` says why each changed).
- **A data-constrained domain**: ``knowledge`` has a pool of unique tokens; a mixture that upweights
  it repeats the pool. Attempts 1-2 gave every run the target run's repetition rate (``plan
  --match-repetition``: U x its tokens / the target's tokens); from attempt 3 every run trains on
  the data's own pool (``plan --unique-tokens`` alone), so a larger run repeats it more, as a real
  scarce source is repeated.
- **Sources compete for capacity**: four domains, one fixed token budget per run (20 tokens per
  active parameter; from attempt 4 the smallest size trains for 40, ``tokens_per_param_at``), from
  scratch.
- **From scratch, not mid-training.** The mid-training study continued a uniform base for 4
  tokens/param; its whole mid-training phase bought 0.0085 nats, so any mixture effect there is
  bounded by a small continuation. From scratch the mixture decides every token the model sees and
  the scarce pool is repeated from the first step, so repetition and capacity can both move the
  optimum; the pilot gate checks that this setting has headroom before any ladder run.

Stages (``--stage NAME`` runs one; results in ``--out``, run directories under ``--root``):

1. ``pilot``    the gate, written into ``pilot/attempt<k>/plan.json`` (and committed) before its runs:
                at the smallest and the largest size of the attempt, 4 deliberately different
                mixtures x seeds; go on only if the best mixture beats uniform by at least
                ``GATE_SD`` per-pair seed sd at both sizes AND the best mixture differs between
                them. Writes ``runs.csv``, ``gate.json``, ``gate.md`` per attempt.
2. ``ladder``   (only after a passing gate) the ladder plan: 12 space-filling mixtures at 3 proxy
                sizes, 2 seeds at the largest, every run on the data's own pool; ``data_mixture sweep``
                in committed chunks (``ladder/<k>.csv|log``); the merged runs table in ``--out``.
3. ``fit``      ``data_mixture evaluate`` for the target (largest proxy held out, laws and
                baselines incl. proportional and UniMax), each law fitted on the whole ladder for the
                target and its optimum at the target point with the target's pool.
4. ``mergemix`` experts continued from the gate's uniform run at the largest proxy (10% of its
                tokens), two searches (the target's losses; the benchmarks' gold log-probability),
                and the merges' ranking of the ladder's mixtures against the trivial rankers.
5. ``register`` ``data_mixture register``: the decision rule, the candidates (laws' optima,
                uniform, proportional, UniMax, best-at-proxy, rank-by-weight, MergeMix's two optima)
                and every law's predictions, before any target run; commit it.
6. ``target``   the candidates at the target size, 3 seeds each, in committed chunks
                (``target/<k>.csv|log``); refuses a registration that is not committed.
7. ``report``   ``data_mixture evaluate --registration`` on ladder + target runs, ``report.md``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr

from data_mixture.plan import fixed_pools, preset_sizes, proxy_pools
from experiments.studies import EVAL_WINDOWS
from moejax.log import add_verbosity_flags, setup_logging
from experiments.studies.do_laws_pick_midtrain_mixtures import PRESETS, dm

DOMAINS = ("code", "prose", "math", "knowledge")
TARGET_SET = "heldout_qa"  # the target: loss on the held-out QA set (no run trains on it)
QA_SKILLS = "knowledge=0.6,math=0.2,prose=0.2"  # a weighted target of what heldout_qa needs (attempt 2)
ENCYCLOPEDIA = "knowledge=0.5,prose=0.5"  # the world's facts in prose (attempt 3)
FACTS_IN_PROSE = "knowledge=0.75,prose=0.25"  # the same, weighted to the facts (attempt 4)
SCARCE = "knowledge"
# The ladder: the mid-training study's presets (s0 .. s2 span 10.3x in active parameters; s2 is the target).
TARGET = "s2"
PROXIES = ("s0", "s1", "s1b")
CONFIG = "experiments/configs/tiny_moe.py"
BATCH, SEQ_LEN = 16, 256
CHECKPOINTS = 2
EVAL_ARGS = "--max-items 128"
GATE_SD = 4.0  # the best mixture must beat uniform by this many per-pair seed sd at both sizes

# Gate attempts, each fixed here and written into its plan.json (committed) before its runs start.
ATTEMPTS = {
    1: {
        "sizes": ("s0", "s1"),
        "tokens_per_param": 10.0,
        "seeds": (0, 1),
        # the target's pool of the scarce domain; every run gets U x (its tokens / target tokens)
        "target_unique": {SCARCE: 300_000},
        "mixtures": {  # code, prose, math, knowledge
            "uniform": (0.25, 0.25, 0.25, 0.25),
            "prose_math": (0.05, 0.45, 0.40, 0.10),
            "qa_balanced": (0.0, 0.34, 0.33, 0.33),
            "knowledge_heavy": (0.05, 0.15, 0.15, 0.65),
        },
        "why": ("Attempt 1, sized to finish in one session on 2 shared cores (an s1 run at 20 tokens/param measured "
                "about 9 minutes under load 5-6, 2 runs at a time): the two smallest ladder sizes s0 and s1 (3.3x in "
                "active parameters), not s0 and the largest proxy s1b, and 10 tokens per active parameter (target "
                "included), not 20. A pass here is necessary, not sufficient: the gate is repeated at s0 and s1b at "
                "the ladder's budget before the ladder. The knowledge pool at the target is 300k tokens (6.0M target "
                "tokens): uniform repeats it 5 times, knowledge_heavy 13 times, prose_math 2."),
    },
    2: {
        "sizes": ("s0", "s1"),
        "tokens_per_param": 20.0,
        "seeds": (0, 1),
        "target": QA_SKILLS,
        "target_unique": {SCARCE: 600_000},
        "mixtures": {  # code, prose, math, knowledge
            "uniform": (0.25, 0.25, 0.25, 0.25),
            "prose_math": (0.05, 0.45, 0.40, 0.10),
            "qa_balanced": (0.0, 0.34, 0.33, 0.33),
            "knowledge_heavy": (0.05, 0.15, 0.15, 0.65),
        },
        "why": ("Attempt 2, after attempt 1 failed on seed noise: attempt 1's heldout_qa loss differed by 0.19 nats "
                "between the two seeds of uniform at s1 (its per-domain losses by 0.002-0.05), and at s0, after 142 "
                "steps, the best mixture beat uniform by 3.6 per-pair sd. Two changes: the target is the weighted "
                f"set {QA_SKILLS} (the three capabilities heldout_qa needs, weighted toward the facts, unlike every "
                "training mixture; heldout_qa is still collected and shown, not gated on), and the budget is the "
                "ladder's 20 tokens per active parameter (twice attempt 1's steps). Same sizes (s0, s1), mixtures "
                "and seeds; the knowledge pool at the target is 600k tokens of 12.0M, so every mixture repeats it "
                "as many times as in attempt 1 (uniform 5, knowledge_heavy 13, prose_math 2)."),
    },
    3: {
        "sizes": ("s0", "s1b"),
        "tokens_per_param": 20.0,
        "seeds": (0, 1, 2),
        "target": ENCYCLOPEDIA,
        "target_unique": {SCARCE: 250_000},
        "fixed_pool": True,
        "mixtures": {  # code, prose, math, knowledge
            "uniform": (0.25, 0.25, 0.25, 0.25),
            "knowledge_heavy": (0.0, 0.1, 0.0, 0.9),
            "even": (0.0, 0.5, 0.0, 0.5),
            "prose_heavy": (0.0, 0.9, 0.0, 0.1),
        },
        "why": ("Attempt 3, after attempt 2 found the same best mixture at both sizes. Read from attempts 1-2's "
                "per-domain losses (the failed gates' runs tables): from s0 to s1 the knowledge loss's return on "
                "its weight shrank (knowledge_heavy minus uniform 0.54 nats at s0, 0.14 at s1) while prose's grew "
                "(prose_math minus uniform 0.01 at s0, 0.08 at s1), and every pool was scaled to the run's tokens, "
                "which removes repetition as a reason for the optimum to move. Three changes: (1) the knowledge pool "
                "is the data's own, 250k unique tokens at every size (as a real scarce source is; about one "
                "description of each entity of the knowledge world), so a larger run repeats it more: "
                "knowledge_heavy 4.2 epochs at s0, 20 at s1b, 43 at the target; (2) the target is "
                f"{ENCYCLOPEDIA} (writing about the world's facts in the language of prose; no training mixture is "
                "its uniform), so one domain's return shrinks with size and the other's grows; (3) the gate is at "
                "the ladder's smallest and largest proxies (s0, s1b), with 3 seeds, and mixtures spread along the "
                "knowledge-prose edge (code and math only in uniform). heldout_qa is still collected, not gated on."),
    },
    4: {
        "sizes": ("s0", "s1b"),
        "tokens_per_param": 20.0,
        "tokens_per_param_at": {"s0": 40.0},
        "seeds": (10, 11, 12),
        "target": FACTS_IN_PROSE,
        "target_unique": {SCARCE: 250_000},
        "fixed_pool": True,
        "mixtures": {  # code, prose, math, knowledge
            "uniform": (0.25, 0.25, 0.25, 0.25),
            "knowledge_rich": (0.0, 0.15, 0.0, 0.85),
            "balanced": (0.0, 0.5, 0.0, 0.5),
        },
        "why": ("Attempt 4, after attempt 3 failed at s0 on seed noise (target sd 0.13-0.28 per mixture at 20 "
                "tokens/param: the s0 runs end in the middle of the knowledge domain's drop, which each seed reaches "
                "at another step); at s1b its best (even) beat uniform by 4.50 sd. Chosen from attempt 3's runs and "
                "an exploration at s0 (pilot/explore/, not a gate: 3 seeds each at 40 and 80 tokens/param and at lr "
                "1e-2). At 40 tokens/param the s0 seed sd is 0.05-0.09 (at lr 1e-2 no smaller; 13 held-out batches "
                "instead of 2 left it unchanged, so it is the models' spread, not the evaluation's); at 80 it is "
                "0.02-0.03, but the best mixture there is already the prose-rich one, as at s1b: in this corpus the "
                "optimum follows the training tokens (the knowledge pool's repetition) more than the model size. "
                "Quadratics through the 3 measured knowledge shares (0.1, 0.5, 0.9) of attempt 3's target put its "
                "optimum at a knowledge share of about 0.59 at s0 (40 tokens/param) and 0.44 at s1b. Changes: s0 "
                "trains for 40 tokens per active parameter (the ladder's s0 too; s1b and the target stay at 20); the "
                f"target weights the facts more, {FACTS_IN_PROSE}, which raises the gain over uniform at s0 against "
                "its noise (the same quadratics put this target's optimum at 0.72 at s0 and 0.60 at s1b); two "
                "mixtures on the knowledge-prose edge either side of both optima (knowledge 0.85 and 0.5) beside "
                "uniform, so that a move shows as a change of the best; fresh seeds (10, 11, 12), so no run of this "
                "attempt was seen before its plan. What those quadratics predict (extrapolations from 1-3 seeds, not "
                "measurements): s0 knowledge_rich best by about 0.07 over balanced and about 5 sd over uniform; s1b "
                "balanced best by about 0.04 and about 4 sd over uniform; a fail at either is plausible."),
    },
}


def sizes() -> dict[str, dict[str, float]]:
    return preset_sizes(PRESETS)


def tpp_of(a: dict, preset: str) -> float:
    """Tokens per active parameter of ``preset`` in the setting ``a`` (``tokens_per_param_at``
    overrides the study's budget for named sizes)."""
    return float(a.get("tokens_per_param_at", {}).get(preset, a["tokens_per_param"]))


def tokens_of(preset: str, tokens_per_param: float) -> tuple[int, float]:
    """(steps, tokens) of a from-scratch run of ``preset`` at ``tokens_per_param``."""
    steps = max(2, int(tokens_per_param * sizes()[preset]["params_active"] // (BATCH * SEQ_LEN)))
    return steps, float(steps * BATCH * SEQ_LEN)


def scratch_run(name: str, preset: str, steps: int, seed: int, mixture: dict[str, float]) -> dict:
    """One from-scratch plan entry in ``data_mixture sweep``'s format (as ``make_plan`` writes them)."""
    every = -(-steps // CHECKPOINTS)
    n = sizes()[preset]
    tokens = float(steps * BATCH * SEQ_LEN)
    overrides = {**PRESETS[preset], "train.steps": steps, "train.global_batch_size": BATCH, "train.seq_len": SEQ_LEN,
                 "checkpoint.every_steps": every, "train.eval_every": every, "train.seed": seed,
                 "optim.warmup_steps": max(1, steps // 10), "data.mixture": mixture}
    return {"name": name, "role": "scratch", "preset": preset, "config": CONFIG, "overrides": overrides,
            "mixture": mixture, "tokens": tokens, "steps": steps, "seed": seed,
            "params_total": n["params_total"], "params_active": n["params_active"],
            "flops": 6.0 * n["params_active"] * tokens}


def metric_name(target: str) -> str:
    """``loss:<domain>`` for one validation domain, ``target <text>`` for a weighted set."""
    from data_mixture.target import parse_target

    t = parse_target(target)
    return f"loss:{t.domain}" if t.domain != "target" else f"target {target}"


def pilot_plan(attempt: int) -> dict:
    """The gate attempt's plan: every (size, mixture, seed) run with the target's repetition rate,
    and the gate rule itself."""
    a = ATTEMPTS[attempt]
    _, target_tokens = tokens_of(TARGET, a["tokens_per_param"])
    fixed = a.get("fixed_pool", False)
    runs = []
    for preset in a["sizes"]:
        steps, _ = tokens_of(preset, tpp_of(a, preset))
        for name, w in a["mixtures"].items():
            for seed in a["seeds"]:
                run = scratch_run(f"{preset}_{name}_s{seed}", preset, steps, seed, dict(zip(DOMAINS, map(float, w))))
                runs.append(fixed_pools(run, a["target_unique"]) if fixed
                            else proxy_pools(run, a["target_unique"], target_tokens, SEQ_LEN))
    share = {name: w[DOMAINS.index(SCARCE)] for name, w in a["mixtures"].items()}
    epochs = {name: {SCARCE: share[name] * target_tokens / a["target_unique"][SCARCE]} for name in share}
    by_size = {"epochs_by_size": {p: {name: share[name] * tokens_of(p, tpp_of(a, p))[1]
                                      / a["target_unique"][SCARCE] for name in share} for p in a["sizes"]}} if fixed else {}
    return {
        "version": 1, "study": "headroom", "attempt": attempt, "setting": "from scratch",
        "target": {"set": a.get("target", TARGET_SET), "preset": TARGET, "tokens": target_tokens,
                   "unique_tokens": a["target_unique"], "match_repetition": not fixed},
        "epochs_of_scarce_domain": epochs, **by_size,
        "gate": {
            "metric": f"{metric_name(a.get('target', TARGET_SET))} at each run's final checkpoint",
            "rule": (f"At each gate size, best = the mixture with the lowest seed-mean target loss. Go on only if, at "
                     f"BOTH sizes, uniform's seed mean minus best's is at least {GATE_SD:g} per-pair seed sd "
                     "(sd_pair = sqrt((s_best^2 + s_uniform^2) / 2), s each mixture's own seed sd over its seeds), "
                     "AND the best mixture at the smallest size differs from the best at the largest size."),
            "gate_sd": GATE_SD, "sizes": list(a["sizes"]), "mixtures": list(a["mixtures"]), "seeds": list(a["seeds"]),
        },
        "why": a["why"], "runs": runs,
    }


def gate(runs_csv: str | Path, plan: dict) -> dict:
    """The gate of ``plan`` computed from a collected runs table (final checkpoint of every run)."""
    from data_mixture.decisions import seed_difference
    from data_mixture.table import read_runs

    from data_mixture.target import parse_target

    table = read_runs(str(runs_csv))
    text = plan["target"]["set"]
    metric = metric_name(text)
    loss_r = parse_target(text).values(table)
    by_name = {r["name"]: r for r in plan["runs"]}
    last = {}
    for i, run in enumerate(table.run):
        if run in by_name and (run not in last or table.tokens[i] > table.tokens[last[run]]):
            last[run] = i
    result: dict = {"metric": metric, "gate_sd": plan["gate"]["gate_sd"], "sizes": {}}
    for preset in plan["gate"]["sizes"]:
        cells = {}
        for name in plan["gate"]["mixtures"]:
            vals = [(int(by_name[r]["seed"]), float(loss_r[last[r]])) for r in by_name
                    if r in last and by_name[r]["preset"] == preset and r.rsplit("_s", 1)[0] == f"{preset}_{name}"]
            v = np.array([x for _, x in vals])
            cells[name] = {"seeds": [s for s, _ in sorted(vals)], "values": [x for _, x in sorted(vals)],
                           "mean": float(v.mean()) if v.size else None,
                           "sd": float(v.std(ddof=1)) if v.size >= 2 else None}
        done = {k: c for k, c in cells.items() if c["mean"] is not None}
        best = min(done, key=lambda k: done[k]["mean"]) if done else None
        row: dict = {"cells": cells, "best": best}
        if best and "uniform" in done and best != "uniform" and done[best]["sd"] is not None \
                and done["uniform"]["sd"] is not None:
            b, u = done[best], done["uniform"]
            sd_pair = float(np.sqrt((b["sd"] ** 2 + u["sd"] ** 2) / 2))
            diff = seed_difference(list(zip(u["seeds"], u["values"])), list(zip(b["seeds"], b["values"])))
            row.update(gain=u["mean"] - b["mean"], sd_pair=sd_pair,
                       gain_in_sd=(u["mean"] - b["mean"]) / sd_pair if sd_pair > 0 else float("inf"),
                       uniform_minus_best=diff)
        elif best == "uniform":
            row.update(gain=0.0, sd_pair=None, gain_in_sd=0.0)
        result["sizes"][preset] = row
    rows = list(result["sizes"].values())
    complete = all(c["mean"] is not None and c["sd"] is not None for r in rows for c in r["cells"].values())
    headroom = all((r.get("gain_in_sd") or 0.0) >= GATE_SD for r in rows)
    moves = len({r["best"] for r in rows}) == len(rows)
    result.update(complete=complete, headroom_at_every_size=headroom, best_moves=moves,
                  passed=bool(complete and headroom and moves))
    return result


def gate_md(plan: dict, g: dict) -> str:
    verdict = "PASS" if g["passed"] else ("FAIL" if g["complete"] else "INCOMPLETE (runs missing)")
    lines = [f"# Headroom gate, attempt {plan['attempt']}: **{verdict}**", "",
             f"Rule (plan.json, committed before the runs): {plan['gate']['rule']}", "",
             f"Setting: {plan['setting']}; target `{g['metric']}`; scarce pool at the target "
             f"{plan['target']['unique_tokens']} of {plan['target']['tokens']:.4g} tokens, "
             + ("every run's pool scaled to its tokens (the target's epochs at every size)."
                if plan["target"]["match_repetition"] else "the same pool at every size (a larger run repeats it more)."),
             "", plan["why"], ""]
    for preset, r in g["sizes"].items():
        lines += [f"## {preset}", "", "| mixture | knowledge epochs | seeds | target loss per seed | mean | sd |",
                  "|---|---|---|---|---|---|"]
        for name, c in r["cells"].items():
            ep = (plan["epochs_by_size"][preset][name] if "epochs_by_size" in plan
                  else plan["epochs_of_scarce_domain"][name][SCARCE])
            vals = ", ".join(f"{v:.4f}" for v in c["values"])
            mean = "" if c["mean"] is None else f"{c['mean']:.4f}"
            sd = "" if c["sd"] is None else f"{c['sd']:.4f}"
            lines.append(f"| {name} | {ep:.1f} | {len(c['values'])} | {vals} | {mean} | {sd} |")
        lines.append("")
        if r.get("sd_pair") is not None:
            d = r["uniform_minus_best"]
            iv = f"[{d['lo']:+.4f}, {d['hi']:+.4f}] ({d['method']})" if d["lo"] is not None else "(no interval)"
            lines.append(f"Best: **{r['best']}**; uniform - best = {r['gain']:+.4f} nats; per-pair seed sd "
                         f"{r['sd_pair']:.4f}; gain = **{r['gain_in_sd']:.2f} sd** (gate {GATE_SD:g}); 95% interval "
                         f"{iv}.")
        else:
            lines.append(f"Best: **{r['best']}** (gain over uniform {r.get('gain', 0.0):+.4f} nats).")
        lines.append("")
    lines += [f"- headroom (>= {GATE_SD:g} sd) at every size: **{g['headroom_at_every_size']}**",
              f"- best mixture differs between sizes: **{g['best_moves']}**",
              f"- all runs present: **{g['complete']}**", f"- gate: **{verdict}**"]
    return "\n".join(lines) + "\n"


def sweep(plan: Path, root: Path, parallel: int, eval_args: str = EVAL_ARGS) -> None:
    dm("sweep", "--plan", str(plan), "--root", str(root), "--parallel", str(parallel), "--eval-args", eval_args)


def sweep_in_chunks(plan_path: Path, root: Path, out: Path, name: str, parallel: int, chunk: int,
                    eval_args: str = EVAL_ARGS) -> Path:
    """``sweep`` of the plan ``chunk`` runs at a time, each chunk's runs table kept as
    ``out/<name>/<k>.csv`` (commit them as they land: a later session, on another machine, skips
    every chunk whose table exists) with its part of the sweep's log as ``<k>.log``; returns
    ``out/<name>_runs.csv``, all chunks' rows."""
    import csv

    plan = json.loads(plan_path.read_text())
    parts_dir = out / name
    parts_dir.mkdir(parents=True, exist_ok=True)
    parts = []
    for k in range(0, len(plan["runs"]), chunk):
        part = parts_dir / f"{k // chunk:02d}.csv"
        if not part.exists():
            sub = root / "chunks" / f"{name}_{k // chunk:02d}.json"
            sub.parent.mkdir(parents=True, exist_ok=True)
            sub.write_text(json.dumps({**plan, "runs": plan["runs"][k:k + chunk]}, indent=1))
            log = root / name / "sweep.log"
            start = log.stat().st_size if log.exists() else 0
            sweep(sub, root / name, parallel, eval_args)
            shutil.copyfile(root / name / "runs.csv", part)
            with log.open("rb") as f:  # this chunk's part of the sweep's log
                f.seek(start)
                part.with_suffix(".log").write_bytes(f.read())
            print(f"{name}: chunk {k // chunk} done ({part}); commit it", flush=True)
        parts.append(part)
    rows, fields = [], []
    for part in parts:
        with part.open(newline="") as f:
            reader = csv.DictReader(f)
            fields += [c for c in reader.fieldnames or () if c not in fields]
            rows += list(reader)
    if "seed" in fields:  # a chunk whose runs share one seed has no seed column: its runs' seeds are the plan's
        seed_of = {r["name"]: r.get("seed", 0) for r in plan["runs"]}
        for row in rows:
            row["seed"] = row.get("seed") or seed_of[row["run"]]
    merged = out / f"{name}_runs.csv"
    with merged.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    return merged


def attempt_dir(out: Path, attempt: int) -> Path:
    return out / "pilot" / f"attempt{attempt}"


def write_pilot_plan(out: Path, attempt: int) -> Path:
    """Writes the attempt's plan.json (kept when it exists: the committed plan is the registration)."""
    d = attempt_dir(out, attempt)
    d.mkdir(parents=True, exist_ok=True)
    path = d / "plan.json"
    if path.exists():
        if json.loads(path.read_text()) != json.loads(json.dumps(pilot_plan(attempt))):
            raise SystemExit(f"{path} differs from ATTEMPTS[{attempt}]: a committed gate plan is not edited; "
                             "add a new attempt instead.")
        return path
    path.write_text(json.dumps(pilot_plan(attempt), indent=1))
    print(f"pilot: wrote {path} ({len(pilot_plan(attempt)['runs'])} runs); commit it before running the attempt")
    return path


def stage_pilot(out: Path, root: Path, parallel: int, attempt: int, plan_only: bool) -> dict | None:
    d = attempt_dir(out, attempt)
    path = write_pilot_plan(out, attempt)
    if plan_only:
        return None
    plan = json.loads(path.read_text())
    if not (d / "runs.csv").exists():
        sweep(path, root / f"pilot{attempt}", parallel)
        shutil.copyfile(root / f"pilot{attempt}" / "runs.csv", d / "runs.csv")
        shutil.copyfile(root / f"pilot{attempt}" / "sweep.log", d / "sweep.log")
    g = gate(d / "runs.csv", plan)
    (d / "gate.json").write_text(json.dumps(g, indent=1))
    (d / "gate.md").write_text(gate_md(plan, g))
    (out / "report.md").write_text(report_md(out))
    print(gate_md(plan, g))
    return g



# ---- the ladder and what follows it (run only after a gate at PROXIES[0] and PROXIES[-1] passed) ----

MIXTURES = 12
LADDER_SEEDS = 2  # at the largest proxy
LAWS = ("mixing_law", "additive", "regmix", "regmix_linear", "camel", "additive+repfit", "camel+repfit")
REP_LAW = "camel+repfit"  # the repetition-aware law whose optimum is a candidate
SIZE_COLUMN = "params_active"
FIT_BOOTSTRAP = 20
TARGET_SEEDS = (0, 1, 2)
LADDER_CHUNK, TARGET_CHUNK = 4, 2  # runs per committed chunk (2 at a time: 2 rounds of s1b, 1 of s2)


def decision_rule(target: str) -> str:
    return (f"mixture X beats mixture Y at the target when the mean of X's {metric_name(target)} at the final "
            "checkpoint over the 3 seeds is lower and the 95% t-interval of the paired difference X - Y (paired by "
            "train seed, 2 degrees of freedom) excludes zero; otherwise X and Y tie.")


def passed_attempt(out: Path, attempt: int) -> dict:
    """The setting of a gate attempt that passed at the smallest and the largest proxy size; the
    study stops with the reason otherwise."""
    path = attempt_dir(out, attempt) / "gate.json"
    if not path.exists():
        raise SystemExit(f"{path} does not exist: run --stage pilot --attempt {attempt} first.")
    g = json.loads(path.read_text())
    if not g["passed"]:
        raise SystemExit(f"gate attempt {attempt} did not pass ({attempt_dir(out, attempt) / 'gate.md'}): no ladder "
                         "without headroom; add an attempt with another setting.")
    if list(g["sizes"]) != [PROXIES[0], PROXIES[-1]]:
        raise SystemExit(f"gate attempt {attempt} passed at {', '.join(g['sizes'])}, not at the ladder's smallest and "
                         f"largest proxy ({PROXIES[0]}, {PROXIES[-1]}): repeat the gate there before the ladder.")
    return ATTEMPTS[attempt]


def target_point(a: dict) -> tuple[float, float]:
    """(active parameters, tokens) of a target run in the setting ``a``."""
    return sizes()[TARGET]["params_active"], tokens_of(TARGET, tpp_of(a, TARGET))[1]


def ladder_plan(a: dict) -> dict:
    """``make_plan`` from scratch at PROXIES with the budget that affords exactly MIXTURES mixtures,
    every run on the data's own pool (``fixed_pool``) or on a pool matched to the target's repetition."""
    from data_mixture.plan import PlanSpec, make_plan

    n = {p: sizes()[p]["params_active"] for p in PRESETS}
    tpp = a["tokens_per_param"]
    per_mixture = sum(6 * n[p] * tpp_of(a, p) * n[p] * (LADDER_SEEDS if p == PROXIES[-1] else 1) for p in PROXIES)
    size, tokens = target_point(a)
    spec = PlanSpec(budget_flops=per_mixture * (MIXTURES + 0.5), target_size=size, target_tokens=tokens,
                    presets=PRESETS, law="camel", domains=",".join(DOMAINS), tokens_per_param=(tpp,),
                    min_sizes=len(PROXIES), min_runs_per_size=MIXTURES, config=CONFIG, batch=BATCH, seq_len=SEQ_LEN,
                    checkpoints=CHECKPOINTS, seeds=LADDER_SEEDS, seed_sizes=(PROXIES[-1],),
                    unique_tokens=a["target_unique"], match_repetition=not a.get("fixed_pool", False))
    plan = make_plan(spec)
    plan["eval_windows"] = EVAL_WINDOWS["train.eval_windows"]  # as the committed runs were evaluated
    if plan["chosen"]["runs_per_size"] != MIXTURES or plan["chosen"]["sizes"] != list(PROXIES):
        raise SystemExit(f"the planner chose {plan['chosen']}, not {MIXTURES} mixtures at {list(PROXIES)}")
    longer = a.get("tokens_per_param_at", {})
    if longer and not a.get("fixed_pool"):
        raise SystemExit("tokens_per_param_at needs fixed_pool: a matched pool is scaled to the run's tokens")
    for i, run in enumerate(plan["runs"]):  # sizes trained longer than the study's budget (the planner sees one)
        if run["preset"] in longer:
            plan["runs"][i] = {**scratch_run(run["name"], run["preset"], tokens_of(run["preset"], longer[run["preset"]])[0],
                                             run["seed"], run["mixture"]),
                               **{k: run[k] for k in ("unique_tokens",) if k in run}}
            plan["runs"][i]["overrides"].update({k: v for k, v in run["overrides"].items() if k == "data.unique_tokens"})
    plan["total_flops"] = float(sum(r["flops"] for r in plan["runs"]))
    plan["target"]["set"] = a.get("target", TARGET_SET)
    plan["gate_attempt"] = next(k for k, v in ATTEMPTS.items() if v is a)
    plan["decision_rule"] = decision_rule(plan["target"]["set"])
    plan["notes"] = (f"Ladder of the headroom study, from scratch at {tpp:g} tokens per active parameter"
                     + "".join(f" ({p} at {t:g})" for p, t in longer.items()) + ": proxies "
                     f"{', '.join(PROXIES)}, target {TARGET} ({n[TARGET] / n[PROXIES[0]]:.1f}x the smallest); "
                     f"{MIXTURES} space-filling mixtures, {LADDER_SEEDS} seeds at {PROXIES[-1]}; "
                     + (f"every run trains on the same {SCARCE} pool as the target (a larger run repeats it more)."
                        if a.get("fixed_pool") else f"every run's {SCARCE} pool gives it the target's epochs at its weight."))
    return plan


def stage_ladder(out: Path, root: Path, parallel: int, attempt: int) -> None:
    a = passed_attempt(out, attempt)
    path = out / "plan.json"
    if not path.exists():
        path.write_text(json.dumps(ladder_plan(a), indent=1))
        print(f"ladder: wrote {path}")
    if not (out / "runs.csv").exists():
        merged = sweep_in_chunks(path, root, out, "ladder", parallel, LADDER_CHUNK)
        shutil.move(merged, out / "runs.csv")


def stage_fit(out: Path, root: Path, parallel: int, attempt: int) -> None:
    """Laws and baselines on the ladder for the target (largest proxy held out); every law fitted on
    the whole ladder for the target and its optimum at the target point with the target's pool."""
    a = passed_attempt(out, attempt)
    runs = str(out / "runs.csv")
    if not (out / "evaluate_ladder" / "evaluation.json").exists():
        dm("evaluate", "--runs", runs, "--laws", ",".join(LAWS), "--size-column", SIZE_COLUMN, "--target",
           a.get("target", TARGET_SET), "--out-dir", str(out / "evaluate_ladder"), "--force")
    size, tokens = target_point(a)
    pools = [f"{d}={u}" for d, u in a["target_unique"].items()]
    for law in LAWS:
        fit, opt = out / "fits" / f"{law}.json", out / "optima" / f"{law}.json"
        fit.parent.mkdir(exist_ok=True)
        opt.parent.mkdir(exist_ok=True)
        if not fit.exists():
            dm("fit", "--runs", runs, "--law", law, "--size-column", SIZE_COLUMN, "--target", a.get("target", TARGET_SET),
               "--bootstrap", str(FIT_BOOTSTRAP), "--out", str(fit), "--no-progress")
        if not opt.exists():
            dm("optimize", "--fit", str(fit), "--size", repr(size), "--tokens", repr(tokens), "--unique-tokens", *pools,
               "--out", str(opt))


# ---- MergeMix from scratch: experts continued from a uniform base at the largest proxy ----

MERGE_SHARE = 0.1  # experts train for 10% of the base's tokens (docs/mergemix.md: the recommended budget)


def mergemix_base(out: Path, root: Path, parallel: int, attempt: int) -> tuple[Path, dict]:
    """The shared base: the gate's uniform run at the largest proxy with its lowest seed (from
    scratch, the study's budget and pool), reused from the gate's run directory when it is there,
    else trained."""
    plan = json.loads((attempt_dir(out, attempt) / "plan.json").read_text())
    run = min((r for r in plan["runs"] if r["name"].rpartition("_s")[0] == f"{PROXIES[-1]}_uniform"),
              key=lambda r: r["seed"])
    sub = root / "chunks" / "mergemix_base.json"
    sub.parent.mkdir(parents=True, exist_ok=True)
    sub.write_text(json.dumps({**plan, "runs": [run]}, indent=1))
    sweep(sub, root / f"pilot{attempt}", parallel)
    return root / f"pilot{attempt}" / run["name"], run


def mergemix_objectives(target: str) -> dict[str, list[str]]:
    """The searches' objectives as ``mergemix`` flags: the target's held-out losses, and the
    benchmarks' continuous score (the gold answer's log-probability, macro over tasks)."""
    from data_mixture.target import parse_target

    losses = parse_target(target).loss_domains()
    return {"loss": ["--loss-weights", ",".join(f"{d}={w:g}" for d, w in losses.items())],
            "benchmark": ["--bench-metric", "gold_logprob"]}


def target_score(metrics: dict[str, float], target: str) -> float:
    """The target (lower is better) from a merge's ``loss:<domain>`` metrics."""
    from data_mixture.target import parse_target

    return float(sum(w * metrics[f"loss:{d}"] for d, w in parse_target(target).loss_domains().items()))


def stage_mergemix(out: Path, root: Path, parallel: int, attempt: int) -> None:
    """MergeMix's two searches (``mergemix/search_<objective>/``) and its ranking of the ladder's
    mixtures at the largest proxy against the trivial rankers (``mergemix/rank.json``)."""
    from experiments.studies.do_laws_pick_midtrain_mixtures import (MERGE_LOSS_BATCHES, MERGE_MAX_ITEMS,
                                                                    SEARCH_BUDGET, SEARCH_SEEDS)

    a = passed_attempt(out, attempt)
    target = a.get("target", TARGET_SET)
    base, run = mergemix_base(out, root, parallel, attempt)
    expert_tokens = MERGE_SHARE * run["tokens"]
    (out / "mergemix").mkdir(exist_ok=True)
    for name, extra in mergemix_objectives(target).items():
        dest = out / "mergemix" / f"search_{name}"
        if not (dest / "summary.json").exists():
            dm("mergemix", "--base", str(base), "--domains", ",".join(DOMAINS), "--expert-tokens", repr(expert_tokens),
               "--fractions", "1", "--experts-dir", str(root / "experts"), "--search", "mergemix",
               "--budget", str(SEARCH_BUDGET), "--seeds", str(SEARCH_SEEDS), "--max-items", str(MERGE_MAX_ITEMS),
               "--loss-batches", str(MERGE_LOSS_BATCHES), "--cache", str(root / f"cache_search_{name}.jsonl"),
               "--out", str(dest), "--no-progress", *extra)
    experts_log = root / "experts" / "sweep.log"
    if experts_log.exists() and not (out / "mergemix" / "sweep_experts.log").exists():
        shutil.copyfile(experts_log, out / "mergemix" / "sweep_experts.log")
    path = out / "mergemix" / "rank.json"
    if not path.exists():
        path.write_text(json.dumps(mergemix_rank(out, root, base, target), indent=1, default=float))


def mergemix_rank(out: Path, root: Path, base: Path, target: str) -> dict:
    """The merges of the ladder's mixtures at the largest proxy (linear router, held-out losses)
    ranked against those mixtures' runs there, beside the rankers that need no experts."""
    from data_mixture.baselines import uniform_score
    from data_mixture.mergemix.pipeline import MergeProxy, open_merge
    from data_mixture.mergemix.rank import spearman
    from data_mixture.table import read_runs
    from data_mixture.target import parse_target
    from experiments.studies.do_laws_pick_midtrain_mixtures import (MERGE_LOSS_BATCHES, MERGE_MAX_ITEMS,
                                                                    decision_gap, decision_scores)

    table = read_runs(str(out / "runs.csv"))
    weights, values = final_means(table, sizes()[PROXIES[-1]]["params_active"], target)
    names = sorted(weights)
    mix_nm = np.array([[weights[n][d] for d in DOMAINS] for n in names])
    merge_set, evaluator = open_merge(str(base), None, str(root / "experts"), DOMAINS, 1.0, max_items=MERGE_MAX_ITEMS,
                                      loss_batches=MERGE_LOSS_BATCHES, cache_path=str(root / "cache_rank.jsonl"),
                                      tasks=[])
    start = time.perf_counter()
    metrics = MergeProxy(merge_set, evaluator, "linear").evaluate_many(list(mix_nm))
    merge_s = time.perf_counter() - start
    like = np.array([sum(w * weights[n][d] for d, w in parse_target(target).loss_domains().items()) for n in names])
    _, smaller = final_means(table, sizes()[PROXIES[-2]]["params_active"], target)
    rankers = {"mergemix": np.array([target_score(m, target) for m in metrics]),
               "closeness_to_uniform": uniform_score(mix_nm),
               "rank_by_target_weight": -like,  # the mixture's share of the target's domains
               f"smaller_proxy_{PROXIES[-2]}": np.array([np.mean(smaller[f"{PROXIES[-2]}_{n.partition('_')[2]}"])
                                                         for n in names])}  # s1b_m3's mixture at s1 is s1_m3
    obs = [values[n] for n in names]
    truth = np.array([np.mean(v) for v in obs])
    got = {"mixtures": names, "metric": metric_name(target), "truth_seed_mean": truth.tolist(), "merge_s": merge_s,
           "merge_metrics": dict(zip(names, metrics)),
           "rankers": {k: {"needs": need, "spearman": spearman(p, truth), "decision": decision_scores(p, obs),
                           "prediction": p.tolist()}
                       for (k, p), need in zip(rankers.items(), ("experts", "nothing", "nothing", "a ladder"))}}
    got["mergemix_minus"] = {k: decision_gap(rankers["mergemix"], p, obs) for k, p in rankers.items() if k != "mergemix"}
    return got


def costs(out: Path, attempt: int) -> dict:
    """Training FLOPs (6 N_active D, the plans' ``flops``) and the runs' own wall seconds (the sweep
    logs; 2 runs at a time on 2 cores) of each part, and the cost at which each candidate's pick was
    made (``picked_with``)."""
    from experiments.studies.do_laws_pick_midtrain_mixtures import run_seconds

    def part(plan_path: Path, logs: list[Path]) -> dict | None:
        if not plan_path.exists():
            return None
        runs = json.loads(plan_path.read_text())["runs"]
        secs = run_seconds(*logs)
        done = [r for r in runs if r["name"] in secs]
        return {"runs": len(runs), "flops": float(sum(r["flops"] for r in runs)),
                "run_s": float(sum(secs[r["name"]] for r in done)), "runs_timed": len(done)}

    got: dict = {"gate": {}, "note": ("Training FLOPs 6 x N_active x tokens (evaluations not counted, except MergeMix's "
                                      "merges: its search is evaluation). run_s: the runs' own wall seconds, 2 at a time "
                                      "on 2 cores under the load of the day.")}
    for k in sorted(ATTEMPTS):
        d = attempt_dir(out, k)
        got["gate"][k] = part(d / "plan.json", [d / "sweep.log"])
    explore = out / "pilot" / "explore"
    got["exploration"] = [part(plan, [explore / "sweep.log"]) for plan in sorted(explore.glob("plan_*.json"))]
    got["ladder"] = part(out / "plan.json", sorted((out / "ladder").glob("*.log")))
    got["target"] = part(out / "target_plan.json", sorted((out / "target").glob("*.log")))
    for name in ("loss", "benchmark"):
        summary = out / "mergemix" / f"search_{name}" / "summary.json"
        if summary.exists():
            sm = json.loads(summary.read_text())
            got[f"mergemix_{name}"] = {**sm.get("flops", {}), "search_s": sm.get("seconds", {}).get("search_mergemix"),
                                       "experts_s": sm.get("seconds", {}).get("experts")}
    if got["target"]:
        t = got["target"]
        n = MIXTURES * len(TARGET_SEEDS)
        got["brute_force_target"] = {"mixtures": MIXTURES, "flops": n * t["flops"] / t["runs"],
                                     "run_s": n * t["run_s"] / t["runs_timed"] if t["runs_timed"] else None,
                                     "what": f"the ladder's {MIXTURES} mixtures at the target, {len(TARGET_SEEDS)} seeds"}
    ladder = (got["ladder"] or {}).get("flops")
    got["picked_with"] = {"uniform": 0.0, "proportional": 0.0, "unimax": 0.0, "best_at_proxy": ladder,
                          "rank_by_weight": ladder, "camel": ladder, "best_other_law": ladder,
                          "repetition_law": ladder,
                          **{f"mergemix_{n}": (got.get(f"mergemix_{n}") or {}).get("total") for n in ("loss", "benchmark")}}
    return got


def final_cells(table, preset_size: float, target: str) -> tuple[dict, dict]:
    """At one size, over runs' final checkpoints: ({mixture key: weights}, {mixture key: [(seed,
    target)]}). A run's key is its name without a trailing ``_s<seed>`` (``s1b_m0`` and
    ``s1b_m0_s1`` are one mixture); its seed is the table's ``seed`` column."""
    from data_mixture.target import parse_target

    loss_r, seed_r = parse_target(target).values(table), table.seeds()
    weights, cells = {}, {}
    for run in sorted(set(table.run[table.params_active == preset_size].tolist())):
        rows = np.flatnonzero(table.run == run)
        i = rows[np.argmax(table.tokens[rows])]
        stem, _, tail = run.rpartition("_s")
        key = stem if stem and tail.isdigit() else run
        weights[key] = {d: float(table.mix_rm[i, j]) for j, d in enumerate(table.mix_domains)}
        cells.setdefault(key, []).append((int(seed_r[i]), float(loss_r[i])))
    return weights, cells


def final_means(table, preset_size: float, target: str) -> tuple[dict, dict]:
    """At one size: ({mixture key: weights}, {mixture key: [target per seed]})."""
    weights, cells = final_cells(table, preset_size, target)
    return weights, {k: [v for _, v in c] for k, c in cells.items()}


RANK_BY_WEIGHT_CAP = 0.7  # rank-by-weight's share of the most target-like domain (the rest split equally)


def capped_weights(favour: str, cap_share: float) -> dict[str, float]:
    """As much of ``favour`` as ``cap_share`` allows, the rest split equally over the other domains."""
    w = min(1.0, cap_share)
    return {d: (w if d == favour else (1.0 - w) / (len(DOMAINS) - 1)) for d in DOMAINS}


def candidates(out: Path, a: dict) -> dict[str, dict]:
    """The target's candidates {name: {"weights", "why"}}: laws' optima, uniform, proportional, UniMax,
    best-at-proxy, rank-by-weight and MergeMix's two optima."""
    from data_mixture.baselines import UNIMAX_MAX_EPOCHS, unimax_weights
    from data_mixture.optimize import available_tokens
    from data_mixture.table import read_runs

    _, tokens = target_point(a)
    pool = {**available_tokens(dataset="builtin", domains=list(DOMAINS)), **a["target_unique"]}
    u_m = np.array([pool[d] for d in DOMAINS], np.float64)
    got = {"uniform": {"weights": {d: 1.0 / len(DOMAINS) for d in DOMAINS}, "why": "uniform"},
           "proportional": {"weights": dict(zip(DOMAINS, (u_m / u_m.sum()).tolist())),
                            "why": "proportional to unique tokens at the target (built-in corpus, the scarce pool)"},
           "unimax": {"weights": dict(zip(DOMAINS, unimax_weights(u_m, tokens, UNIMAX_MAX_EPOCHS).tolist())),
                      "why": f"UniMax at the target's tokens, cap {UNIMAX_MAX_EPOCHS:g} epochs"}}
    table = read_runs(str(out / "runs.csv"))
    weights, values = final_means(table, sizes()[PROXIES[-1]]["params_active"], a.get("target", TARGET_SET))
    best = min(weights, key=lambda k: np.mean(values[k]))
    got["best_at_proxy"] = {"weights": weights[best], "why": f"{best}: lowest seed-mean target loss at {PROXIES[-1]}"}
    names = sorted(weights)
    from scipy.stats import spearmanr

    rho = {d: spearmanr([weights[k][d] for k in names], [np.mean(values[k]) for k in names]).statistic for d in DOMAINS}
    like = min(rho, key=rho.get)  # the domain whose weight lowers the target loss most consistently
    got["rank_by_weight"] = {"weights": capped_weights(like, RANK_BY_WEIGHT_CAP),
                             "why": f"as much {like} as the cap of {RANK_BY_WEIGHT_CAP:g} per domain allows, the rest "
                                    f"equal: its weight has the most negative Spearman with the target loss at "
                                    f"{PROXIES[-1]} ({rho[like]:.2f}); no epoch cap, as for the laws' optima (UniMax "
                                    "is the epoch-capped choice)"}
    laws = json.loads((out / "evaluate_ladder" / "evaluation.json").read_text())["laws"]
    got["camel"] = {"weights": json.loads((out / "optima" / "camel.json").read_text())["weights"],
                    "why": "CAMEL's optimum for the target"}
    scored = {k: v for k, v in laws.items() if not k.startswith("camel") and "decision" in v}  # CAMEL's variants excluded
    other = max(scored, key=lambda k: (scored[k]["decision"]["accuracy"], -scored[k]["mean"]["mae"]))
    got["best_other_law"] = {"weights": json.loads((out / "optima" / f"{other}.json").read_text())["weights"], "law": other,
                             "why": f"{other}: the best decision accuracy with {PROXIES[-1]} held out among the laws other than CAMEL "
                                    f"({scored[other]['decision']['accuracy']:.3f})"}
    got["repetition_law"] = {"weights": json.loads((out / "optima" / f"{REP_LAW}.json").read_text())["weights"],
                             "why": f"{REP_LAW}'s optimum (R* fitted) for the target"}
    for name in ("loss", "benchmark"):
        summary = out / "mergemix" / f"search_{name}" / "summary.json"
        got[f"mergemix_{name}"] = {"weights": json.loads(summary.read_text())["mixture"],
                                   "why": f"MergeMix's optimum, {name} objective (experts from the {PROXIES[-1]} "
                                          "uniform base)"}
    return got


def law_predictions(out: Path, a: dict, mixtures: dict[str, dict], *, laws: tuple[str, ...] = LAWS,
                    point: tuple[float, float] | None = None) -> dict[str, dict[str, float]]:
    """Every law's predicted target loss for each candidate at the target point with the target's pool
    (``laws`` from ``out/fits``; ``point``: (size, tokens), default the setting ``a``'s target point)."""
    from data_mixture.fit import Fit

    size, tokens = point or target_point(a)
    names = list(mixtures)
    mix_rm = np.array([[mixtures[n][d] for d in DOMAINS] for n in names])
    unique_m = np.array([float(a["target_unique"].get(d, np.inf)) for d in DOMAINS])
    got = {}
    for law in laws:
        fit = Fit.load(out / "fits" / f"{law}.json")
        cols = [DOMAINS.index(d) for d in fit.mix_domains]  # the fit's domain order
        pred = fit.predict_losses(np.full(len(names), size), np.full(len(names), tokens), mix_rm[:, cols],
                                  unique_rm=np.broadcast_to(unique_m[cols], mix_rm.shape))
        got[law] = dict(zip(names, pred[:, 0].tolist()))
    return got


def stage_register(out: Path, root: Path, parallel: int, attempt: int) -> None:
    """``data_mixture register``: rule, candidates and predictions before any target run; commit it."""
    a = passed_attempt(out, attempt)
    path = out / "registration.json"
    if path.exists():
        print(f"register: {path} exists (kept)")
        return
    chosen = candidates(out, a)
    (out / "candidates.json").write_text(json.dumps(chosen, indent=1))
    mixtures = {n: c["weights"] for n, c in chosen.items()}
    (out / "candidate_mixtures.json").write_text(json.dumps(mixtures, indent=1))
    (out / "predictions.json").write_text(json.dumps(law_predictions(out, a, mixtures), indent=1))
    size, tokens = target_point(a)
    target = a.get("target", TARGET_SET)
    dm("register", "--rule", decision_rule(target), "--candidates", str(out / "candidate_mixtures.json"), "--predictions",
       str(out / "predictions.json"), "--size", repr(size), "--tokens", repr(tokens), "--size-column", SIZE_COLUMN,
       "--metric", metric_name(target) if target == TARGET_SET else target, "--out", str(path))
    print(f"register: wrote {path}; commit it (git add {path} && git commit) before --stage target")


def committed(path: Path) -> bool:
    """Whether ``path`` is tracked by git and has no uncommitted change (git asked from the file's own
    folder, so this holds from any working directory)."""
    path = Path(path).resolve()
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, "cwd": path.parent}
    tracked = subprocess.call(["git", "ls-files", "--error-unmatch", path.name], **quiet) == 0
    return tracked and subprocess.call(["git", "diff", "--quiet", "HEAD", "--", path.name], **quiet) == 0


def target_plan(out: Path, a: dict) -> dict:
    """Each registered candidate from scratch at the target with the target's pool, TARGET_SEEDS each
    (a candidate equal to an earlier one within 1e-6 is trained once)."""
    reg = json.loads((out / "registration.json").read_text())
    steps, _ = tokens_of(TARGET, tpp_of(a, TARGET))
    runs, seen = [], {}
    for name, w in reg["candidates"].items():
        same = [m for m, v in seen.items() if max(abs(v[d] - w.get(d, 0.0)) for d in DOMAINS) < 1e-6]
        if same:
            continue
        seen[name] = {d: float(w.get(d, 0.0)) for d in DOMAINS}
        for seed in TARGET_SEEDS:
            run = scratch_run(f"{TARGET}_{name}_s{seed}", TARGET, steps, seed, seen[name])
            overrides = {**run["overrides"], "data.unique_tokens": ",".join(f"{d}={u}" for d, u in a["target_unique"].items())}
            runs.append({**run, "overrides": overrides, "unique_tokens": dict(a["target_unique"])})
    return {"version": 1, "decision_rule": reg["decision_rule"], "registration_sha256": reg["sha256"], "runs": runs}


def stage_target(out: Path, root: Path, parallel: int, attempt: int) -> None:
    a = passed_attempt(out, attempt)
    reg = out / "registration.json"
    if not reg.exists() or not committed(reg):
        raise SystemExit(f"{reg} is missing or not committed: run --stage register and commit it before any target run.")
    path = out / "target_plan.json"
    if not path.exists():
        path.write_text(json.dumps(target_plan(out, a), indent=1))
    merged = sweep_in_chunks(path, root, out, "target", parallel, TARGET_CHUNK)
    shutil.move(merged, out / "target_runs.csv")


def stage_report(out: Path, root: Path, parallel: int, attempt: int) -> None:
    """``evaluate --registration`` on the ladder and the target runs, then ``report.md``."""
    if not (out / "target_runs.csv").exists():
        raise SystemExit(f"{out / 'target_runs.csv'} does not exist: run --stage target first.")
    a = passed_attempt(out, attempt)
    runs = [str(out / "runs.csv"), str(out / "target_runs.csv")]
    dm("evaluate", "--runs", *runs, "--laws", ",".join(LAWS), "--size-column", SIZE_COLUMN, "--target",
       a.get("target", TARGET_SET),
       "--registration", str(out / "registration.json"), "--out-dir", str(out / "evaluate_target"), "--force")
    (out / "report.md").write_text(report_md(out))
    print((out / "report.md").read_text())


def report_md(out: Path) -> str:
    """The study's report from its committed files: every gate attempt, then (when run) the
    registration check with every registered comparison, the laws' predictions against the observed
    target loss, and the two evaluate verdicts."""
    from data_mixture.register import format_check, load, verify
    from data_mixture.table import read_runs

    lines = ["# The headroom study", "", "## Gate attempts", "", "| attempt | sizes | best per size | gain over uniform "
             "(per-pair sd) | best moves | gate |", "|---|---|---|---|---|---|"]
    for k in sorted(ATTEMPTS):
        path = attempt_dir(out, k) / "gate.json"
        if not path.exists():
            continue
        g = json.loads(path.read_text())
        rows = g["sizes"]
        lines.append(f"| {k} | {', '.join(rows)} | " + ", ".join(f"{p}: {r['best']}" for p, r in rows.items()) + " | "
                     + ", ".join(f"{p}: {r.get('gain', 0.0):+.4f} ({r.get('gain_in_sd') or 0.0:.2f} sd)"
                                 for p, r in rows.items())
                     + f" | {g['best_moves']} | {'pass' if g['passed'] else 'fail'} |")
    passed = [k for k in sorted(ATTEMPTS) if (attempt_dir(out, k) / "gate.json").exists()
              and json.loads((attempt_dir(out, k) / "gate.json").read_text())["passed"]]
    lines += ["", (f"Gate passed in attempt {passed[-1]} (pilot/attempt{passed[-1]}/gate.md)." if passed else
                   "No attempt has passed the gate: no ladder run is made (each attempt's gate.md says why).")]
    reg_path, target_csv = out / "registration.json", out / "target_runs.csv"
    if reg_path.exists() and not target_csv.exists() and (out / "target_plan.json").exists():
        planned = json.loads((out / "target_plan.json").read_text())["runs"]
        landed = sorted({r for part in (out / "target").glob("*.csv") for r in read_runs(str(part)).run.tolist()})
        lines += ["", "## Target runs", "", f"Registered {json.loads(reg_path.read_text())['registered_at']}; "
                  f"{len(landed)} of {len(planned)} target runs landed ({', '.join(landed) or 'none'}). The "
                  "comparisons are made when all have (`--stage report`)."]
    if reg_path.exists() and target_csv.exists():
        reg = load(reg_path)
        check = verify(reg, read_runs(str(target_csv)))
        lines += answers_md(check)
        lines += ["", "## Target comparisons (registration check)", "", *format_check(check)]
        table = read_runs(str(target_csv))
        metric = reg["decision_rule"].get("metric", f"loss:{TARGET_SET}")
        weights, values = final_means(table, sizes()[TARGET]["params_active"], metric.removeprefix("loss:"))
        names = [n for n in reg["candidates"] if f"{TARGET}_{n}" in values]
        observed = np.array([np.mean(values[f"{TARGET}_{n}"]) for n in names])
        lines += ["", "## Predicted vs observed target loss", "", "Each law's registered prediction for each candidate; "
                  "the last two columns score it against the observed seed means over the candidates (mean absolute "
                  "error; Spearman: does the law order the candidates as the target runs do).", "",
                  "| law | " + " | ".join(names) + " | abs. error | Spearman |", "|---|" + "---|" * (len(names) + 2),
                  "| observed (seed mean) | " + " | ".join(f"{v:.4f}" for v in observed) + " | | |"]
        for law, p in reg["predictions"].items():
            pred = np.array([p[n] for n in names])
            lines.append(f"| {law} | " + " | ".join(f"{v:.4f}" for v in pred) + f" | {np.mean(np.abs(pred - observed)):.4f}"
                         f" | {spearmanr(pred, observed).statistic:+.2f} |")
    lines += detectable_md(out)
    lines += mergemix_md(out)
    lines += costs_md(out)
    for name, title in (("evaluate_ladder", f"{PROXIES[-1]} held out"), ("evaluate_target", "the target held out")):
        path = out / name / "evaluation.json"
        if path.exists():
            verdict = json.loads(path.read_text())["verdict"]
            text = verdict["text"] if isinstance(verdict, dict) else verdict
            lines += ["", f"## Evaluate, {title}", "", f"**{text}** (tables: {name}/evaluation.md)"]
    lines += ["", "## Limits", "", "- One synthetic corpus (four generated domains and one held-out target set), "
              "tiny models on CPU (58k to 600k active parameters).",
              "- MergeMix is a mid-training method; here its experts continue a from-scratch uniform base at the "
              f"largest proxy ({PROXIES[-1]}) for {MERGE_SHARE:.0%} of the base's tokens, one expert seed.",
              "- Proportional and UniMax are candidates at the target but not rankers in `evaluate` on the ladder: "
              f"the runs table has unique tokens for {SCARCE} only (the other domains' sizes are the built-in "
              "corpus's, given to the candidates by `available_tokens`).",
              f"- The ladder has 2 seeds at {PROXIES[-1]} and one at the smaller sizes: its paired half-widths have 1 "
              "degree of freedom (t = 12.7), which is why they are wide; `evaluate` decides the ladder's pairs by its own noise "
              "rule (a difference beyond twice the pair's seed spread), the target by the registered paired t over 3 seeds."]
    return "\n".join(lines) + "\n"


BASELINES = ("uniform", "proportional", "best_at_proxy", "rank_by_weight")  # the bars every method's pick must clear


def versus(check: dict, a: str, b: str) -> dict | None:
    """The registered comparison of ``a`` with ``b`` oriented as a - b (None when not registered)."""
    for c in check["comparisons"]:
        if (c["a"], c["b"]) == (a, b):
            return c
        if (c["a"], c["b"]) == (b, a):
            flip = {"a wins": "b wins", "b wins": "a wins"}
            return {**c, "a": a, "b": b, "verdict": flip.get(c["verdict"], c["verdict"]),
                    **({"diff": -c["diff"]} if "diff" in c else {}),
                    **({"lo": -c["hi"], "hi": -c["lo"]} if c.get("lo") is not None else {})}
    return None


def answers_md(check: dict) -> list[str]:
    """Each method's pick against the trivial choices at the target, by the registered rule: a cell
    is the method minus the baseline (negative: the method's loss is lower) with its 95% interval."""
    names = list(dict.fromkeys(n for c in check["comparisons"] for n in (c["a"], c["b"])))
    methods = [n for n in names if n not in BASELINES]
    cols = [b for b in BASELINES if b in names]
    word = {"a wins": "**beats**", "b wins": "loses", "tie": "tie", "not run": "not run"}
    lines = ["", "## Does a method's pick beat the trivial choices at the target?", "",
             "Each cell: the method's target loss minus the baseline's (seed means; negative is better), 95% paired "
             "interval over the seeds, and the registered rule's verdict.", "",
             "| method | " + " | ".join(f"vs {b}" for b in cols) + " |", "|---|" + "---|" * len(cols)]
    for m in methods:
        cells = []
        for b in cols:
            c = versus(check, m, b)
            cells.append("" if c is None else f"{c['diff']:+.4f} [{c['lo']:+.4f}, {c['hi']:+.4f}] {word[c['verdict']]}"
                         if c.get("lo") is not None else word.get(c["verdict"], c["verdict"]))
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    wins = [m for m in methods if all((versus(check, m, b) or {}).get("verdict") == "a wins" for b in cols)]
    lines += ["", f"Methods that beat every one of {', '.join(cols)}: **{', '.join(wins) or 'none'}**."]
    laws = [n for n in ("best_other_law", "repetition_law") if n in names]
    if "camel" in names and laws:
        lines += ["", "CAMEL's pick against the other laws' picks: " + "; ".join(
            f"vs {n}: {c['diff']:+.4f} [{c['lo']:+.4f}, {c['hi']:+.4f}], {word[c['verdict']]}"
            if (c := versus(check, "camel", n)).get("lo") is not None else f"vs {n}: {word.get(c['verdict'])}"
            for n in laws) + "."]
    return lines


def paired_half_widths(table, preset_size: float, target: str) -> list[float]:
    """The 95% paired-t half-width of every pair of mixtures with the same >= 2 seeds at one size:
    the smallest difference of seed means that pair's interval could exclude zero at."""
    from data_mixture.decisions import seed_difference

    _, cells = final_cells(table, preset_size, target)
    keys = sorted(cells)
    got = []
    for i, a in enumerate(keys):
        for b in keys[i + 1:]:
            d = seed_difference(cells[a], cells[b])
            if d["method"].startswith("paired"):
                got.append((d["hi"] - d["lo"]) / 2)
    return got


def detectable_md(out: Path) -> list[str]:
    """The smallest difference the design could detect: the paired half-widths at the target (once
    its runs exist), else at the largest proxy's seeded runs."""
    from data_mixture.table import read_runs

    if not (out / "plan.json").exists():
        return []
    target = json.loads((out / "plan.json").read_text())["target"]["set"]
    for csv, preset in ((out / "target_runs.csv", TARGET), (out / "runs.csv", PROXIES[-1])):
        if csv.exists():
            h = paired_half_widths(read_runs(str(csv)), sizes()[preset]["params_active"], target)
            if h:
                return ["", "## The smallest difference this design can detect", "",
                        f"At {preset}, over {len(h)} pairs of mixtures with the same seeds, a difference of seed means "
                        f"is decided when it exceeds its pair's 95% paired-t half-width: median {np.median(h):.4f} "
                        f"nats, smallest {min(h):.4f}, largest {max(h):.4f}."]
    return []


def mergemix_md(out: Path) -> list[str]:
    path = out / "mergemix" / "rank.json"
    if not path.exists():
        return []
    r = json.loads(path.read_text())
    lines = ["", f"## MergeMix's ranking of the ladder's mixtures at {PROXIES[-1]}", "",
             f"Truth: the {len(r['mixtures'])} ladder mixtures' {r['metric']} at {PROXIES[-1]} (seed means); merges "
             "of the same mixtures, linear router, held-out losses"
             + (f" ({len(r['mixtures'])} merges evaluated in {r['merge_s'] / 60:.1f} min, on top of the experts' "
                "training in the cost table)." if "merge_s" in r else "."), "",
             "| ranker | needs | Spearman | decision accuracy [95%] | MergeMix minus it [95%] |", "|---|---|---|---|---|"]
    for name, k in r["rankers"].items():
        gap = r["mergemix_minus"].get(name)
        d = k["decision"]
        vs = "" if gap is None else f"{gap['diff']:+.2f} [{gap['lo']:+.2f}, {gap['hi']:+.2f}]"
        lines.append(f"| {name} | {k['needs']} | {k['spearman']:.2f} | {d['accuracy']:.2f} [{d['lo']:.2f}, "
                     f"{d['hi']:.2f}] | {vs} |")
    return lines


def costs_md(out: Path) -> list[str]:
    if not (out / "plan.json").exists():
        return []
    attempt = json.loads((out / "plan.json").read_text()).get("gate_attempt", max(ATTEMPTS))
    c = costs(out, attempt)
    rows = [(f"gate attempt {k}", v) for k, v in c["gate"].items() if v] + [
        (f"exploration at s0 ({i + 1})", v) for i, v in enumerate(c["exploration"]) if v] + [
        (name, c[name]) for name in ("ladder", "target") if c.get(name)]
    lines = ["", "## Cost", "", c["note"], "", "| part | runs | training FLOPs | run minutes |", "|---|---|---|---|"]
    lines += [f"| {name} | {v['runs']} | {v['flops']:.3g} | {v['run_s'] / 60:.0f} ({v['runs_timed']} timed) |"
              for name, v in rows]
    for name in ("mergemix_loss", "mergemix_benchmark"):
        if c.get(name):
            m = c[name]
            lines.append(f"| {name} (experts + merges; with the base run: {m.get('total_with_base', float('nan')):.3g}) | "
                         f"4 experts, {m.get('merges_evaluated', '')} merges | {m.get('total', float('nan')):.3g} | "
                         + (f"experts {m['experts_s'] / 60:.1f}" if (m.get("experts_s") or 0) > 1 else "experts reused")  # loaded, not trained
                         + f" + search {(m.get('search_s') or 0) / 60:.1f} |")
    if c.get("brute_force_target"):
        b = c["brute_force_target"]
        est = "" if b["run_s"] is None else f"{b['run_s'] / 60:.0f} (estimated: the target runs' mean)"
        lines.append(f"| brute force at the target ({b['what']}; not run) | {b['mixtures'] * len(TARGET_SEEDS)} | "
                     f"{b['flops']:.3g} | {est} |")
    picked = [f"{k} {v:.3g}" for k, v in c["picked_with"].items() if v is not None]
    lines += ["", "Training FLOPs spent before each candidate could be named (the gate not counted): "
              + ", ".join(picked) + "."]
    return lines


STAGES = ("pilot", "ladder", "fit", "mergemix", "register", "target", "report")
STAGE_FNS = {"ladder": stage_ladder, "fit": stage_fit, "mergemix": stage_mergemix, "register": stage_register,
             "target": stage_target, "report": stage_report}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stage", choices=STAGES + ("all",), default="all")
    ap.add_argument("--attempt", type=int, default=max(ATTEMPTS), choices=sorted(ATTEMPTS),
                    help="the gate attempt the pilot stage runs and the later stages require to have passed")
    ap.add_argument("--plan-only", action="store_true", help="pilot: write the attempt's plan.json and stop (commit it, "
                                                             "then run again without this flag)")
    ap.add_argument("--out", default="experiments/studies/results/headroom_v1", help="committed results")
    ap.add_argument("--root", default="runs/headroom_v1", help="run directories (not committed)")
    ap.add_argument("--parallel", type=int, default=2)
    add_verbosity_flags(ap)
    args = ap.parse_args(argv)
    setup_logging(args.verbosity)
    out, root = Path(args.out), Path(args.root)
    out.mkdir(parents=True, exist_ok=True)
    todo = STAGES if args.stage == "all" else (args.stage,)
    if "pilot" in todo:
        g = stage_pilot(out, root, args.parallel, args.attempt, args.plan_only)
        if g is None or (not g["passed"] and args.stage == "all"):
            return
    for stage in todo[1:] if args.stage == "all" else todo:
        if stage != "pilot":
            STAGE_FNS[stage](out, root, args.parallel, args.attempt)


if __name__ == "__main__":
    main()
