"""Plan entries -> run targets, every entry checked before anything is launched.

A target is one training run of the plan (docs/mixture/commands.md, "Planning": ``runs[]``): its
name (also its directory under the sweep root), the experiment file it starts from, its
``--config.KEY=VALUE`` overrides, and the config those resolve to. Every entry's config is
resolved **in this process** with moejax's own config loader and validator
(``moejax.config.load`` + ``moejax.checks.validate``), so an override moejax does not
know, or a value of the wrong type, is reported with the run's name, the key and moejax's own
explanation before the first run starts, not an hour into the sweep.

Device-dependent checks (the mesh against the device count, the batch against the mesh) are run
against a device count that fits the config's own mesh (its fixed axes, a ``-1`` axis as 1): the
runner may not see the devices the runs will get (a Ray head node without GPUs), so those checks
happen again when each run starts.

Mid-training entries (``"base": NAME``, written by ``plan --mid-training``) continue from another
run of the plan: NAME must be an entry of the plan trained from scratch, with the same model. The
entry's ``checkpoint.init_from`` is the base's name (or absent); the runner sets it to the base's
run directory under the sweep root (an added override, so the plan stays valid under any root),
and the runner launches the entry only once its base is done (``runner.py``). moejax takes
``init_from``'s parameters only on a fresh start: a mid-training run with checkpoints of its own
resumes from them.

The checkpoint cadence is the plan's (``checkpoint.every_steps``, half the steps in plans made by
``plan``). The laws want every checkpoint evaluated, so when the plan does not set
``checkpoint.max_to_keep`` and moejax's default would delete some of the scheduled checkpoints
before they are evaluated, ``checkpoint.max_to_keep`` is raised to their number, and when it does
not set ``checkpoint.keep_period``, that is the cadence: a run stopped and resumed (a SIGTERM, a
killed runner) saves checkpoints off the cadence too, which count towards ``max_to_keep`` and would
otherwise push the oldest scheduled one out before evaluation. Both are recorded as added
overrides in the run's ``record.json``.

Evaluation windows: a plan's top-level ``eval_windows`` (``make_plan`` writes ``"sampled"``) is the
``train.eval_windows`` of every entry that does not set its own; a plan without the key was written
before it, when evaluations read the first windows of each held-out split, so its entries get
``train.eval_windows=first`` (an added override): a committed plan sweeps as it did.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from moejax.errors import UserError

DEFAULT_CONFIG = "experiments/configs/tiny_moe.py"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class SweepError(UserError):
    """Bad sweep input (the plan, an entry, a flag, a run directory), named with the fix."""


@dataclasses.dataclass(frozen=True)
class RunTarget:
    """One run of the plan, resolved and checked."""

    name: str
    run_dir: Path  # absolute: ROOT/name; also the moejax workdir
    config_file: str  # the experiment file (as the plan gives it, relative to the working directory)
    overrides: dict[str, Any]  # the plan entry's overrides
    added_overrides: dict[str, Any]  # overrides the runner adds (see the module docstring)
    entry: dict[str, Any]  # the plan entry, as written
    resolved_config: dict[str, Any]  # the full config the overrides resolve to (moejax's to_dict)
    steps: int  # train.steps: the final checkpoint's step
    checkpoint_steps: tuple[int, ...]  # every checkpoint the run is scheduled to write
    base: str = ""  # the plan run this one continues from (mid-training); "": none

    def override_args(self) -> list[str]:
        return override_args({**self.overrides, **self.added_overrides})

    def train_command(self, python: str = sys.executable) -> list[str]:
        """``python -m moejax.main --config FILE --workdir RUN_DIR --config.KEY=VALUE ...``."""
        return [python, "-m", "moejax.main", "--config", self.config_file, "--workdir", str(self.run_dir),
                *self.override_args()]

    def eval_command(self, eval_args: Sequence[str] = (), python: str = sys.executable) -> list[str]:
        """``python -m moejax.eval --workdir RUN_DIR --all --no-progress [eval args]``."""
        return [python, "-m", "moejax.eval", "--workdir", str(self.run_dir), "--all", "--no-progress", *eval_args]


def format_value(key: str, value: Any) -> str:
    """An override value as moejax's command line takes it (``data.mixture``: JSON text)."""
    if key == "data.mixture":
        if not isinstance(value, Mapping):
            raise TypeError("an object {domain: weight}")
        return json.dumps(dict(value))
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise TypeError("a finite number")
        return repr(value)
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)) and all(isinstance(v, (int, float, str, bool)) for v in value):
        return repr(tuple(value))
    raise TypeError("a number, a string, true/false or a list of those (data.mixture: an object)")


