"""headroom_v2's target runs and report: the ``target`` and ``report`` stages of
``does_recommend_beat_the_practitioner`` (design.json's ``decision`` and ``eval``).

- ``target``  each distinct registered candidate at s2 with seeds 0, 1, 2 (``run_entry``: the
              registered evaluation, 16 sampled held-out batches per domain, the math pool), in
              committed chunks of 2 runs (``target/<k>.csv|log``); refuses a registration that is
              not committed, or a plan that differs from the one written before the first run.
- ``report``  ``data_mixture evaluate --registration`` on ladder + target runs, then
              ``report.json`` and ``report.md`` from the committed files (:func:`report_data`,
              :func:`report_md`; a test rebuilds the committed report): every registered comparison
              with its paired mean difference, 95% paired t-interval (2 dof), raw and
              Holm-adjusted p-value (:func:`data_mixture.decisions.holm`, within each family) and
              verdict; each law's predictions against the observed target losses; the evaluation's
              own standard error beside the seed sd; each pick's cost; the smallest difference the
              design detects; and one sentence answering design.json's question.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from scipy import stats
from scipy.stats import spearmanr

from experiments.studies import headroom_v2_setting as study
from experiments.studies import does_the_mixture_matter_with_headroom as v1
from experiments.studies import headroom_v2_picks as picks
from experiments.studies.do_laws_pick_midtrain_mixtures import dm, run_seconds

TARGET_CHUNK = 2  # runs per committed chunk: one round of 2 runs at a time (a chunk of 3 leaves a core idle)
ALPHA = 0.05  # family-wise error of the Holm correction (design.json: decision.correction)
QUESTION_PAIR = ("recommend", "target_capped_16")
WORD = {"beats": "beats", "loses": "loses to", "ties": "ties with"}


def run_name(candidate: str, seed: int) -> str:
    return f"{study.TARGET_SIZE}_{candidate}_s{seed}"


def shared(out: Path) -> dict[str, str]:
    """{candidate: the candidate whose target runs it uses}, from the hashed registration: ``register``
    gave a candidate that shares runs exactly its owner's mixture, the first of that mixture."""
    reg = json.loads((out / "registration.json").read_text())["candidates"]
    got: dict[str, str] = {}
    for name, w in reg.items():
        got[name] = next((o for o in got if got[o] == o and all(abs(reg[o].get(d, 0.0) - w.get(d, 0.0)) <= 1e-12
                                                                for d in set(w) | set(reg[o]))), name)
    return got


def target_plan(out: Path) -> dict:
    """Each distinct registered candidate (its registered mixture) at s2 with every target seed."""
    reg = json.loads((out / "registration.json").read_text())
    owner = shared(out)
    runs = [study.run_entry(run_name(name, seed), study.TARGET_SIZE, seed, dict(reg["candidates"][name]))
            for name in reg["candidates"] if owner[name] == name for seed in study.TARGET_SEEDS]
    return {"version": 1, "study": "headroom_v2", "stage": "target", "target": study.TARGET, "eval_windows": "sampled",
            "registration_sha256": reg["sha256"], "shares_runs_with": {n: o for n, o in owner.items() if o != n},
            "runs": runs}


def stage_target(out: Path, root: Path, parallel: int) -> Path:
    study.registered(out)
    picks.require_gate(out)
    from data_mixture.register import content_hash, load

    reg = out / "registration.json"
    if not reg.exists() or not v1.committed(reg):
        raise SystemExit(f"{reg} is missing or not committed: run --stage register and commit it before any target run")
    if content_hash(load(reg)) != load(reg)["sha256"]:
        raise SystemExit(f"{reg} no longer matches its sha256: a registration is never edited")
    d = out / "target"
    d.mkdir(parents=True, exist_ok=True)
    path, plan = d / "plan.json", target_plan(out)
    if path.exists() and json.loads(path.read_text()) != json.loads(json.dumps(plan)):
        raise SystemExit(f"{path} differs from the registration's target plan: it is never edited")
    path.write_text(json.dumps(plan, indent=1) + "\n")
    return v1.sweep_in_chunks(path, root, out, "target", parallel, chunk=TARGET_CHUNK, eval_args=study.EVAL_ARGS)


