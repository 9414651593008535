"""Olmix's public swarms (allenai/olmix, Apache-2.0) converted into runs tables.

    git --git-dir=<olmix clone>/.git show 218dbc77692c43060e7dc5f56fb05a4d42cb2cdf:dclm_ratios.csv > src/dclm_ratios.csv
    ...  (the same for dclm_metrics.csv, full_recomputation_{ratios,metrics}.csv and LICENSE)
    ./launch.sh python -m experiments.tools.olmix_swarms --source src [--out experiments/benchmarks/results/olmix_swarms]

or straight from a clone: ``--git-dir <olmix>/.git`` (reads the files at :data:`COMMIT` with ``git
show``). Writes ``<swarm>_runs.csv`` for each swarm of :data:`SWARMS`, ``metadata.json`` (source
repository, commit, file paths and their sha256, every conversion rule below) and ``LICENSE`` (the
source's Apache-2.0 text, copied). The committed output: ``experiments/benchmarks/results/olmix_swarms/``.

What the source files are (read from Olmix's README, ``configs/fits/*.yaml`` and ``olmix/fit/`` at
the commit, and its dataset card): one row per proxy run; ``*_ratios.csv`` holds the run's mixture
(one column per domain, each row on the simplex), ``*_metrics.csv`` its bits-per-byte (BPB, lower is
better) on 110 downstream tasks (the OLMES/Minerva/MBPP suites, offline evaluation); the files join
on ``run`` (the W&B run id) and also carry ``name`` (the swarm's run name) and ``index``. Every run is
a 30M-parameter OLMo model trained for 5x Chinchilla (20 x 5 = 100 tokens per parameter: 3B
tokens; the run names say ``5xC-30m``, the dataset card "30M parameter proxy models trained on 3B
tokens"). ``dclm``: 127 runs over 24 DCLM WebOrganizer topics; ``full_recomputation``: 512 runs
over 64 domains (DCLM topics, s2pdf topics, stack-edu languages, arxiv, finemath, pes2o, wikipedia).

Conversion (each rule is recorded in ``metadata.json``):

* ``run`` = Olmix's ``name``; its W&B id kept as ``olmix_run``. ``params_total`` = ``params_active``
  = 3e7 and ``tokens`` = 3e9: the nominal sizes Olmix itself uses (``olmix/aliases.py``: olmo 30m =
  30,000,000; ``compute_max_tokens``: 20 x params x multiple), not exact parameter counts. No seed
  column: each mixture was run once.
* Names: every run of colons becomes one dot (``dclm:adult_content`` -> ``mix:dclm.adult_content``,
  ``arc_challenge:rc::olmes`` -> ``loss:arc_challenge.rc.olmes``) so that the names pass through
  ``--target`` (``name=weight,...``) unchanged in meaning. Losses are BPB (bits), not nats; the laws
  fit log-losses, so the unit does not matter to a fit.
* Weights written with 10 significant digits (rows renormalised on reading, as for any table),
  BPB with 6 (rounding error <= 5e-6 relative; the runs' BPB differ by 1e-2 and more).
* Aggregate validation domains, added after the 110 task columns, as Olmix's fit configs define its
  objective (``configs/fits/dclm_per_family.yaml``, ``olmix/fit/core.py``): MMLU's 57 subjects
  collapse into 4 categories (``mmlu_stem``, ``mmlu_other``, ``mmlu_social_sciences``,
  ``mmlu_humanities``: weighted means, the weights of Olmix's ``aggregate_mmlu``, each subject's
  share of its category, :data:`MMLU_WEIGHTS`); 5 tasks are dropped from the objective
  (:data:`DROPPED`); that leaves 52 metrics in three families, math (7 Minerva tasks), code (19:
  HumanEval, MBPP and 17 MultiPL-E MBPP languages) and qa (the other 26, the MMLU categories among
  them). ``loss:mean_bpb`` is the unweighted mean of the 52 (the average Olmix optimises, its
  ``opt_avg_all_metrics``; its per-family objective weights 7/52, 19/52, 26/52 are the same mean);
  ``loss:family_math``, ``loss:family_code``, ``loss:family_qa`` are the family means (Olmix's
  ``aggregate_task_families``).
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import io
import json
import re
import subprocess
from pathlib import Path

import numpy as np

REPO = "allenai/olmix"
COMMIT = "218dbc77692c43060e7dc5f56fb05a4d42cb2cdf"
LICENSE_NAME = "Apache-2.0"
SWARMS = {"dclm": "dclm", "full_recomputation": "full_recomputation"}  # output name -> source file prefix
PARAMS = 3e7
TOKENS = 3e9
DEFAULT_OUT = Path("experiments/benchmarks/results/olmix_swarms")
META_COLUMNS = ("", "run", "name", "index")  # the leading columns of both source files
DROPPED = ("qasper_yesno:rc::olmes", "sciriff_yesno:rc::olmes", "lab_bench_dbqa", "lab_bench_protocolqa", "medqa_en:rc::none")
FAMILIES = ("math", "code", "qa")

# Olmix's aggregate_mmlu (olmix/fit/utils.py at COMMIT): each MMLU subject's weight within its category.
MMLU_WEIGHTS: dict[str, dict[str, float]] = {
    "mmlu_stem": {
        "abstract_algebra": 0.03313452617627568, "astronomy": 0.05036447978793903, "college_biology": 0.04771371769383698,
        "college_chemistry": 0.03313452617627568, "college_computer_science": 0.03313452617627568,
        "college_mathematics": 0.03313452617627568, "college_physics": 0.033797216699801194, "computer_security": 0.03313452617627568,
        "conceptual_physics": 0.07786613651424784, "electrical_engineering": 0.04804506295559974,
        "elementary_mathematics": 0.12524850894632206, "high_school_biology": 0.10271703114645461,
        "high_school_chemistry": 0.06726308813783963, "high_school_computer_science": 0.03313452617627568,
        "high_school_mathematics": 0.08946322067594434, "high_school_physics": 0.050033134526176276,
        "high_school_statistics": 0.07157057654075547, "machine_learning": 0.03711066931742876,
    },
    "mmlu_other": {
        "anatomy": 0.04164096236890808, "business_ethics": 0.030845157310302282, "clinical_knowledge": 0.08173966687230105,
        "college_medicine": 0.05336212214682295, "global_facts": 0.030845157310302282, "human_aging": 0.06878470080197409,
        "management": 0.03177051202961135, "marketing": 0.07217766810610735, "medical_genetics": 0.030845157310302282,
        "miscellaneous": 0.24151758173966686, "nutrition": 0.09438618136952498, "professional_accounting": 0.08698334361505243,
        "professional_medicine": 0.08389882788402221, "virology": 0.05120296113510179,
    },
    "mmlu_social_sciences": {
        "econometrics": 0.03704907377315567, "high_school_geography": 0.06434839129021774,
        "high_school_government_and_politics": 0.06272343191420214, "high_school_macroeconomics": 0.12674683132921677,
        "high_school_microeconomics": 0.07734806629834254, "high_school_psychology": 0.17712057198570036,
        "human_sexuality": 0.04257393565160871, "professional_psychology": 0.19889502762430938,
        "public_relations": 0.03574910627234319, "security_studies": 0.07962300942476438, "sociology": 0.0653233669158271,
        "us_foreign_policy": 0.032499187520311994,
    },
    "mmlu_humanities": {
        "formal_logic": 0.026780021253985122, "high_school_european_history": 0.03506907545164718,
        "high_school_us_history": 0.04335812964930925, "high_school_world_history": 0.050371944739638685,
        "international_law": 0.0257173219978746, "jurisprudence": 0.022954303931987247, "logical_fallacies": 0.034643995749202974,
        "moral_disputes": 0.07353878852284804, "moral_scenarios": 0.1902231668437832, "philosophy": 0.06609989373007438,
        "prehistory": 0.06886291179596174, "professional_law": 0.32603613177470775, "world_religions": 0.03634431455897981,
    },
}


class ConvertError(ValueError):
    """A source file that does not look like Olmix's swarm CSVs (names the file, row and column)."""