def override_args(overrides: Mapping[str, Any]) -> list[str]:
    return [f"--config.{key}={format_value(key, value)}" for key, value in overrides.items()]


def launch_command(config_file: str, workdir: str | os.PathLike, overrides: Mapping[str, Any]) -> str:
    """The training command for a plan entry or a mixture, as a user pastes it into a shell,
    runnable as printed from any directory: ``/abs/launch.sh CONFIG --workdir DIR
    --config.KEY=VALUE ...`` (or ``moejax train ...`` when installed without launch.sh), each
    argument quoted where it needs it (:func:`moejax.commands.train_command`, the one helper every
    printed command goes through). ``workdir`` is made absolute against the user's directory; paths
    in ``overrides`` should already be absolute."""
    from moejax.commands import train_command
    from moejax.paths import user_path

    return train_command(config_file, user_path(str(workdir)), override_args(overrides))


MIXTURE_BATCH, MIXTURE_SEQ_LEN = 16, 256  # the plan's defaults (PlanSpec.batch, .seq_len): tokens per step


def mixture_command(mixture_path: str | os.PathLike, tokens: float, workdir: str, *, config: str | None = None,
                    dataset: str | None = None) -> str:
    """The command that trains a mixture file for ``tokens`` tokens, runnable as printed from any
    directory (:func:`launch_command`): the mixture and the dataset as absolute paths, and the step
    count the tokens assume, ``ceil(tokens / (batch x seq_len))`` at the plan's default batch and
    sequence length (written out, so the command trains the tokens the mixture was chosen for).
    What ``optimize`` and ``recommend`` print."""
    steps = max(1, math.ceil(tokens / (MIXTURE_BATCH * MIXTURE_SEQ_LEN)))
    overrides: dict[str, Any] = {"data.mixture_file": os.path.abspath(str(mixture_path)), "train.steps": steps,
                                 "train.global_batch_size": MIXTURE_BATCH, "train.seq_len": MIXTURE_SEQ_LEN}
    if dataset not in (None, "builtin"):
        overrides = {"data.path": os.path.abspath(str(dataset)), **overrides}
    return launch_command(config or DEFAULT_CONFIG, workdir, overrides)


def load_plan(path: str | os.PathLike) -> dict[str, Any]:
    """The plan JSON; ``SweepError`` when it is missing, not JSON, or has no ``runs`` list."""
    p = Path(path)
    if not p.is_file():
        raise SweepError(f"plan file {str(p)!r} does not exist. Make one with `python -m data_mixture plan ... --out "
                         f"{p.name}` (schema: docs/mixture/commands.md, \"Planning\").")
    try:
        plan = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise SweepError(f"plan file {str(p)!r} is not valid JSON: {e}.") from None
    if not isinstance(plan, dict) or not isinstance(plan.get("runs"), list) or not plan["runs"]:
        got = type(plan).__name__ if not isinstance(plan, dict) else f"runs = {_short(plan.get('runs'))}"
        raise SweepError(f"plan file {str(p)!r} has no non-empty 'runs' list (got {got}); allowed: the JSON "
                         "`python -m data_mixture plan` writes, {\"runs\": [{\"name\": ..., \"config\": ..., "
                         "\"overrides\": {...}}, ...]}.")
    return plan


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _fit_devices(mesh: Mapping[str, Any]) -> int:
    """A device count that fits the config's own mesh: the product of its fixed axes."""
    sizes = [int(v) for v in mesh.values() if isinstance(v, int) and v > 0]
    return max(1, math.prod(sizes)) if sizes else 1


def _scheduled_checkpoints(steps: int, every: int) -> tuple[int, ...]:
    return tuple(sorted({s for s in range(every, steps + 1, every)} | {steps}))