# ---- the decision ----

def paired(a: list[tuple[int, float]], b: list[tuple[int, float]], same_runs: bool) -> dict:
    """a - b paired by seed: mean, 95% t-interval (``seed_difference``), sd of the per-seed
    differences and the two-sided paired t-test's p-value (1 for a candidate sharing the other's runs)."""
    from data_mixture.decisions import seed_difference

    d = seed_difference(a, b)
    by_b = dict(b)
    d_s = np.array([v - by_b[s] for s, v in a])
    sd = float(d_s.std(ddof=1))
    if same_runs or (sd == 0 and d["diff"] == 0):
        p = 1.0
    elif sd == 0:
        p = 0.0
    else:
        p = float(2 * stats.t.sf(abs(d_s.mean()) / (sd / np.sqrt(d_s.size)), d_s.size - 1))
    return {**d, "sd_d": sd, "p": p, "same_runs": same_runs}


def verdict(diff: float, p_holm: float) -> str:
    """design.json's verdict: beats / loses below the Holm-adjusted 0.05, else ties."""
    return "ties" if not p_holm < ALPHA else ("beats" if diff < 0 else "loses" if diff > 0 else "ties")


def cells(out: Path) -> dict[str, dict]:
    """Per candidate: its runs' final target loss per seed, seed mean and sd, and the evaluation's
    own standard error (mean over its seeds)."""
    loss, se = study.final_rows(out / "target_runs.csv")
    got = {}
    for name, owner in shared(out).items():
        vals = [(s, loss[run_name(owner, s)]) for s in study.TARGET_SEEDS if run_name(owner, s) in loss]
        v = np.array([x for _, x in vals])
        got[name] = {"runs_of": owner, "values": vals, "mean": float(v.mean()) if v.size else None,
                     "seed_sd": float(v.std(ddof=1)) if v.size >= 2 else None,
                     "eval_se": float(np.mean([se[run_name(owner, s)] for s, _ in vals])) if vals else None}
    return got


def decide(families: dict[str, list[list[str]]], cell: dict[str, dict]) -> dict[str, list[dict]]:
    """Every registered comparison of each family, Holm-corrected within the family."""
    from data_mixture.decisions import holm

    n = len(study.TARGET_SEEDS)
    got = {}
    for fam, pairs in families.items():
        rows = []
        for a, b in pairs:
            ca, cb = cell[a], cell[b]
            if len(ca["values"]) == n and len(cb["values"]) == n:
                rows.append({"a": a, "b": b, **paired(ca["values"], cb["values"], ca["runs_of"] == cb["runs_of"])})
            else:
                rows.append({"a": a, "b": b, "p": None, "verdict": "not run"})
        # Holm over the whole registered family: a comparison not yet run counts as p = 1, so a
        # partial report is never less strict than the finished one.
        adjusted = holm([1.0 if r["p"] is None else r["p"] for r in rows]) if rows else []
        for r, p_holm in zip(rows, adjusted):
            if r["p"] is not None:
                r.update(p_holm=p_holm, verdict=verdict(r["diff"], p_holm))
        got[fam] = rows
    return got


def predictions_vs_observed(reg: dict, cell: dict[str, dict]) -> dict[str, dict]:
    """Each law's registered prediction per candidate beside the observed seed mean; MAE and Spearman
    over the distinct target runs (a shared mixture counted once)."""
    names = [n for n, c in cell.items() if c["runs_of"] == n and c["mean"] is not None]
    obs = np.array([cell[n]["mean"] for n in names])
    got = {}
    for law, pred in reg["predictions"].items():
        p = np.array([pred[n] for n in names])
        got[law] = {"predicted": {n: float(pred[n]) for n in cell},
                    "mae": float(np.mean(np.abs(p - obs))) if names else None,
                    "spearman": float(spearmanr(p, obs).statistic) if len(names) >= 3 else None}
    return got