def clean(name: str) -> str:
    """Olmix's column name as a runs-table domain name: each run of colons becomes one dot."""
    return re.sub(r":+", ".", name.strip())


def mmlu_column(subject: str) -> str:
    return f"mmlu_{subject}:rc::olmes"


def family_of(task: str) -> str:
    """math, code or qa (Olmix's fit configs): Minerva tasks are math; HumanEval, MBPP and the
    MultiPL-E MBPP languages code; the rest qa."""
    if task.startswith("minerva_math_"):
        return "math"
    if task.startswith(("codex_humaneval", "mbpp", "mt_mbpp")):
        return "code"
    return "qa"


def objective_metrics(tasks: list[str]) -> dict[str, list[str]]:
    """{family: [metric]} of the 52 metrics Olmix's objective averages: the tasks without MMLU's
    subjects and without :data:`DROPPED`, plus the 4 MMLU categories (in qa)."""
    subjects = {mmlu_column(s) for w in MMLU_WEIGHTS.values() for s in w}
    missing = sorted((subjects | set(DROPPED)) - set(tasks))
    if missing:
        raise ConvertError(f"metrics file lacks task column(s) {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}; "
                           "expected Olmix's 110 BPB task columns.")
    out: dict[str, list[str]] = {f: [] for f in FAMILIES}
    for t in tasks:
        if t not in subjects and t not in DROPPED:
            out[family_of(t)].append(clean(t))
    out["qa"] += list(MMLU_WEIGHTS)
    return out


