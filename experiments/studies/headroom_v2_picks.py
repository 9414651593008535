"""headroom_v2's picks: the ``fit``, ``mergemix`` and ``register`` stages of
``does_recommend_beat_the_practitioner`` (design.json's ``candidates`` and ``dedup``).

- ``fit``       ``data_mixture evaluate`` on the ladder for the target with the largest proxy (s1)
                held out; every law of :data:`LAWS` fitted on the whole ladder with a 50-member
                bootstrap and its robust pick at the target point (``optimize --robust mean``,
                ``--max-epochs math=16``, the scarce pool); ``data_mixture recommend`` with exactly
                the options design.json registered (:func:`recommend_args`).
- ``mergemix``  one expert per domain continued from the gate's uniform s1 run with seed 20 for 10%
                of its tokens, 60 merges searched on the target's held-out losses (16 batches per
                domain, the registered evaluation); the searched optimum is the candidate.
- ``register``  every candidate (:func:`candidates`), the dedup (:func:`dedup`), every law's
                prediction for every candidate and the registered comparisons, written by
                ``data_mixture register`` before any target run (commit it).

headroom_v1's functions are reused (``law_predictions``, ``final_means``, ``sweep``); the paths are
under the study's ``--out`` (committed) and ``--root`` (run directories, not committed).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

from experiments.studies import headroom_v2_setting as study
from experiments.studies import does_the_mixture_matter_with_headroom as v1
from experiments.studies.do_laws_pick_midtrain_mixtures import SEARCH_BUDGET, SEARCH_SEEDS, dm

# v1's laws plus Olmix's log_linear: it needs one size (it ignores size and tokens, so its pick
# does not move with scale), and `recommend` scores it on the same multi-size ladder
# (data_mixture.recommendation.CANDIDATE_LAWS), so it competes for best_other_law_robust as there.
LAWS = (*v1.LAWS, "log_linear")
REP_LAW = v1.REP_LAW  # camel+repfit
SIZE_COLUMN = "params_active"
BOOTSTRAP = 50
MAX_EPOCHS = 16  # recommend's cap on a law's pick, on the scarce pool (design.json: candidates.recommend)
MERGE_SHARE = v1.MERGE_SHARE  # experts train for 10% of the base's tokens
MERGE_BASE = "s1_uniform_s20"  # the gate's uniform run at the largest proxy, seed 20
TV_SHARE = 0.01  # design.json's dedup: within this total variation, candidates share target runs


def target_point() -> tuple[float, float]:
    """(active parameters, tokens) of a target run: s2's, as ``run_entry`` trains it."""
    run = study.run_entry("x", study.TARGET_SIZE, 0, {})
    return float(run["params_active"]), float(run["tokens"])


def pool_args() -> list[str]:
    return [f"{study.SCARCE}={study.POOL_TOKENS}"]


def require_gate(out: Path) -> None:
    """The study stops at a gate that has not passed (design.json's gate rule)."""
    g = out / "gate" / "gate.json"
    if not g.exists() or not json.loads(g.read_text())["passed"]:
        raise SystemExit(f"{g}: the gate has not passed; the study stops at the gate (no later stage without headroom)")


def ladder_csv(out: Path) -> Path:
    path = out / "ladder_runs.csv"
    if not path.exists():
        raise SystemExit(f"{path} does not exist: run --stage ladder first (it writes the ladder's merged table)")
    return path


def recommend_args(out: Path) -> list[str]:
    """``data_mixture recommend``'s arguments, exactly design.json's ``candidates.recommend``."""
    size, tokens = target_point()
    return ["--runs", str(ladder_csv(out)), "--target", study.TARGET, "--size", repr(size), "--size-column",
            SIZE_COLUMN, "--tokens", repr(tokens), "--unique-tokens", *pool_args(), "--bootstrap", str(BOOTSTRAP),
            "--max-epochs", str(MAX_EPOCHS), "--robust", "mean", "--starts", "16", "--resamples", "1000",
            "--seed", "0", "--out", str(out / "recommend"), "--no-progress", "--force"]