def costs(out: Path) -> dict:
    """FLOPs (6 N_active D, as v1's ``costs``) spent before each pick could be named, each pick's target
    runs (3 seeds), and the runs' own wall minutes from the sweep logs."""
    def flops(plan: Path) -> float | None:
        return float(sum(r["flops"] for r in json.loads(plan.read_text())["runs"])) if plan.exists() else None

    ladder = flops(out / "ladder" / "plan.json")
    summary = out / "mergemix" / "search_loss" / "summary.json"
    merge = json.loads(summary.read_text()).get("flops", {}) if summary.exists() else {}
    base = next(r for r in study.gate_plan()["runs"] if r["name"] == picks.MERGE_BASE)["flops"]
    named = {"uniform": 0.0, "proportional": 0.0, "unimax": 0.0, "target_capped_16": 0.0, "best_at_proxy": ladder,
             "proxy_capped_16": ladder, "recommend": ladder, "camel_robust": ladder, "best_other_law_robust": ladder,
             "repetition_law": ladder,
             "mergemix": merge.get("total_with_base", None if merge.get("total") is None else merge["total"] + base)}
    plan = out / "target" / "plan.json"
    runs = json.loads(plan.read_text())["runs"] if plan.exists() else []
    secs = run_seconds(*sorted((out / "target").glob("*.log")))
    owner = shared(out)
    target = {}
    for name in named:
        mine = [r for r in runs if r["name"].rpartition("_s")[0] == f"{study.TARGET_SIZE}_{owner[name]}"]
        timed = [secs[r["name"]] for r in mine if r["name"] in secs]
        target[name] = {"flops": float(sum(r["flops"] for r in mine)),
                        "run_minutes": float(sum(timed)) / 60 if len(timed) == len(mine) and mine else None}
    return {"named_with": named, "target_runs": target, "ladder_flops": ladder, "mergemix_base_flops": float(base),
            "note": ("FLOPs 6 x N_active x tokens of the runs each pick needed before it could be named (the gate not "
                     "counted; MergeMix's: its experts and merges plus the s1 uniform base it continues); the target "
                     "runs' minutes are their own wall time, 2 runs at a time on shared CPUs")}


def answer(row: dict, ratio: float) -> str:
    """One sentence answering design.json's question from the primary comparison recommend - target_capped_16."""
    a, b = QUESTION_PAIR
    where = f"at a target {ratio:.1f}x the largest proxy's training FLOPs"
    if row.get("verdict") in (None, "not run"):
        return f"Not answered yet: {a} and {b} have not both been run at the target with every seed."
    if row["same_runs"]:
        return (f"No: recommend's pick is the practitioner's rule's mixture (within 0.01 total variation), so {a} and "
                f"{b} are the same target runs and tie by construction {where}.")
    iv = (f"{row['diff']:+.4f} nats, 95% paired interval [{row['lo']:+.4f}, {row['hi']:+.4f}], Holm-adjusted "
          f"p = {row['p_holm']:.3g}")
    if row["verdict"] == "beats":
        return f"Yes: recommend's pick beats the practitioner's rule ({b}) {where} ({a} - {b} = {iv})."
    if row["verdict"] == "loses":
        return f"No: recommend's pick loses to the practitioner's rule ({b}) {where} ({a} - {b} = {iv})."
    return (f"No: recommend's pick does not beat the practitioner's rule ({b}) {where}; they tie ({a} - {b} = {iv}).")


