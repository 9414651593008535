"""Plan entries -> run targets, every entry checked before anything is launched.

A target is one training run of the plan (docs/data_mixture.md, "Planning": ``runs[]``): its
name (also its directory under the sweep root), the experiment file it starts from, its
``--config.KEY=VALUE`` overrides, and the config those resolve to. Every entry's config is
resolved **in this process** with moejax's own command-line parser and validator
(``moejax.main.parse_command_line`` + ``moejax.config.validate``), so an override moejax does not
know, or a value of the wrong type, is reported with the run's name, the key and moejax's own
explanation before the first run starts, not an hour into the sweep.

Device-dependent checks (the mesh against the device count, the batch against the mesh) are run
against a device count that fits the config's own mesh (its fixed axes, a ``-1`` axis as 1): the
runner may not see the devices the runs will get (a Ray head node without GPUs), so those checks
happen again when each run starts.

The checkpoint cadence is the plan's (``checkpoint.every_steps``, half the steps in plans made by
``plan``). The laws want every checkpoint evaluated, so when the plan does not set
``checkpoint.max_to_keep`` and moejax's default would delete some of the scheduled checkpoints
before they are evaluated, ``checkpoint.max_to_keep`` is raised to their number (recorded as an
added override in the run's ``record.json``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import math
import os
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

DEFAULT_CONFIG = "experiments/tiny_moe.py"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class SweepError(ValueError):
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


def load_plan(path: str | os.PathLike) -> dict[str, Any]:
    """The plan JSON; ``SweepError`` when it is missing, not JSON, or has no ``runs`` list."""
    p = Path(path)
    if not p.is_file():
        raise SweepError(f"plan file {str(p)!r} does not exist. Make one with `python -m data_mixture plan ... --out "
                         f"{p.name}` (schema: docs/data_mixture.md, \"Planning\").")
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


def resolve_entry(index: int, entry: Any, root: Path, plan_name: str) -> RunTarget:
    """One plan entry -> RunTarget, checked with moejax's own parser and validator."""
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
    target = RunTarget(name=name, run_dir=run_dir, config_file=config_file, overrides=dict(overrides),
                       added_overrides={}, entry=entry, resolved_config={}, steps=0, checkpoint_steps=())
    cfg, changed = _resolve(target, where)
    steps, every = int(cfg.train.steps), int(cfg.checkpoint.every_steps)
    if isinstance(entry.get("steps"), int) and entry["steps"] != steps:
        raise SweepError(f"{where} says steps {entry['steps']} but its overrides resolve to train.steps={steps}; "
                         "make them agree (the plan's 'steps' is informational, the overrides are what runs).")
    scheduled = _scheduled_checkpoints(steps, every)
    added = {}
    if "checkpoint.max_to_keep" not in overrides and int(cfg.checkpoint.max_to_keep) < len(scheduled):
        added["checkpoint.max_to_keep"] = len(scheduled)
        cfg.checkpoint.max_to_keep = len(scheduled)
    from moejax import config as config_lib

    return dataclasses.replace(target, added_overrides=added, resolved_config=config_lib.to_dict(cfg), steps=steps,
                               checkpoint_steps=scheduled)


def _resolve(target: RunTarget, where: str):
    """(config, changed keys) through moejax.main's parser + config.validate; SweepError with its message."""
    from moejax import config as config_lib
    from moejax.main import parse_command_line

    argv = ["moejax.main", "--config", target.config_file, "--workdir", str(target.run_dir), *target.override_args()]
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            command = parse_command_line(argv)
            config_lib.validate(command.config, _fit_devices(command.config.mesh), changed=command.changed)
    except SystemExit:
        message = err.getvalue().strip().removeprefix("moejax: error: ")
        raise SweepError(f"{where}: {message or 'moejax rejected its command line'}") from None
    except config_lib.ConfigError as e:
        raise SweepError(f"{where}: {e}") from None
    return command.config, command.changed


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
    return [resolve_entry(i, entry, root, plan_name) for i, entry in enumerate(plan["runs"])]