def stage_fit(out: Path, root: Path, parallel: int) -> None:
    """Laws scored on the ladder (s1 held out), each law's bootstrapped fit and robust pick at the
    target, and ``recommend``; each step skips what exists."""
    study.registered(out)
    require_gate(out)
    runs = str(ladder_csv(out))
    if not (out / "evaluate_ladder" / "evaluation.json").exists():
        dm("evaluate", "--runs", runs, "--laws", ",".join(LAWS), "--holdout", "largest", "--size-column", SIZE_COLUMN,
           "--target", study.TARGET, "--seed", "0", "--out-dir", str(out / "evaluate_ladder"), "--no-plot", "--force")
    size, tokens = target_point()
    for law in LAWS:
        fit, opt = out / "fits" / f"{law}.json", out / "optima" / f"{law}.json"
        fit.parent.mkdir(parents=True, exist_ok=True)
        opt.parent.mkdir(parents=True, exist_ok=True)
        if not fit.exists():
            dm("fit", "--runs", runs, "--law", law, "--size-column", SIZE_COLUMN, "--target", study.TARGET,
               "--bootstrap", str(BOOTSTRAP), "--seed", "0", "--out", str(fit), "--no-progress")
        if not opt.exists():
            dm("optimize", "--fit", str(fit), "--size", repr(size), "--tokens", repr(tokens), "--unique-tokens",
               *pool_args(), "--max-epochs", f"{study.SCARCE}={MAX_EPOCHS}", "--robust", "mean", "--seed", "0",
               "--out", str(opt))
    if not (out / "recommend" / "mixture.json").exists():
        dm("recommend", *recommend_args(out))


def mergemix_base(root: Path, parallel: int) -> tuple[Path, dict]:
    """The gate's uniform s1 run with seed 20 (``root/gate/<name>``), trained by the sweep from the
    gate plan's entry when its directory is absent (the sweep skips a finished run)."""
    plan = study.gate_plan()
    run = next(r for r in plan["runs"] if r["name"] == MERGE_BASE)
    sub = root / "chunks" / "mergemix_base.json"
    sub.parent.mkdir(parents=True, exist_ok=True)
    sub.write_text(json.dumps({**plan, "runs": [run]}, indent=1))
    v1.sweep(sub, root / "gate", parallel, study.EVAL_ARGS)
    return root / "gate" / run["name"], run


def mergemix_args(out: Path, root: Path, base: Path, run: dict, parallel: int) -> list[str]:
    """MergeMix as registered: 10% of the base's tokens per expert, 60 merges, the target's losses
    over the registered 16 held-out batches per domain (no benchmark in the objective)."""
    return ["--base", str(base), "--domains", ",".join(study.DOMAINS), "--expert-tokens", repr(MERGE_SHARE * run["tokens"]),
            "--fractions", "1", "--experts-dir", str(root / "experts"), "--parallel", str(parallel), "--search", "mergemix",
            "--budget", str(SEARCH_BUDGET), "--seeds", str(SEARCH_SEEDS), *v1.mergemix_objectives(study.TARGET)["loss"],
            "--loss-batches", str(study.EVAL["heldout_batches_per_domain"]), "--cache", str(root / "cache_mergemix.jsonl"),
            "--out", str(out / "mergemix" / "search_loss"), "--no-progress"]


def stage_mergemix(out: Path, root: Path, parallel: int) -> None:
    study.registered(out)
    require_gate(out)
    if (out / "mergemix" / "search_loss" / "summary.json").exists():
        print("mergemix: search_loss/summary.json exists (kept)")
        return
    base, run = mergemix_base(root, parallel)
    (out / "mergemix").mkdir(parents=True, exist_ok=True)
    dm("mergemix", *mergemix_args(out, root, base, run, parallel))
    if (root / "experts" / "sweep.log").exists():  # the experts' own wall times, for the record
        shutil.copyfile(root / "experts" / "sweep.log", out / "mergemix" / "sweep_experts.log")


# ---- the candidates, the dedup and the registration ----

def _weights(path: Path, key: str = "weights") -> dict[str, float]:
    if not path.exists():
        raise SystemExit(f"{path} does not exist: run the stage that writes it (fit or mergemix) first")
    w = json.loads(path.read_text())[key]
    return {d: float(w.get(d, 0.0)) for d in study.DOMAINS}