def report_data(out: Path) -> dict:
    """Everything the report states, from the committed files (registration, candidates, target runs)."""
    from data_mixture.decisions import detectable_difference
    from data_mixture.register import load, verify
    from data_mixture.table import read_runs

    reg = load(out / "registration.json")
    check = verify(reg, read_runs(str(out / "target_runs.csv")))
    cell = cells(out)
    families = json.loads((out / "comparisons.json").read_text())
    decided = decide(families, cell)
    row = next(r for r in decided["primary"] if (r["a"], r["b"]) == QUESTION_PAIR)
    sd_d = [r["sd_d"] for rows in decided.values() for r in rows if r.get("sd_d") is not None and not r["same_runs"]]
    n = len(study.TARGET_SEEDS)
    detect = None if not sd_d else {"sd_d_median": float(np.median(sd_d)), "sd_d_min": float(min(sd_d)),
                                    "sd_d_max": float(max(sd_d)), "pairs": len(sd_d),
                                    "detectable": detectable_difference(float(np.median(sd_d)), n)}
    ratio = json.loads((out / "design.json").read_text())["derived"]["target_over_largest_proxy_flops"]
    return {"question": study.DECISION["question"], "answer": answer(row, ratio),
            "pre_registered": check["pre_registered"], "why_not": check["why_not"],
            "registered_at": reg["registered_at"], "candidates": candidate_rows(out, reg), "cells": cell,
            "comparisons": decided, "predictions": predictions_vs_observed(reg, cell), "detectable": detect,
            "costs": costs(out), "evaluate": verdicts(out)}


def candidate_rows(out: Path, reg: dict) -> dict[str, dict]:
    """Per candidate: the registered mixture (what its target runs train), the scarce pool's epochs
    at the target, and why it was picked (candidates.json)."""
    _, tokens = picks.target_point()
    why = json.loads((out / "candidates.json").read_text()) if (out / "candidates.json").exists() else {}
    return {n: {"weights": w, "epochs": w.get(study.SCARCE, 0.0) * tokens / study.POOL_TOKENS,
                "why": why.get(n, {}).get("why", "")} for n, w in reg["candidates"].items()}


def verdicts(out: Path) -> dict[str, str]:
    """``evaluate``'s one-line verdicts: on the ladder (s1 held out) and on ladder + target runs."""
    got = {}
    for name in ("evaluate_ladder", "evaluate_target"):
        path = out / name / "evaluation.json"
        if path.exists():
            v = json.loads(path.read_text())["verdict"]
            got[name] = v["text"] if isinstance(v, dict) else str(v)
    return got


def _f(x, fmt: str = ".4f") -> str:
    return "" if x is None else format(x, fmt)


def _mix(w: dict[str, float]) -> str:
    return ", ".join(f"{w.get(x, 0.0):.3f}" for x in study.DOMAINS)


