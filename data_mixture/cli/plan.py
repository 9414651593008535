"""``python -m data_mixture plan``: proxy runs (sizes, mixtures, tokens) chosen under a FLOP budget
(:func:`data_mixture.plan.make_plan`), written as the plan a sweep runs."""

from __future__ import annotations

import argparse
import json
import logging
import os

from data_mixture.cli.flags import (FORCE_HELP, PROG, TARGET_HELP, UsageError, dataset_path_type, input_path_type,
                                    json_arg, json_or_path_type, numbers, parse_weights, path_type, progress)

log = logging.getLogger(__name__)

HELP = "Choose proxy runs (sizes, mixtures, tokens) under a FLOP budget (6 x N_active x tokens)."
EXAMPLE = (f"{PROG} plan --budget-flops 3e15 --prior fit.json --target-size 3.1e6 --target-tokens 5e8 --out plan.json\n"
           f"{PROG} plan --budget-flops 2e16 --domains code,prose,math,knowledge --target-size 2e7 --target-tokens 4e8 "
           "--mid-training --base-tokens-per-param 20 --mid-tokens-per-param 4 --seeds 3 --seed-sizes s3 --out plan.json")
PLAN_SIZE_HELP = ("the target model's parameter count in the prior's size column: params_active (parameters used per "
                  "token) with the built-in prior, else the --prior fit's column (docs/mixture/commands.md, 'Model sizes')")
INTERRUPTED = "nothing was written (--out is unchanged). Rerun the command."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--budget-flops", type=float, required=True)
    p.add_argument("--prior", type=path_type, default=None,
                   help="fit JSON of a prior law fit to simulate from (default: a built-in prior)")
    p.add_argument("--law", default=None, help="law to plan for (default: the prior's)")
    p.add_argument("--target-size", type=float, required=True, help=PLAN_SIZE_HELP)
    p.add_argument("--target-tokens", type=float, required=True)
    p.add_argument("--presets", type=json_or_path_type, default=None,
                   help="size presets, JSON text or file: {name: {overrides...}} (default: the ladder presets)")
    p.add_argument("--tokens-per-param", default=None,
                   help="runs from scratch: candidate tokens/params ratios, comma-separated (default 20)")
    p.add_argument("--min-weight", nargs="*", action="extend")
    p.add_argument("--max-weight", nargs="*", action="extend")
    p.add_argument("--domains", default=None,
                   help="training domains, comma-separated (default: the prior's, else the --dataset's)")
    p.add_argument("--dataset", type=dataset_path_type, default=None,
                   help="a prepared dataset directory every planned run trains on (data.path): its tokenizer sizes the "
                        "models (model.vocab_size, as training derives it); its domains are the training domains, "
                        "less the validation-only ones, unless --domains or --prior says otherwise")
    p.add_argument("--validation-only", default=None,
                   help="comma-separated domains no run trains on (held-out targets): evaluated, never weighted "
                        "(default: a --target naming one --dataset domain; a target set such as heldout_qa)")
    p.add_argument("--noise", type=float, default=0.01, help="relative noise of simulated losses")
    p.add_argument("--simulations", type=int, default=3, help="simulated ladders per candidate allocation")
    p.add_argument("--sim-starts", type=int, default=16, help="random starts per simulated fit")
    p.add_argument("--min-runs-per-size", type=int, default=3)
    p.add_argument("--min-sizes", type=int, default=0,
                   help="fewest size presets in a candidate ladder (default 0: the planned law's own minimum)")
    p.add_argument("--checkpoints", type=int, default=2,
                   help="evaluated checkpoints per run, evenly spaced (default 2: at half and at the end)")
    p.add_argument("--config", type=input_path_type, default="experiments/configs/tiny_moe.py",
                   help="config file each planned run starts from")
    p.add_argument("--batch", type=int, default=16, help="global batch size of the planned runs")
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--seed", type=int, default=0, help="simulation seed and the runs' train.seed (default 0)")
    p.add_argument("--seeds", type=int, default=1,
                   help="replicates of every run: train seeds SEED .. SEED+K-1 (default 1: none)")
    p.add_argument("--seed-sizes", default=None, help="presets that get the --seeds replicates, comma-separated "
                                                      "(default: every size)")
    _add_mid_training_arguments(p)
    p.add_argument("--target", default=None,
                   help="plan for this target (simulated from the prior's domains): " + TARGET_HELP)
    p.add_argument("--unique-tokens", nargs="*",
                   help="unique tokens of each scarce domain at the target run, e.g. code=2e7 "
                                                     "(every run trains on this pool; with --match-repetition, subsampled per proxy)")
    p.add_argument("--match-repetition", action="store_true",
                   help="give every proxy run a pool of unique tokens x its tokens / --target-tokens per scarce domain "
                        "(data.unique_tokens), so proxies repeat a scarce domain as often as the target run will")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--out", type=path_type, required=True, help="plan JSON to write")
    p.add_argument("--force", action="store_true", help=FORCE_HELP)