def _read_csv(text: str, what: str) -> tuple[list[str], list[list[str]]]:
    rows = [r for r in csv.reader(io.StringIO(text)) if r]
    if not rows:
        raise ConvertError(f"{what}: empty file.")
    header, body = rows[0], rows[1:]
    if tuple(header[:4]) != META_COLUMNS:
        raise ConvertError(f"{what}: the header starts {header[:4]}; expected Olmix's {list(META_COLUMNS)} then one column per domain or task.")
    bad = [i + 2 for i, r in enumerate(body) if len(r) != len(header)]
    if bad:
        raise ConvertError(f"{what}: line(s) {bad[:5]} do not have the header's {len(header)} cells.")
    return header, body


def _floats(body: list[list[str]], what: str, header: list[str]) -> np.ndarray:
    try:
        x = np.array([[float(c) for c in r[4:]] for r in body], np.float64)
    except ValueError as e:
        raise ConvertError(f"{what}: a cell is not a number ({e}).") from None
    if not np.isfinite(x).all():
        i, j = np.argwhere(~np.isfinite(x))[0]
        raise ConvertError(f"{what}: line {i + 2}, column {header[4 + j]!r} is {x[i, j]!r}; every cell must be a finite number.")
    return x


def convert(ratios_text: str, metrics_text: str, *, what: str = "swarm") -> dict[str, list[str]]:
    """The runs-table columns (name -> CSV cells) of one swarm (see the module docstring)."""
    r_head, r_body = _read_csv(ratios_text, f"{what} ratios")
    m_head, m_body = _read_csv(metrics_text, f"{what} metrics")
    runs_r, runs_m = [r[1] for r in r_body], [r[1] for r in m_body]
    if runs_r != runs_m:
        raise ConvertError(f"{what}: the ratios and metrics files list different runs (or in another order); first difference at line "
                           f"{next((i + 2 for i, (a, b) in enumerate(zip(runs_r, runs_m)) if a != b), min(len(runs_r), len(runs_m)) + 2)}.")
    mix = _floats(r_body, f"{what} ratios", r_head)
    bpb = _floats(m_body, f"{what} metrics", m_head)
    if (mix < 0).any() or np.abs(mix.sum(1) - 1).max() > 1e-6:
        raise ConvertError(f"{what} ratios: weights must be >= 0 and sum to 1 per row (max deviation {np.abs(mix.sum(1) - 1).max():.3g}).")
    if (bpb <= 0).any():
        raise ConvertError(f"{what} metrics: every BPB must be > 0.")
    domains, tasks = r_head[4:], m_head[4:]
    cols: dict[str, list[str]] = {
        "run": [r[2] for r in r_body],
        "params_total": [f"{PARAMS:g}"] * len(r_body),
        "params_active": [f"{PARAMS:g}"] * len(r_body),
        "tokens": [f"{TOKENS:g}"] * len(r_body),
    }
    for j, d in enumerate(domains):
        cols["mix:" + clean(d)] = [f"{v:.10g}" for v in mix[:, j]]
    fams = objective_metrics(tasks)
    values = {clean(t): bpb[:, j] for j, t in enumerate(tasks)}
    for cat, weights in MMLU_WEIGHTS.items():
        values[cat] = sum(w * bpb[:, tasks.index(mmlu_column(s))] for s, w in weights.items())
    values["mean_bpb"] = np.mean([values[c] for f in FAMILIES for c in fams[f]], axis=0)
    for f in FAMILIES:
        values[f"family_{f}"] = np.mean([values[c] for c in fams[f]], axis=0)
    for name, v in values.items():
        cols["loss:" + name] = [f"{x:.6g}" for x in v]
    cols["olmix_run"] = runs_r
    return cols


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def read_source(source: Path | None, git_dir: Path | None, name: str) -> str:
    """One source file's text: ``source/name``, or ``name`` at :data:`COMMIT` of the clone ``git_dir``."""
    if git_dir is not None:
        out = subprocess.run(["git", f"--git-dir={git_dir}", "show", f"{COMMIT}:{name}"], capture_output=True, text=True)
        if out.returncode:
            raise ConvertError(f"git show {COMMIT}:{name} in {git_dir} failed: {out.stderr.strip()}")
        return out.stdout
    assert source is not None
    path = source / name
    if not path.is_file():
        raise ConvertError(f"{path} does not exist; extract it with git show {COMMIT}:{name} from a clone of {REPO}.")
    return path.read_text(encoding="utf-8")