def report_md(data: dict) -> str:
    d = data
    lines = [f"# headroom_v2: {d['question']}", "", f"**{d['answer']}**", "",
             ("**Pre-registered**: the registration of " + d["registered_at"] + " predates every target run and covers "
              "them all (`evaluate --registration`'s check)." if d["pre_registered"] else
              "**Not pre-registered**: " + "; ".join(d["why_not"]) + "."), "",
             "## Candidates", "", "Each registered mixture (code, prose, math, knowledge), the math pool's epochs at "
             "the target, and why it is a candidate (`candidates.json`; a candidate within 0.01 total variation of an "
             "earlier one shares its runs).", "", "| candidate | mixture | math epochs | why |", "|---|---|---|---|",
             *[f"| {n} | {_mix(c['weights'])} | {c['epochs']:.1f} | {c['why']} |" for n, c in d["candidates"].items()],
             "", "## Target losses", "", f"Metric: {study.DECISION['metric']}; each loss over "
             f"{study.EVAL['heldout_batches_per_domain']} held-out batches per domain; `eval se`: the evaluation's own "
             "standard error (mean over the seeds), beside the seed sd.", "",
             "| candidate | runs of | loss per seed | mean | seed sd | eval se |", "|---|---|---|---|---|---|"]
    for name, c in d["cells"].items():
        lines.append(f"| {name} | {c['runs_of']} | {', '.join(f'{v:.4f}' for _, v in c['values'])} | {_f(c['mean'])} | "
                     f"{_f(c['seed_sd'])} | {_f(c['eval_se'])} |")
    for fam, rows in d["comparisons"].items():
        lines += ["", f"## {fam.capitalize()} family ({len(rows)} comparisons, Holm within the family)", "",
                  "| X vs Y | X - Y [95% paired t, 2 dof] | raw p | Holm p | verdict |", "|---|---|---|---|---|"]
        for r in rows:
            if r["p"] is None:
                lines.append(f"| {r['a']} vs {r['b']} | | | | not run |")
                continue
            same = " (same runs)" if r["same_runs"] else ""
            lines.append(f"| {r['a']} vs {r['b']} | {r['diff']:+.4f} [{r['lo']:+.4f}, {r['hi']:+.4f}]{same} | "
                         f"{r['p']:.3g} | {r['p_holm']:.3g} | {r['a']} {WORD[r['verdict']]} {r['b']} |")
    names = list(d["cells"])
    lines += ["", "## Registered predictions against the observed target losses", "",
              "Each law's prediction (registered before the target runs) per candidate; MAE and Spearman over the "
              "distinct target runs.", "", "| law | " + " | ".join(names) + " | MAE | Spearman |",
              "|---|" + "---|" * (len(names) + 2),
              "| observed (seed mean) | " + " | ".join(_f(d["cells"][n]["mean"]) for n in names) + " | | |"]
    for law, p in d["predictions"].items():
        lines.append(f"| {law} | " + " | ".join(f"{p['predicted'][n]:.4f}" for n in names)
                     + f" | {_f(p['mae'])} | {_f(p['spearman'], '+.2f')} |")
    if d["detectable"]:
        t = d["detectable"]
        lines += ["", "## The smallest difference this design detects", "",
                  f"With 3 paired seeds, the sd of the per-seed differences over the {t['pairs']} registered "
                  f"comparisons of distinct runs is {t['sd_d_median']:.4f} nats (median; {t['sd_d_min']:.4f} to "
                  f"{t['sd_d_max']:.4f}): a true difference of **{t['detectable']:.4f} nats** is detected with "
                  "probability 0.8 at two-sided 0.05 before the Holm correction "
                  "(`decisions.detectable_difference`)."]
    c = d["costs"]
    lines += ["", "## Cost of each pick", "", c["note"] + ".", "",
              "| pick | FLOPs to name it | target runs' FLOPs (3 seeds) | target run minutes |", "|---|---|---|---|"]
    for name, f in c["named_with"].items():
        t = c["target_runs"][name]
        lines.append(f"| {name} | {_f(f, '.3g')} | {t['flops']:.3g} | {_f(t['run_minutes'], '.0f')} |")
    titles = {"evaluate_ladder": f"{study.PROXIES[-1]} held out", "evaluate_target": "the target held out"}
    for name, text in d["evaluate"].items():
        lines += ["", f"## Evaluate (laws against baselines), {titles[name]}", "", f"{text} (tables: {name}/evaluation.md)"]
    return "\n".join(lines) + "\n"


def stage_report(out: Path, root: Path, parallel: int) -> dict:
    """``evaluate --registration`` on ladder + target runs, then report.json and report.md."""
    study.registered(out)
    target_csv = out / "target_runs.csv"
    if not target_csv.exists():
        raise SystemExit(f"{target_csv} does not exist: run --stage target first")
    dm("evaluate", "--runs", str(picks.ladder_csv(out)), str(target_csv), "--laws", ",".join(picks.LAWS),
       "--size-column", picks.SIZE_COLUMN, "--target", study.TARGET, "--registration", str(out / "registration.json"),
       "--out-dir", str(out / "evaluate_target"), "--no-plot", "--force")
    data = report_data(out)
    (out / "report.json").write_text(json.dumps(data, indent=1, default=float) + "\n")
    (out / "report.md").write_text(report_md(data))
    print(report_md(data))
    if not data["pre_registered"]:
        raise SystemExit("the registration check failed: " + "; ".join(data["why_not"]))
    return data
