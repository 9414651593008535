"""The second headroom study: does ``recommend``'s pick beat the practitioner's rule at a target 10x
beyond its proxies?

    python -m experiments.studies.does_recommend_beat_the_practitioner --stage design   # once, then commit

headroom_v1 (``does_the_mixture_matter_with_headroom``) answered "yes, CAMEL's pick beats uniform and
the trivial choices", but its setting was chosen over four gate attempts, its target was 2.2x the
largest proxy's parameters (4.7x its training FLOPs), its candidates lacked the rule a careful
practitioner uses, and each target loss came from 2 held-out batches. This study fixes its whole
setting in ``design.json`` **before its first run**: the corpus and the scarce domain, the pool, the
target, the sizes and budgets, the seeds, the gate rule, the ladder, the candidates, the decision
rule and the multiple-comparison correction. Every constant below is written into that file, and
``tests/test_headroom_v2_design.py`` fails when a constant here no longer matches the committed
file or the file no longer matches its sha256: a setting changed after the registration shows.

What headroom_v1 taught, and how this setting uses it (nothing here was chosen from a run of
this study; there is none before ``design.json``):

- The scarce pool's repetition moved the optimum more than model size did; so the target is
  sized so that the 16-epoch cap binds at the target and not at the largest proxy.
- The smallest size at 20 tokens per parameter ends in the middle of a domain's drop (seed sd
  0.13-0.28 there); v1's smallest size trained for 40 tokens per parameter: so does this one's.
- Two held-out batches per domain left the evaluation's own noise unmeasured: every evaluation
  here reads 16 batches per domain, sampled across the held-out split, with its standard error.
- 45 comparisons were read without correction: here one primary family of 4 comparisons answers
  the question, Holm-corrected, and every other comparison is secondary, Holm-corrected in its own
  family.

What differs from v1 (so this is a new test, not a replay): the scarce domain (``math``, not
``knowledge``), the target (``math=0.6,code=0.4``, not ``knowledge=0.75,prose=0.25``), the proxies
(``s0``, ``s0b``, ``s1``) and the target's distance (11.9x the largest proxy's training FLOPs).

Stages (each skips what exists; results under ``experiments/studies/results/headroom_v2/``):

1. ``design``   writes ``design.json`` (this module's constants, their sha256). It keeps a file of
                its own version, refuses to replace one once any stage has trained, and records
                each amendment made before the first run in ``AMENDMENTS``. Committed before any
                other stage runs.
2. ``gate``     (next) the registered gate, once. A failure ends the study: "no headroom in this
                setting", with its numbers.
3. ``ladder``, ``fit``, ``mergemix``, ``register``, ``target``, ``report``: as registered in
   ``design.json`` (the same stages as v1, with the practitioner rules, ``recommend`` and the robust
   picks among the candidates; ``data_mixture register`` records every candidate and every law's
   prediction before the first target run).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import time
from pathlib import Path

OUT = Path(__file__).resolve().parent / "results" / "headroom_v2"
RUN_STAGES = ("gate", "ladder", "mergemix", "target")  # result folders of the stages that train
DESIGN_VERSION = 2
AMENDMENTS = (  # each before any run of this study, with why
    "version 2 (2026-12-06, before any run): recommend's options written out instead of 'at its default', because "
    "recommend's defaults changed after version 1 (a 16-epoch cap on the law's pick, --max-epochs 16); the options "
    "pinned are that command's defaults when version 2 was written. Nothing else changed.",
)

CORPUS = "built-in (moejax.data, cache version builtin-v1, seed 0): code, prose, math, knowledge"
DOMAINS = ("code", "prose", "math", "knowledge")
SCARCE = "math"
POOL_TOKENS = 300_000  # unique tokens of the math pool, the same for every run (a fixed pool, as v1 from attempt 3)
TARGET = "math=0.6,code=0.4"  # the target's weighted held-out loss: a model for arithmetic and code
CONFIG = "experiments/configs/tiny_moe.py"
BATCH, SEQ_LEN = 16, 256
HEADS = {"model.num_kv_heads": 1}
PRESETS = {  # s0, s1, s2 as headroom_v1's (do_laws_pick_midtrain_mixtures.PRESETS); s0b is new
    "s0": {"model.d_model": 32, "model.num_layers": 2, "model.num_heads": 2, **HEADS, "model.mlp_dim": 128,
           "model.moe.expert_dim": 64, "model.moe.shared_expert_dim": 64},
    "s0b": {"model.d_model": 48, "model.num_layers": 2, "model.num_heads": 2, **HEADS, "model.mlp_dim": 192,
            "model.moe.expert_dim": 96, "model.moe.shared_expert_dim": 96},
    "s1": {"model.d_model": 64, "model.num_layers": 2, "model.num_heads": 2, **HEADS, "model.mlp_dim": 256,
           "model.moe.expert_dim": 128, "model.moe.shared_expert_dim": 128},
    "s2": {"model.d_model": 96, "model.num_layers": 3, "model.num_heads": 3, **HEADS, "model.mlp_dim": 384,
           "model.moe.expert_dim": 192, "model.moe.shared_expert_dim": 192},
}
PROXIES = ("s0", "s0b", "s1")
TARGET_SIZE = "s2"
TOKENS_PER_PARAM = {"s0": 40.0, "s0b": 20.0, "s1": 20.0, "s2": 24.0}  # per active parameter
MIN_TARGET_FLOPS_RATIO = 10.0  # the target's 6 N_active D over the largest proxy's, at least
EVAL = {"heldout_batches_per_domain": 16, "windows": "sampled across the whole held-out split, fixed by seed",
        "report": "the evaluation's own standard error beside the loss and beside the seed sd",
        "checkpoint": "final"}

GATE = {
    "sizes": ("s0", "s1"),
    "seeds": (20, 21, 22),
    "mixtures": {  # code, prose, math, knowledge; fixed here, before any run
        "uniform": (0.25, 0.25, 0.25, 0.25),
        "target_weights": (0.4, 0.0, 0.6, 0.0),
        "code_rich": (0.8, 0.1, 0.1, 0.0),
    },
    "rule": ("pass when, at each of the two sizes, the mixture with the lowest mean target loss over the 3 seeds beats "
             "uniform by at least 4 per-pair seed sd (the sd over seeds of the paired difference best - uniform); "
             "whether the best mixture differs between the two sizes is reported, not gated on (requiring it would "
             "select settings that favour the laws). It runs once. A failure ends the study with 'no headroom in "
             "this setting' and its numbers; no other setting is tried."),
}
LADDER = {
    "mixtures": 12, "design": "space-filling over the 4-domain simplex (data_mixture plan's, seed 0)",
    "sizes": PROXIES, "seeds": {"s0": (0,), "s0b": (0,), "s1": (0, 1)},
    "pool": f"every run trains on the fixed {SCARCE} pool of {POOL_TOKENS} unique tokens (repeated as its mixture needs)",
}
TARGET_SEEDS = (0, 1, 2)
PRACTITIONER_K = 16.0
CANDIDATES = {
    "uniform": "0.25 each",
    "proportional": "in proportion to each domain's unique tokens at the target (math: the pool; the others: their train split)",
    "unimax": "UniMax at the target's budget, 4-epoch cap (data_mixture.baselines.unimax_weights)",
    "best_at_proxy": "the ladder mixture with the lowest mean target loss at s1 (2 seeds)",
    "target_capped_16": ("the target's weights on the training domains (code 0.4, math 0.6), math capped at 16 epochs of "
                         "its pool at the target's budget, the excess to code (data_mixture.baselines.capped_mixture). K=16 "
                         "over 4: v1's best mixtures repeated the scarce pool 15-18 times, and Muennighoff et al. find "
                         "repeated tokens keep some value up to about 16 epochs"),
    "proxy_capped_16": "best_at_proxy's mixture with the same 16-epoch cap at the target's budget",
    "recommend": ("data_mixture recommend --runs <ladder runs.csv> --target math=0.6,code=0.4 --size <s2 params_active> "
                  "--size-column params_active --tokens <s2 tokens> --unique-tokens math=300000 --bootstrap 50 "
                  "--max-epochs 16 --robust mean --starts 16 --resamples 1000 --seed 0: its recommended mixture, "
                  "whichever it is (a law's robust pick or the practitioner rule)"),
    "camel_robust": "CAMEL fitted on the ladder, robust pick (mean over 50 bootstrap members) at the target",
    "best_other_law_robust": ("the law other than CAMEL and its variants with the highest held-out decision accuracy on "
                              "the ladder (s1 held out), its robust pick at the target"),
    "repetition_law": "camel+repfit (the repetition-aware law), robust pick at the target",
    "mergemix": ("MergeMix: one expert per domain continued from the gate's uniform s1 run (seed 20) for 10% of its "
                 "tokens, 60 merges searched on the target's losses, the searched optimum"),
}
DEDUP = ("candidates whose mixtures lie within 0.01 total variation of one another share their target runs "
         "(each keeps its name in the report)")
DECISION = {
    "metric": f"the target's weighted held-out loss ({TARGET}) at the final checkpoint",
    "test": ("paired by train seed over the 3 target seeds: X - Y, two-sided paired t-test (2 degrees of freedom), its "
             "95% t-interval reported"),
    "correction": "Holm (step-down, family-wise error 0.05) within each family",
    "primary_family": [["recommend", "target_capped_16"], ["recommend", "proxy_capped_16"],
                       ["recommend", "uniform"], ["recommend", "best_at_proxy"]],
    "secondary_family": ("every other pair of a method pick (camel_robust, best_other_law_robust, repetition_law, "
                         "mergemix, recommend) with a baseline (uniform, proportional, unimax, best_at_proxy, "
                         "target_capped_16, proxy_capped_16), and camel_robust with best_other_law_robust and "
                         "repetition_law"),
    "verdict": ("X beats Y when the mean difference is below 0 and the Holm-adjusted p-value is below 0.05; X loses to Y "
                "when above 0 with the same test; otherwise they tie. A tie or a loss is a valid answer."),
    "question": "does recommend's pick beat the practitioner's rule (target_capped_16) at a target 10x beyond its proxies?",
}


def _sizes() -> dict:
    from data_mixture.plan import preset_sizes
    return preset_sizes(PRESETS)


def design() -> dict:
    """The registered design: every constant above plus what follows from them (sizes, tokens, FLOPs)."""
    from data_mixture.baselines import capped_mixture

    n = {k: v["params_active"] for k, v in _sizes().items()}
    tokens = {k: TOKENS_PER_PARAM[k] * n[k] for k in PRESETS}
    flops = {k: 6.0 * n[k] * tokens[k] for k in PRESETS}
    ratio = flops[TARGET_SIZE] / flops[PROXIES[-1]]
    if ratio < MIN_TARGET_FLOPS_RATIO:
        raise SystemExit(f"the target is {ratio:.2f}x the largest proxy's FLOPs, below {MIN_TARGET_FLOPS_RATIO}")
    pref = [0.4, 0.0, 0.6, 0.0]
    pools = [float("inf"), float("inf"), float(POOL_TOKENS), float("inf")]
    capped = {k: capped_mixture(pref, pools, tokens[k], PRACTITIONER_K)[0].round(4).tolist() for k in (PROXIES[-1], TARGET_SIZE)}
    return {
        "version": DESIGN_VERSION, "amendments": AMENDMENTS, "study": "headroom_v2", "question": DECISION["question"],
        "setting": {"corpus": CORPUS, "domains": DOMAINS, "scarce": SCARCE, "pool_tokens": POOL_TOKENS, "target": TARGET,
                    "config": CONFIG, "batch": BATCH, "seq_len": SEQ_LEN, "presets": PRESETS, "proxies": PROXIES,
                    "target_size": TARGET_SIZE, "tokens_per_param": TOKENS_PER_PARAM, "eval": EVAL},
        "derived": {"params_active": n, "tokens": tokens, "train_flops": flops,
                    "target_over_largest_proxy_flops": round(ratio, 3),
                    "target_over_largest_proxy_params": round(n[TARGET_SIZE] / n[PROXIES[-1]], 3),
                    "math_epochs_at_weight_0.6": {k: round(0.6 * tokens[k] / POOL_TOKENS, 2) for k in PRESETS},
                    "target_capped_16 (code, prose, math, knowledge)": capped},
        "gate": GATE, "ladder": LADDER, "target_seeds": TARGET_SEEDS, "candidates": CANDIDATES, "dedup": DEDUP,
        "decision": DECISION,
    }


def digest(body: dict) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def stage_design(out: Path) -> Path:
    path = out / "design.json"
    if path.exists():
        old = json.loads(path.read_text()).get("version")
        if old == DESIGN_VERSION:
            print(f"design: {path} exists (kept; a registration is never rewritten)")
            return path
        ran = [d for d in RUN_STAGES if (out / d).exists()]
        if ran or not isinstance(old, int) or old > DESIGN_VERSION:
            why = f"runs exist ({', '.join(ran)}): a design is never amended after the first run" if ran else "refusing to replace it"
            raise SystemExit(f"design: {path} is version {old!r}, this module's is {DESIGN_VERSION}; {why}")
        print(f"design: amending {path} from version {old} to {DESIGN_VERSION} (no run yet; AMENDMENTS says why)")
    body = design()
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip() or None
    record = {**body, "code_commit": commit, "registered_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "sha256": digest(body)}
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"design: wrote {path} (sha256 {record['sha256'][:12]}...); commit it before any run of this study")
    return path


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stage", choices=("design",), default="design",
                    help="design: write design.json (the later stages follow in this module, as design.json registers them)")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    stage_design(args.out)


if __name__ == "__main__":
    main()