def resolve_entry(index: int, entry: Any, root: Path, plan_name: str, eval_windows: str = "first") -> RunTarget:
    """One plan entry -> RunTarget, checked with moejax's own parser and validator. ``eval_windows``:
    the plan's ``train.eval_windows`` for entries that do not set it (module docstring)."""
    where = f"{plan_name}: runs[{index}]"
    if not isinstance(entry, dict):
        raise SweepError(f"{where} is {type(entry).__name__} {_short(entry)}; allowed: an object with "
                         "'name' and 'overrides'.")
    name = entry.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise SweepError(f"{where} has name {name!r}; allowed: a non-empty string of letters, digits, '.', '_' or "
                         "'-' (it becomes the run's directory under --root).")
    where = f"{plan_name}: run {name!r} (runs[{index}])"
    overrides = entry.get("overrides")
    if not isinstance(overrides, dict):
        raise SweepError(f"{where} has overrides {_short(overrides)}; allowed: an object {{config key: value}}, "
                         "e.g. {\"train.steps\": 100, \"data.mixture\": {\"code\": 0.5, \"prose\": 0.5}}.")
    config_file = entry.get("config", DEFAULT_CONFIG)
    if not isinstance(config_file, str) or not config_file:
        raise SweepError(f"{where} has config {config_file!r}; allowed: the path of an experiment file, e.g. "
                         f"{DEFAULT_CONFIG}.")
    for key, value in overrides.items():
        try:
            format_value(key, value)
        except TypeError as e:
            raise SweepError(f"{where}: override {key!r} has value {value!r}; allowed: {e}.") from None
    run_dir = (root / name).resolve()
    base = _entry_base(entry, overrides, where)
    init = {"checkpoint.init_from": str((root / base).resolve())} if base else {}
    target = RunTarget(name=name, run_dir=run_dir, config_file=config_file, overrides=dict(overrides),
                       added_overrides=init, entry=entry, resolved_config={}, steps=0, checkpoint_steps=(), base=base)
    cfg, changed = _resolve(target, where)
    steps, every = int(cfg.train.steps), int(cfg.checkpoint.every_steps)
    if isinstance(entry.get("steps"), int) and entry["steps"] != steps:
        raise SweepError(f"{where} says steps {entry['steps']} but its overrides resolve to train.steps={steps}; "
                         "make them agree (the plan's 'steps' is informational, the overrides are what runs).")
    scheduled = _scheduled_checkpoints(steps, every)
    added = dict(init)
    if "train.eval_windows" not in overrides and cfg.train.eval_windows != eval_windows:
        added["train.eval_windows"] = cfg.train.eval_windows = eval_windows
    if "checkpoint.max_to_keep" not in overrides and int(cfg.checkpoint.max_to_keep) < len(scheduled):
        added["checkpoint.max_to_keep"] = len(scheduled)
        cfg.checkpoint.max_to_keep = len(scheduled)
    if "checkpoint.keep_period" not in overrides and not int(cfg.checkpoint.keep_period):
        added["checkpoint.keep_period"] = every
        cfg.checkpoint.keep_period = every
    from moejax import config as config_lib

    return dataclasses.replace(target, added_overrides=added, resolved_config=config_lib.to_dict(cfg), steps=steps,
                               checkpoint_steps=scheduled)


def _entry_base(entry: Mapping[str, Any], overrides: Mapping[str, Any], where: str) -> str:
    """The entry's base run name ("" for a run from scratch), checked against its role and init_from."""
    base = entry.get("base") or ""
    role = entry.get("role")
    if not isinstance(base, str) or (base and not _NAME.match(base)):
        raise SweepError(f"{where} has base {base!r}; allowed: the name of another run of the plan (mid-training), "
                         "or no 'base' for a run from scratch.")
    if role == "mid" and not base:
        raise SweepError(f"{where} has role 'mid' but no 'base'; allowed: \"base\": the plan run it continues from.")
    if role in ("base", "scratch") and base:
        raise SweepError(f"{where} has role {role!r} and base {base!r}; allowed: a base only for role 'mid'.")
    init_from = overrides.get("checkpoint.init_from")
    if base and init_from not in (None, base):
        raise SweepError(f"{where} continues from base {base!r} but sets checkpoint.init_from={init_from!r}; allowed: "
                         f"{base!r} (the base's run directory, resolved under --root) or no checkpoint.init_from.")
    return base