def _add_mid_training_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mid-training", action="store_true",
                   help="at each size pretrain one base on --base-mixture, then continue from it on every mixture "
                        "(docs/mixture/commands.md, 'Mid-training plans')")
    p.add_argument("--base-tokens-per-param", type=float, default=None,
                   help="mid-training: base tokens = this x size (default 20)")
    p.add_argument("--base-tokens", type=float, default=None, help="mid-training: base tokens at every size")
    p.add_argument("--mid-tokens-per-param", default=None,
                   help="mid-training: candidate mid-training tokens/params ratios, comma-separated (default 4)")
    p.add_argument("--mid-tokens", type=float, default=None, help="mid-training: mid-training tokens at every size")
    p.add_argument("--base-mixture", nargs="*", action="extend",
                   help="mid-training: the bases' mixture, e.g. code=0.4 prose=0.6 "
                                                     "(default: uniform)")
    p.add_argument("--mid-lr-scale", type=float, default=1.0,
                   help="mid-training: peak lr = this x the experiment's optim.lr (default 1: re-warm to the base's peak)")


def run(args: argparse.Namespace) -> None:
    spec = plan_spec(args)
    from data_mixture.plan import make_plan
    from data_mixture.user_files import write_text

    plan = make_plan(spec, progress=progress(args))
    write_text(args.out, json.dumps(plan, indent=1))
    _print_plan(plan, args.out)


def plan_spec(args: argparse.Namespace):
    """The :class:`data_mixture.plan.PlanSpec` of the flags (every flag value checked here, before
    the planner is imported)."""
    if args.mid_training and args.tokens_per_param is not None:
        raise UsageError("--tokens-per-param sizes runs from scratch; a --mid-training plan takes "
                         "--mid-tokens-per-param (or --mid-tokens) and --base-tokens-per-param (or --base-tokens).")
    presets = json_arg(args.presets, "--presets") if args.presets else None
    tokens_per_param = numbers(args.tokens_per_param or "20", "--tokens-per-param")
    bounds = parse_weights(args.min_weight, "--min-weight"), parse_weights(args.max_weight, "--max-weight")
    mid_tokens_per_param = (numbers(args.mid_tokens_per_param, "--mid-tokens-per-param")
                            if args.mid_tokens_per_param is not None else None)
    base_mixture = parse_weights(args.base_mixture, "--base-mixture") if args.base_mixture else None
    seed_sizes = [x.strip() for x in args.seed_sizes.split(",") if x.strip()] if args.seed_sizes is not None else None
    unique_tokens = parse_weights(args.unique_tokens, "--unique-tokens")
    from data_mixture.plan import PlanSpec

    domains = args.domains
    held = (tuple(d.strip() for d in args.validation_only.split(",") if d.strip())
            if args.validation_only is not None else None)
    return PlanSpec(
        budget_flops=args.budget_flops, target_size=args.target_size, target_tokens=args.target_tokens,
        prior=args.prior, law=args.law, noise=args.noise, simulations=args.simulations, sim_starts=args.sim_starts,
        seed=args.seed, config=args.config, batch=args.batch, seq_len=args.seq_len, domains=domains,
        min_runs_per_size=args.min_runs_per_size, checkpoints=args.checkpoints, min_sizes=args.min_sizes,
        mid_training=args.mid_training, base_tokens_per_param=args.base_tokens_per_param, base_tokens=args.base_tokens,
        mid_tokens=args.mid_tokens, mid_lr_scale=args.mid_lr_scale, seeds=args.seeds, target=args.target,
        match_repetition=args.match_repetition, presets=presets, tokens_per_param=tokens_per_param,
        min_weight=bounds[0], max_weight=bounds[1], mid_tokens_per_param=mid_tokens_per_param,
        base_mixture=base_mixture, seed_sizes=seed_sizes, unique_tokens=unique_tokens, validation_only=held,
        dataset=None if args.dataset == "builtin" else args.dataset,  # builtin: the default data.path
    )


