"""Law robustness matrix: every law fitted on tables drawn from other forms, extrapolated 10x in size.

    .venv/bin/python -m experiments.benchmarks.law_robustness [--fast] [--laws camel,additive]
        [--truths camel,capped_domain] [--seeds 0,1,2] [--out experiments/studies/results/robustness]

For every truth in ``data_mixture.synthetic.ROBUST_TRUTHS`` (the forms of four laws and three
capacity-aware forms no law has; their parameters were fixed before any law was tuned on this
matrix and are not to be changed afterwards) and both designs,

* ``same``: the same 16 mixtures (Dirichlet(1) over 4 domains) at each of 4 log-spaced sizes
  1e7 .. 1e8 (``SIZES``), or ``different``: 16 fresh mixtures at each size,
* each run with 2 checkpoints (0.5 and 1.0 of 20 tokens per parameter): 128 rows,
* 0.5 % log-normal noise (``NOISE``; the middle of the 0.3-1 % range the robustness study asks for),

every law in ``LAWS`` is point-fitted (``STARTS`` random starts) and scored on 64 test mixtures
(Dirichlet(1), the same for every truth) at the target size 1e9 = 10x the largest fitted size,
with 20 tokens per parameter (the final checkpoint of the training design), against the
noiseless truth:

* ``rel_err``: mean_k |pred_k / true_k - 1|,
* ``acc``: pairwise decision accuracy (``data_mixture.decisions.pairwise_accuracy``),
* ``regret``: true_k(argmin pred) - min_k true_k (loss units) of the law's pick among the 64.

A law that cannot take a table (``mixing_law`` needs the same mixtures at every size) is recorded
as ``refused: <reason>``. Each cell (truth, design, law, seed) is repeated over ``--seeds``
(a seed draws the design's mixtures and the noise) and written to ``robustness.json`` as soon as
it is done; a re-run skips cells already there (delete the file to start afresh). Then
``robustness.md``: the matrix of mean (sd over seeds) relative error and decision accuracy.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import time
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from data_mixture.decisions import pairwise_accuracy
from data_mixture.laws import LAWS, get_law
from data_mixture.synthetic import ROBUST_DOMAINS, ROBUST_TRUTHS, draw_design, synthetic_table, truth_optimum
from data_mixture.table import TableError
from experiments.benchmarks.timing import write_json

SIZES = tuple(float(x) for x in 1e7 * 10 ** (np.arange(4) / 3))  # 1e7, 2.15e7, 4.64e7, 1e8
TARGET = 1e9
CHECKPOINTS = (0.5, 1.0)
TOKENS_PER_PARAM = 20.0
RUNS_PER_SIZE = 16
NOISE = 0.005
TEST_MIXTURES = 64
STARTS = 64
DESIGNS = ("same", "different")
SCALE_INDEPENDENT = ("additive", "regmix_linear")  # laws whose best mixture cannot move with size
FAST = {"truths": ("additive", "capped_domain", "mixture_floor"), "designs": ("different",), "seeds": (0,)}


LAW_SOURCES = "data_mixture/laws/*.py"
FROZEN = "frozen_laws.json"


def law_hashes(root: Path | None = None) -> dict[str, str]:
    """{path: sha256 of its bytes} of every law source (``data_mixture/laws/*.py``): the law forms."""
    root = Path(__file__).resolve().parents[2] if root is None else root
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.glob(LAW_SOURCES))}


def freeze(out: Path) -> dict:
    """Writes ``out/frozen_laws.json``: the law hashes and the UTC time, before any new truth is written."""
    got = {"frozen_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "law_hashes": law_hashes()}
    out.mkdir(parents=True, exist_ok=True)
    (out / FROZEN).write_text(json.dumps(got, indent=1) + "\n")
    return got


def changed_laws(frozen: dict, root: Path | None = None) -> list[str]:
    """The law sources whose hash differs from the frozen one (or that were added or removed)."""
    now, then = law_hashes(root), frozen["law_hashes"]
    return sorted(p for p in set(now) | set(then) if now.get(p) != then.get(p))


def train_table(truth: str, design: str, seed: int):
    """The 128-row runs table of one (truth, design, seed)."""
    cols = draw_design(
        mix_domains=ROBUST_DOMAINS, sizes=SIZES, runs_per_size=RUNS_PER_SIZE, checkpoints=CHECKPOINTS,
        tokens_per_param=TOKENS_PER_PARAM, seed=seed, shared_mixtures=design == "same", concentration=1.0,
    )
    fn = ROBUST_TRUTHS[truth]
    return synthetic_table(lambda v, n, d, m: fn(n, d, m), cols, ROBUST_DOMAINS, noise=NOISE, seed=seed)


def test_mixtures() -> np.ndarray:
    """(64, 4) test mixtures at the target, the same for every truth and seed."""
    return np.random.default_rng(20261203).dirichlet(np.ones(len(ROBUST_DOMAINS)), TEST_MIXTURES)


def score(pred_k: np.ndarray, true_k: np.ndarray) -> dict:
    """Relative error, pairwise decision accuracy and regret of ``pred_k`` against ``true_k``."""
    return {
        "rel_err": float(np.mean(np.abs(pred_k / true_k - 1.0))),
        "acc": pairwise_accuracy(pred_k, true_k),
        "regret": float(true_k[int(np.argmin(pred_k))] - true_k.min()),
    }


def run_cell(truth: str, design: str, law: str, seed: int, starts: int) -> dict:
    """Fits ``law`` on one table and scores it at the target (or records its refusal)."""
    table = train_table(truth, design, seed)
    mix_km = test_mixtures()
    size_k, tokens_k = np.full(len(mix_km), TARGET), np.full(len(mix_km), TARGET * TOKENS_PER_PARAM * CHECKPOINTS[-1])
    t0 = time.perf_counter()
    try:
        fit = get_law(law).fit(table, "valid", starts=starts, seed=seed)
    except TableError as e:
        return {"refused": str(e)}
    pred_k = fit.predict(size_k, tokens_k, mix_km)
    out = score(pred_k, ROBUST_TRUTHS[truth](size_k, tokens_k, mix_km))
    out["fit_seconds"] = round(time.perf_counter() - t0, 2)
    if "objective" in fit.info:
        out["objective"] = fit.info["objective"]
    if law == "camel":
        out["params"] = {k: np.round(np.asarray(v, np.float64), 4).tolist() for k, v in fit.params.items()}
    return out


def truth_info() -> dict:
    """For each truth: its docstring formula and its optimum over the simplex (step 0.05) at the
    smallest fitted size and at the target (20 tokens per parameter), and whether it moves."""
    out = {}
    for name, fn in ROBUST_TRUTHS.items():
        lo = truth_optimum(fn, SIZES[0], SIZES[0] * TOKENS_PER_PARAM, len(ROBUST_DOMAINS))
        hi = truth_optimum(fn, TARGET, TARGET * TOKENS_PER_PARAM, len(ROBUST_DOMAINS))
        out[name] = {"doc": fn.__doc__.strip(), "optimum_smallest": lo.tolist(), "optimum_target": hi.tolist(),
                     "optimum_moves": bool(np.abs(lo - hi).sum() > 1e-9), "optimum_shift_l1": float(np.abs(lo - hi).sum())}
    return out


def cell_key(truth, design, law, seed) -> str:
    return f"{truth}|{design}|{law}|{seed}"


def summarise(cells: dict, truths, designs, laws, seeds) -> dict:
    """{truth|design: {law: {metric: [mean, sd], "n": seeds}} or {"refused": reason}}."""
    out = {}
    for t in truths:
        for d in designs:
            row = {}
            for law in laws:
                got = [cells[k] for s in seeds if (k := cell_key(t, d, law, s)) in cells]
                if not got:
                    continue
                if "refused" in got[0]:
                    row[law] = {"refused": got[0]["refused"]}
                    continue
                row[law] = {m: [float(np.mean([g[m] for g in got])), float(np.std([g[m] for g in got]))] for m in ("rel_err", "acc", "regret")}
                row[law]["n"] = len(got)
            if row:
                out[f"{t}|{d}"] = row
    return out


def goal_check(row: dict) -> dict | None:
    """camel against the best scale-independent law of one table: relative error ratio and
    accuracy difference (None if a piece is missing)."""
    base = [row[b] for b in SCALE_INDEPENDENT if b in row and "rel_err" in row[b]]
    if "camel" not in row or "rel_err" not in row["camel"] or not base:
        return None
    best = min(base, key=lambda r: r["rel_err"][0])
    best_acc = max(r["acc"][0] for r in base)
    return {"rel_err_ratio": row["camel"]["rel_err"][0] / best["rel_err"][0], "acc_diff": row["camel"]["acc"][0] - best_acc,
            "spread": float(np.hypot(row["camel"]["rel_err"][1], best["rel_err"][1]))}


def goal_lines(summary: dict) -> tuple[list[str], bool]:
    """Per table: is camel no worse than the best scale-independent law (relative error ratio <= 1
    and decision accuracy not lower)? Returns the lines and whether it holds on every table."""
    lines, every = [], True
    for key, row in summary.items():
        g = goal_check(row)
        if g is None:
            continue
        ok = g["rel_err_ratio"] <= 1.0 and g["acc_diff"] >= 0.0
        every &= ok
        if not ok:
            why = []
            if g["rel_err_ratio"] > 1.0:
                why.append(f"relative error {g['rel_err_ratio']:.2f}x")
            if g["acc_diff"] < 0:
                why.append(f"accuracy {g['acc_diff']:+.3f}")
            lines.append(f"- {key.replace('|', ', ')}: camel worse ({'; '.join(why)})")
    return lines, every


def markdown(summary: dict, tinfo: dict, laws, meta: dict) -> str:
    lines = [
        f"# Law robustness matrix ({meta['date']}, load {meta['load_before']:.1f} -> {meta['load_after']:.1f}, {meta['cpus']} cpus)",
        "",
        f"Fitted on 4 sizes {SIZES[0]:.0e}..{SIZES[-1]:.0e} x {RUNS_PER_SIZE} mixtures x 2 checkpoints, noise {NOISE:.1%}, "
        f"extrapolated to {TARGET:.0e} (64 test mixtures, 20 tokens/param). Cell: mean relative error % (sd over seeds) / "
        "pairwise decision accuracy; `refused` where the law cannot take the table. `moves`: the truth's optimum over the "
        "simplex differs between the smallest fitted size and the target (L1 shift). Last column: camel's relative error "
        "over the best scale-independent law's (additive, regmix_linear), and camel's accuracy minus the better of theirs.",
        "",
        "| truth | design | moves | " + " | ".join(laws) + " | camel / best s.i. (err ratio, acc diff) |",
        "|---|---|---|" + "---|" * len(laws) + "---|",
    ]
    for key, row in summary.items():
        t, d = key.split("|")
        cells = []
        for law in laws:
            r = row.get(law)
            if r is None:
                cells.append("")
            elif "refused" in r:
                cells.append("refused")
            else:
                cells.append(f"{100 * r['rel_err'][0]:.2f} ({100 * r['rel_err'][1]:.2f}) / {r['acc'][0]:.3f}")
        g = goal_check(row)
        gs = "" if g is None else f"{g['rel_err_ratio']:.2f}, {g['acc_diff']:+.3f}"
        mv = f"yes ({tinfo[t]['optimum_shift_l1']:.2f})" if tinfo[t]["optimum_moves"] else "no"
        lines.append(f"| {t} | {d} | {mv} | " + " | ".join(cells) + f" | {gs} |")
    worse, every = goal_lines(summary)
    lines += ["", "**In sample for camel**: its current form was chosen on these truths (the first form's results: "
              "`robustness_camel_v1.json`). Out-of-sample results, truths written after the law forms were frozen: "
              "`oos.md`.", "",
              "CAMEL no worse than the best scale-independent law (relative error and decision accuracy) on every "
              f"table: **{'yes' if every else 'no'}**."] + ([""] + worse if worse else [])
    lines += ["", "Refusals:", ""]
    seen = set()
    for row in summary.values():
        for law, r in row.items():
            if "refused" in r and law not in seen:
                seen.add(law)
                lines.append(f"- `{law}`: {r['refused'].split('; ')[0]}.")
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--laws", default=",".join(LAWS))
    ap.add_argument("--truths", default=",".join(ROBUST_TRUTHS))
    ap.add_argument("--designs", default=",".join(DESIGNS))
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--starts", type=int, default=STARTS)
    ap.add_argument("--fast", action="store_true", help=f"a small subset: truths {FAST['truths']}, design {FAST['designs']}, seed 0")
    ap.add_argument("--out", default="experiments/studies/results/robustness")
    ap.add_argument("--freeze", action="store_true", help=f"only write {FROZEN} (the law hashes, the time) and exit")
    args = ap.parse_args(argv)
    if args.freeze:
        got = freeze(Path(args.out))
        print(json.dumps(got, indent=1))
        return got
    laws = args.laws.split(",")
    truths, designs, seeds = args.truths.split(","), args.designs.split(","), [int(s) for s in args.seeds.split(",")]
    if args.fast:
        truths, designs, seeds = list(FAST["truths"]), list(FAST["designs"]), list(FAST["seeds"])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "robustness.json"
    result = json.loads(path.read_text()) if path.exists() else {"cells": {}}
    cells = result["cells"]
    todo = [(t, d, law, s) for t in truths for d in designs for s in seeds for law in laws if cell_key(t, d, law, s) not in cells]
    if todo:  # cells are fitted on this host: the file is then this run's (write_json adds it)
        result.pop("host", None)
    load0 = os.getloadavg()[0]
    t0, c0 = time.perf_counter(), time.process_time()
    for t, d, law, s in tqdm(todo, desc="robustness cells"):
        cells[cell_key(t, d, law, s)] = run_cell(t, d, law, s, args.starts)
        write_json(path, result, indent=1, announce=False)  # after every cell: a cut-short run keeps its cells
    tinfo = truth_info()
    all_truths = [t for t in ROBUST_TRUTHS if any(k.startswith(t + "|") for k in cells)]
    all_seeds = sorted({int(k.split("|")[3]) for k in cells})
    summary = summarise(cells, all_truths, DESIGNS, list(LAWS), all_seeds)
    meta = {
        "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"), "cpus": os.cpu_count(), "platform": platform.platform(),
        "load_before": load0, "load_after": os.getloadavg()[0], "seconds_this_run": round(time.perf_counter() - t0, 1),
        "cpu_seconds_this_run": round(time.process_time() - c0, 1), "cells_this_run": len(todo),
        "sizes": SIZES, "target": TARGET, "checkpoints": CHECKPOINTS, "runs_per_size": RUNS_PER_SIZE, "noise": NOISE,
        "test_mixtures": TEST_MIXTURES, "starts": args.starts, "law_hashes": law_hashes(),
    }
    if not todo and "meta" in result:  # nothing new was fitted: keep the date and load of the run that fitted the cells
        meta = result["meta"]
    result.update(meta=meta, truths=tinfo, summary=summary, goal={k: goal_check(r) for k, r in summary.items()})
    write_json(path, result, indent=1, announce=False)
    (out / "robustness.md").write_text(markdown(summary, tinfo, list(LAWS), meta))
    print(markdown(summary, tinfo, list(LAWS), meta))
    print(f"wrote {path} and {out / 'robustness.md'} ({len(todo)} cells in {meta['seconds_this_run']} s)")
    return result


if __name__ == "__main__":
    main()