def _missing_base(where: str, base: str, scratch: Sequence[str]) -> SweepError:
    listed = ", ".join(scratch[:8]) + (" ..." if len(scratch) > 8 else "") if scratch else "none"
    return SweepError(f"{where} continues from base {base!r}, which is not a run of the plan; allowed: the name of a "
                      f"run of the plan trained from scratch ({listed}). Add the base's entry (plan --mid-training "
                      "writes one per size) or fix the name.")


def check_bases(targets: Sequence[RunTarget], plan_name: str) -> None:
    """Every mid-training target's base is a run of the plan, trained from scratch, of the same model,
    and writes the checkpoint the target starts from."""
    by_name = {t.name: (i, t) for i, t in enumerate(targets)}
    for i, t in enumerate(targets):
        if not t.base:
            continue
        where = f"{plan_name}: run {t.name!r} (runs[{i}])"
        if t.base not in by_name:
            raise _missing_base(where, t.base, [n for n, (_, o) in by_name.items() if not o.base])
        j, base = by_name[t.base]
        if base.base:
            raise SweepError(f"{where} continues from {t.base!r} (runs[{j}]), itself a mid-training run of "
                             f"{base.base!r}; allowed: a base trained from scratch.")
        model, base_model = t.resolved_config.get("model"), base.resolved_config.get("model")
        if model != base_model:
            diff = sorted(k for k in set(model) | set(base_model) if model.get(k) != base_model.get(k))
            raise SweepError(f"{where} continues from base {t.base!r} (runs[{j}]) but their models differ (model."
                             f"{diff[0]}: {base_model.get(diff[0])!r} in the base, {model.get(diff[0])!r} here); "
                             "allowed: the base's model (a mid-training run continues its weights).")
        step = int(t.resolved_config["checkpoint"]["init_step"])
        if step >= 0 and step not in base.checkpoint_steps:
            raise SweepError(f"{where} starts from step {step} of base {t.base!r} (checkpoint.init_step), which the "
                             f"base does not save; allowed: one of its checkpoints {list(base.checkpoint_steps)}, or "
                             "-1 (its latest).")


def _resolve(target: RunTarget, where: str):
    """(config, changed keys) through moejax.config.load + checks.validate; SweepError with its message."""
    from moejax.checks import validate
    from moejax.config import load
    from moejax.errors import ConfigError

    try:
        cfg, changed = load(target.config_file, target.override_args())
        validate(cfg, _fit_devices(cfg.mesh), changed=changed)
    except ConfigError as e:
        raise SweepError(f"{where}: {e}") from None
    return cfg, changed


def targets_from_plan(plan: Mapping[str, Any], root: str | os.PathLike, plan_name: str = "plan") -> list[RunTarget]:
    """Every run of the plan as a checked target; the first problem raises ``SweepError``."""
    root = Path(root)
    seen: dict[str, int] = {}
    for i, entry in enumerate(plan["runs"]):
        name = entry.get("name") if isinstance(entry, dict) else None
        if isinstance(name, str) and name in seen:
            raise SweepError(f"{plan_name}: runs[{seen[name]}] and runs[{i}] are both named {name!r}; allowed: one "
                             "entry per name (the name is the run's directory).")
        if isinstance(name, str):
            seen[name] = i
    for i, entry in enumerate(plan["runs"]):  # a base missing from the plan is named before any config is resolved
        base = entry.get("base") if isinstance(entry, dict) else None
        if isinstance(base, str) and base and base not in seen:
            scratch = [e["name"] for e in plan["runs"] if isinstance(e, dict) and e.get("name") and not e.get("base")]
            raise _missing_base(f"{plan_name}: run {entry.get('name')!r} (runs[{i}])", base, scratch)
    windows = plan.get("eval_windows", "first")  # a plan written before the key evaluates as it did
    if windows not in ("sampled", "first"):
        raise SweepError(f"{plan_name}: eval_windows {windows!r}; allowed: sampled | first (train.eval_windows).")
    targets = [resolve_entry(i, entry, root, plan_name, windows) for i, entry in enumerate(plan["runs"])]
    check_bases(targets, plan_name)
    return targets