def best_other_law(out: Path) -> tuple[str, float]:
    """The law other than CAMEL and its variants with the highest held-out decision accuracy on the
    ladder (then the lowest MAE, as ``recommend`` breaks ties)."""
    laws = json.loads((out / "evaluate_ladder" / "evaluation.json").read_text())["laws"]
    scored = {k: v for k, v in laws.items() if not k.startswith("camel")
              and (v.get("decision") or {}).get("accuracy") is not None}
    if not scored:
        raise SystemExit(f"{out / 'evaluate_ladder' / 'evaluation.json'}: no law other than CAMEL was scored")
    name = max(scored, key=lambda k: (scored[k]["decision"]["accuracy"], -(scored[k]["mean"].get("mae") or 0.0)))
    return name, float(scored[name]["decision"]["accuracy"])


def candidates(out: Path) -> dict[str, dict]:
    """design.json's candidates {name: {"weights", "why"}} in its order, from the committed files."""
    from data_mixture.baselines import UNIMAX_MAX_EPOCHS, capped_mixture, unimax_weights
    from data_mixture.optimize import available_tokens
    from data_mixture.table import read_runs
    from data_mixture.target import parse_target

    _, tokens = target_point()
    aim = parse_target(study.TARGET).loss_domains()  # the target's weights: code 0.4, math 0.6
    doms = list(study.DOMAINS)
    pool = {**available_tokens(dataset="builtin", domains=doms), study.SCARCE: float(study.POOL_TOKENS)}
    u_m = np.array([pool[d] for d in doms], np.float64)
    cap_pool_m = np.array([float(study.POOL_TOKENS) if d == study.SCARCE else np.inf for d in doms])

    def capped(pref: dict[str, float]) -> dict[str, float]:
        w_m, _ = capped_mixture([pref[d] for d in doms], cap_pool_m, tokens, study.PRACTITIONER_K)
        return dict(zip(doms, w_m.tolist()))

    table = read_runs(str(ladder_csv(out)))
    proxy = study.PROXIES[-1]
    weights, values = v1.final_means(table, study._sizes()[proxy]["params_active"], study.TARGET)
    seeds = len({r["seed"] for r in study.ladder_plan()["runs"] if r["preset"] == proxy})
    full = {k: v for k, v in values.items() if len(v) == seeds}
    if not full:
        raise SystemExit(f"{ladder_csv(out)}: no ladder mixture at {proxy} has its {seeds} seeds")
    best = min(full, key=lambda k: float(np.mean(full[k])))
    other, acc = best_other_law(out)
    k = f"{study.PRACTITIONER_K:g}"
    got = {
        "uniform": {"weights": {d: 1.0 / len(doms) for d in doms}, "why": "0.25 each"},
        "proportional": {"weights": dict(zip(doms, (u_m / u_m.sum()).tolist())),
                         "why": f"unique tokens at the target: {study.SCARCE} its pool, the others their built-in train split"},
        "unimax": {"weights": dict(zip(doms, unimax_weights(u_m, tokens, UNIMAX_MAX_EPOCHS).tolist())),
                   "why": f"UniMax at the target's {tokens:.4g} tokens, {UNIMAX_MAX_EPOCHS:g}-epoch cap"},
        "best_at_proxy": {"weights": weights[best], "why": f"{best}: the lowest mean target loss at {proxy} ({seeds} seeds)"},
        "target_capped_16": {"weights": capped({d: aim.get(d, 0.0) for d in doms}),
                             "why": f"the target's weights, {study.SCARCE} capped at {k} epochs of its pool at the target"},
        "proxy_capped_16": {"weights": capped(weights[best]),
                            "why": f"best_at_proxy ({best}) with {study.SCARCE} capped at {k} epochs at the target"},
        "recommend": {"weights": _weights(out / "recommend" / "mixture.json"),
                      "why": "recommend's pick: " + json.loads((out / "recommend" / "mixture.json").read_text())["source"]},
        "camel_robust": {"weights": _weights(out / "optima" / "camel.json"),
                         "why": f"camel's robust pick ({BOOTSTRAP} members, mean)"},
        "best_other_law_robust": {"weights": _weights(out / "optima" / f"{other}.json"), "law": other,
                                  "why": f"{other}'s robust pick: held-out decision accuracy {acc:.3f} with {proxy} "
                                         "held out, the best among the laws other than CAMEL"},
        "repetition_law": {"weights": _weights(out / "optima" / f"{REP_LAW}.json"),
                           "why": f"{REP_LAW}'s robust pick (the repetition-aware law)"},
        "mergemix": {"weights": _weights(out / "mergemix" / "search_loss" / "summary.json", "mixture"),
                     "why": f"MergeMix's searched optimum (experts from {MERGE_BASE})"},
    }
    return got


