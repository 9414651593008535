"""The second headroom study: does ``recommend``'s pick beat the practitioner's rule at a target 10x
beyond its proxies?

    python -m experiments.studies.does_recommend_beat_the_practitioner --stage design   # once, then commit

headroom_v1 (``does_the_mixture_matter_with_headroom``) answered "yes, CAMEL's pick beats uniform and
the trivial choices", but its setting was chosen over four gate attempts, its target was 2.2x the
largest proxy's parameters (4.7x its training FLOPs), its candidates lacked the rule a careful
practitioner uses, and each target loss came from 2 held-out batches. This study fixes its whole
setting in ``design.json`` **before its first run**: the corpus and the scarce domain, the pool, the
target, the sizes and budgets, the seeds, the gate rule, the ladder, the candidates, the decision
rule and the multiple-comparison correction. Every constant of ``headroom_v2_setting`` (the
setting, the gate and the ladder) is written into that file, and ``tests/test_headroom_v2_design.py``
fails when one no longer matches the committed file or the file no longer matches its sha256: a
setting changed after the registration shows. This module is the study's command.

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

1. ``design``   writes ``design.json`` (``headroom_v2_setting``'s constants, their sha256). It keeps a file of
                its own version, refuses to replace one once any stage has trained, and records
                each amendment made before the first run in ``AMENDMENTS``. Committed before any
                other stage runs.
2. ``gate``     the registered gate, once: ``gate/plan.json`` (committed before its first run),
                its runs in committed chunks, ``gate_runs.csv``, ``gate/gate.json`` and ``gate.md``
                with the proof that design.json and the plan were committed before the first run
                started. A failure ends the study: ``report.md`` says "no headroom in this
                setting", with its numbers.
3. ``ladder``   the registered ladder after a passing gate (``ladder_runs.csv``).
4. ``fit``, ``mergemix``, ``register`` (``headroom_v2_picks``): the laws scored and fitted on the
   ladder with their robust picks, ``recommend``, MergeMix, then every candidate, the dedup and every
   law's prediction registered by ``data_mixture register`` before the first target run (commit it).
5. ``target``, ``report`` (``headroom_v2_report``): the registered candidates at s2, 3 seeds each,
   in committed chunks; the registered comparisons, Holm-corrected, and the answer.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from experiments.studies import headroom_v2_picks as picks
from experiments.studies import headroom_v2_report as report
from experiments.studies.headroom_v2_setting import OUT, stage_design, stage_gate, stage_ladder

STAGES = ("design", "gate", "ladder", "fit", "mergemix", "register", "target", "report")


def later_stage(name: str):
    """The stage function of a stage after the ladder (``headroom_v2_picks``, ``headroom_v2_report``)."""
    return {"fit": picks.stage_fit, "mergemix": picks.stage_mergemix, "register": picks.stage_register,
            "target": report.stage_target, "report": report.stage_report}[name]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stage", choices=STAGES, default="design",
                    help="design: write design.json; gate: the registered gate, once; ladder: the ladder after a passing "
                         "gate; fit, mergemix, register: the candidates and their registration (commit it); target: the "
                         "registered candidates at s2; report: the registered decision (each skips what exists)")
    ap.add_argument("--out", type=Path, default=OUT, help="committed results")
    ap.add_argument("--root", type=Path, default=Path("runs/headroom_v2"), help="run directories (not committed)")
    ap.add_argument("--parallel", type=int, default=2, help="runs at a time")
    args = ap.parse_args(argv)
    if args.stage == "design":
        stage_design(args.out)
    elif args.stage == "gate":
        stage_gate(args.out, args.root, args.parallel)
    elif args.stage == "ladder":
        stage_ladder(args.out, args.root, args.parallel)
    else:
        later_stage(args.stage)(args.out, args.root, args.parallel)


if __name__ == "__main__":
    main()