def _print_plan(plan: dict, out: str) -> None:
    """The plan in one line, its warnings, and the commands that run it."""
    chosen, protocol = plan["chosen"], plan["protocol"]
    roles = [r["role"] for r in plan["runs"]]
    what = (f"{roles.count('base')} base(s) + {roles.count('mid')} mid-training runs"
            if protocol["kind"] == "mid_training" else f"{len(roles)} runs")
    seeds = f", {protocol['seeds']} seeds at {', '.join(protocol['seed_sizes'])}" if protocol["seed_sizes"] else ""
    print(f"plan: {what} at sizes {', '.join(chosen['sizes'])}{seeds}, {plan['total_flops']:.3g} of "
          f"{plan['budget_flops']:.3g} FLOPs; simulated extrapolation error {chosen['sim_error']:.4f} "
          f"(best of {len(plan['candidates'])} allocations)")
    left_out = [p for p in protocol["seed_sizes_requested"] or [] if p not in protocol["seed_sizes"]]
    if protocol["seeds"] > 1 and left_out:
        log.warning(f"plan: note: --seed-sizes {', '.join(left_out)} not in the chosen sizes: no replicates there")
    if plan.get("validation_only"):
        print(f"plan: trains on {', '.join(plan['mix_domains'])}; validation-only (no run trains on it, every run is "
              f"evaluated on it): {', '.join(plan['validation_only'])}")
    _warn_laws_left_short(plan)
    for warning in plan.get("warnings", []):
        log.warning(f"plan: warning: {warning}")
    from data_mixture.sweep.targets import launch_command
    from moejax.commands import python_command
    from moejax.paths import user_path

    first = plan["runs"][0]
    example = launch_command(first["config"], os.path.join("runs", first["name"]), first["overrides"])
    sweep = python_command("data_mixture", ["sweep", "--plan", user_path(out), "--root", user_path("runs/sweep")])
    print(f"wrote {out}; run it with: {sweep}; each run trains as, e.g.: {example}")


def _warn_laws_left_short(plan: dict) -> None:
    """A warning for each law the plan's runs cannot identify (too few runs or sizes in all)."""
    from data_mixture.laws import LAWS, get_law

    fitted = [r for r in plan["runs"] if r.get("role") != "base"]  # a mid-training plan's laws see the mid runs
    runs, sizes = len(fitted), len({r["preset"] for r in fitted})
    m = len(fitted[0]["mixture"]) if fitted else 0
    short = [f"{name} (needs {get_law(name).min_runs(m)} runs at {get_law(name).min_sizes()}+ sizes)" for name in LAWS
             if runs < get_law(name).min_runs(m) or sizes < get_law(name).min_sizes()]
    if short:
        log.warning(f"plan: warning: its {runs} runs at {sizes} size(s) over {m} training domains are too few to fit "
                    f"{', '.join(short)}; fit and evaluate will refuse those laws on its table "
                    "(python -m data_mixture laws lists every law's minimum). Raise --budget-flops or "
                    "--min-runs-per-size to give them enough.")