def total_variation(a: dict[str, float], b: dict[str, float]) -> float:
    return 0.5 * sum(abs(a.get(d, 0.0) - b.get(d, 0.0)) for d in study.DOMAINS)


def dedup(mixtures: dict[str, dict[str, float]], within: float = TV_SHARE) -> dict[str, str]:
    """{candidate: the candidate whose target runs it shares} (itself when it has its own): in the
    registered order, a candidate within ``within`` total variation of an earlier one with runs of
    its own shares that one's runs (the nearest, if several)."""
    owners: list[str] = []
    got = {}
    for name, w in mixtures.items():
        near = [(total_variation(w, mixtures[o]), o) for o in owners if total_variation(w, mixtures[o]) <= within + 1e-12]
        if near:
            got[name] = min(near)[1]
        else:
            owners.append(name)
            got[name] = name
    return got


def comparisons() -> dict[str, list[list[str]]]:
    """The registered families: design.json's primary pairs; the secondary family as it is worded
    (every method pick with every baseline, not already primary, and camel_robust with the other two
    laws' picks)."""
    primary = [list(p) for p in study.DECISION["primary_family"]]
    methods = ("camel_robust", "best_other_law_robust", "repetition_law", "mergemix", "recommend")
    baselines = ("uniform", "proportional", "unimax", "best_at_proxy", "target_capped_16", "proxy_capped_16")
    secondary = [[m, b] for m in methods for b in baselines if [m, b] not in primary]
    secondary += [["camel_robust", "best_other_law_robust"], ["camel_robust", "repetition_law"]]
    return {"primary": primary, "secondary": secondary}


def decision_rule() -> str:
    d = study.DECISION
    return f"metric: {d['metric']}; test: {d['test']}; correction: {d['correction']}; verdict: {d['verdict']}"


def stage_register(out: Path, root: Path, parallel: int) -> None:
    """candidates.json (each pick, why, and whose runs it shares), the registered mixtures (each
    candidate's shared mixture, what its target runs train), every law's prediction for them, the
    comparisons, and ``data_mixture register``; commit the registration before --stage target."""
    study.registered(out)
    require_gate(out)
    path = out / "registration.json"
    if path.exists():
        print(f"register: {path} exists (kept; a registration is never rewritten)")
        return
    missing = [law for law in LAWS if not (out / "fits" / f"{law}.json").exists()]
    if missing:  # regmix's forests are not committed (.gitignore): --stage fit refits what is missing
        raise SystemExit(f"fits of {', '.join(missing)} missing under {out / 'fits'}: run --stage fit first")
    chosen = candidates(out)
    owner = dedup({n: c["weights"] for n, c in chosen.items()})
    for name, c in chosen.items():
        c["shares_runs_with"] = owner[name] if owner[name] != name else None
        c["tv_to_shared"] = total_variation(c["weights"], chosen[owner[name]]["weights"])
    (out / "candidates.json").write_text(json.dumps(chosen, indent=1) + "\n")
    trained = {n: chosen[owner[n]]["weights"] for n in chosen}
    (out / "candidate_mixtures.json").write_text(json.dumps(trained, indent=1) + "\n")
    size, tokens = target_point()
    predictions = v1.law_predictions(out, {"target_unique": {study.SCARCE: study.POOL_TOKENS}}, trained, laws=LAWS,
                                     point=(size, tokens))
    (out / "predictions.json").write_text(json.dumps(predictions, indent=1) + "\n")
    families = comparisons()
    (out / "comparisons.json").write_text(json.dumps(families, indent=1) + "\n")
    pairs = out / "comparison_pairs.json"
    pairs.write_text(json.dumps(families["primary"] + families["secondary"]) + "\n")
    dm("register", "--rule", decision_rule(), "--candidates", str(out / "candidate_mixtures.json"), "--predictions",
       str(out / "predictions.json"), "--comparisons", str(pairs), "--size", repr(size), "--tokens", repr(tokens),
       "--size-column", SIZE_COLUMN, "--metric", study.TARGET, "--out", str(path))
    print(f"register: wrote {path}; commit it (git add {out} && git commit) before --stage target")