def metadata(shas: dict[str, str], shapes: dict[str, dict]) -> dict:
    return {
        "source": {"repository": f"https://github.com/{REPO}", "commit": COMMIT, "license": LICENSE_NAME, "files_sha256": shas,
                   "note": "the swarm CSVs were removed from the repository after this commit"},
        "converted_by": "experiments/tools/olmix_swarms.py",
        "tables": shapes,
        "sizes": {"params_total": PARAMS, "params_active": PARAMS, "tokens": TOKENS,
                  "why": "nominal: olmix/aliases.py (olmo 30m = 30,000,000 parameters), 5x Chinchilla = 20 x 5 tokens per parameter"},
        "names": "each run of colons in an Olmix column name becomes one dot",
        "precision": {"mix": "10 significant digits", "loss": "6 significant digits (BPB)"},
        "aggregates": {
            "mmlu_<category>": "weighted mean of the category's subjects, weights of Olmix's aggregate_mmlu (share of the category)",
            "dropped_from_objective": [clean(t) for t in DROPPED],
            "mean_bpb": "unweighted mean of the 52 objective metrics (family_math's 7, family_code's 19, family_qa's 26)",
            "family_<f>": "unweighted mean of the family's objective metrics",
        },
    }


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--source", type=Path, help="folder holding the four CSVs and LICENSE extracted at the commit")
    src.add_argument("--git-dir", type=Path, help="git directory of a clone of allenai/olmix (read at the commit)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    from data_mixture.table import read_runs  # validates what was written

    args.out.mkdir(parents=True, exist_ok=True)
    shas, shapes = {}, {}
    for out_name, prefix in SWARMS.items():
        texts = {k: read_source(args.source, args.git_dir, f"{prefix}_{k}.csv") for k in ("ratios", "metrics")}
        shas.update({f"{prefix}_{k}.csv": _sha(t) for k, t in texts.items()})
        cols = convert(texts["ratios"], texts["metrics"], what=out_name)
        path = args.out / f"{out_name}_runs.csv"
        with open(path, "w", newline="") as f:
            w = csv.writer(f, lineterminator="\n")
            w.writerow(list(cols))
            w.writerows(zip(*cols.values()))
        table = read_runs(path)
        shapes[path.name] = {"runs": len(table), "mix_domains": len(table.mix_domains), "loss_domains": len(table.loss_domains),
                             "task_columns": len(table.loss_domains) - 8}
        print(f"{path}: {len(table)} runs, {len(table.mix_domains)} training domains, {len(table.loss_domains)} validation domains")
    license_text = read_source(args.source, args.git_dir, "LICENSE")
    shas["LICENSE"] = _sha(license_text)
    (args.out / "LICENSE").write_text(license_text)
    meta = metadata(shas, shapes)
    (args.out / "metadata.json").write_text(json.dumps(meta, indent=1) + "\n")
    return meta


if __name__ == "__main__":
    main()
