"""Mixture weights and schedules: the share of each batch every domain gets, from which step.

A run's weights come from one of three config keys (highest precedence first):

- ``data.schedule``: stages, as JSON text or the path of a JSON file:
  ``[[0, {"code": 0.5, "prose": 0.5}], [1000, {"code": 0.2, "prose": 0.8}]]``. Each stage is
  ``[start_step, weights]``; the first starts at step 0 and start steps increase.
- ``data.mixture_file``: a JSON file ``{"weights": {domain: weight}, ...}``, the format the
  ``data_mixture`` fitter writes (other keys are ignored). One stage.
- ``data.mixture``: ``{domain: weight}`` in the config. One stage.

Weights must be finite and >= 0, and not all zero. Weights that do not sum to 1 are normalised
(with a ``MixtureWarning`` saying so): relative weights such as ``{"code": 3, "math": 1}`` are
convenient, and a fitted mixture that sums to 0.9999 is not worth an error. A weight of 0 leaves
the domain out of that stage's training mix; it is still evaluated.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import numbers
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from moejax.data.corpus import DOMAINS
from moejax.errors import DataError, user_stacklevel

SUM_TOLERANCE: Final = 1e-6


class MixtureWarning(UserWarning):
    """Mixture weights were normalised to sum to 1."""


@dataclasses.dataclass(frozen=True)
class Stage:
    """From ``start_step`` on, batches mix domains by ``weights`` (positive, summing to 1)."""

    start_step: int
    weights: Mapping[str, float]


Schedule = tuple[Stage, ...]


def normalize_mixture(
    mixture: Mapping[str, Any],
    domains: Sequence[str] = DOMAINS,
    *,
    source: str = "data.mixture",
    dataset: str = "the built-in corpus",
) -> dict[str, float]:
    """Validate ``mixture`` and return its positive weights, scaled to sum to 1, in ``domains`` order.

    ``source`` (a config key or file) and ``dataset`` name the culprits in error messages.
    """
    if not isinstance(mixture, Mapping) or not mixture:
        raise DataError(f"{source} must be a non-empty mapping domain -> weight, got {mixture!r}")
    for domain, weight in mixture.items():
        if domain not in domains:
            raise DataError(
                f"{source} names domain {domain!r}, which {dataset} does not have; its domains "
                f"are: {', '.join(domains)}.{_did_you_mean(domain, domains)} Use those names, or "
                f"prepare data for {domain!r}." + (_how_to_set(domains) if source == "data.mixture" else "")
            )
        if (isinstance(weight, bool) or not isinstance(weight, numbers.Real)
                or not math.isfinite(weight) or weight < 0):
            raise DataError(f"{source}: weight for {domain!r} must be a finite number >= 0, "
                            f"got {weight!r}")
    total = math.fsum(float(w) for w in mixture.values())
    if total <= 0:
        raise DataError(f"{source}: weights must not all be zero, got {dict(mixture)}; give at "
                        "least one domain a positive weight.")
    weights = {d: float(mixture[d]) / total for d in domains if mixture.get(d, 0) > 0}
    if abs(total - 1.0) > SUM_TOLERANCE:
        shown = ", ".join(f"{d}: {w:.4g}" for d, w in weights.items())
        warnings.warn(f"{source}: weights sum to {total:.6g}, not 1; normalised to {{{shown}}}",
                      MixtureWarning, stacklevel=user_stacklevel())
    return weights


def _did_you_mean(name: str, domains: Sequence[str]) -> str:
    near = difflib.get_close_matches(name, list(domains), n=1)
    return f" Did you mean {near[0]!r}?" if near else ""


def _how_to_set(domains: Sequence[str]) -> str:
    """The two command-line forms of a mixture, spelled with the dataset's own domains."""
    share = float(f"{1 / len(domains):.4g}")
    per_key = " ".join(f"--config.data.mixture.{d}={share:g}" for d in domains)
    text = json.dumps({d: share for d in domains})
    return (f" On the command line, one weight per domain: {per_key}; or the whole mixture as JSON "
            f"text: --config.data.mixture='{text}'.")


def read_mixture_file(path: str | Path) -> dict[str, Any]:
    """The ``weights`` mapping of a mixture JSON file ``{"weights": {domain: w}, ...}``."""
    value = _load_json_file(path, "data.mixture_file")
    if not isinstance(value, dict) or not isinstance(value.get("weights"), dict):
        raise DataError(f"data.mixture_file {str(path)!r} must hold a JSON object with a "
                        "\"weights\" object, e.g. {\"weights\": {\"code\": 0.6, \"math\": 0.4}}.")
    return value["weights"]


def parse_schedule(spec: str) -> list[tuple[int, dict[str, Any]]]:
    """``data.schedule`` (JSON text, or the path of a JSON file) -> ``[(start_step, weights)]``."""
    text = spec.strip()
    value = _load_json_text(text, "data.schedule") if text[:1] in "[{" else _load_json_file(
        text, "data.schedule")
    example = '[[0, {"code": 0.5, "math": 0.5}], [1000, {"code": 0.2, "math": 0.8}]]'
    if not isinstance(value, list) or not value:
        raise DataError(f"data.schedule must be a non-empty JSON list of [start_step, weights] "
                        f"stages, e.g. {example}; got {value!r}")
    stages = []
    for i, stage in enumerate(value):
        if (not isinstance(stage, list) or len(stage) != 2 or isinstance(stage[0], bool)
                or not isinstance(stage[0], int) or not isinstance(stage[1], dict)):
            raise DataError(f"data.schedule stage {i} is {stage!r}; each stage must be "
                            f"[start_step, {{domain: weight}}], e.g. {example}")
        stages.append((stage[0], stage[1]))
    if stages[0][0] != 0:
        raise DataError(f"data.schedule: the first stage must start at step 0, not {stages[0][0]}.")
    for (previous, _), (start, _) in zip(stages, stages[1:]):
        if start <= previous:
            raise DataError(f"data.schedule: stage start steps must increase; {start} follows "
                            f"{previous}.")
    return stages


def make_schedule(
    stages: Sequence[tuple[int, Mapping[str, Any]]],
    domains: Sequence[str],
    *,
    source: str,
    dataset: str,
) -> Schedule:
    """Validated, normalised stages; errors name ``source`` (and the stage, if there are several)."""
    def where(start: int) -> str:
        return f"{source} (stage at step {start})" if len(stages) > 1 else source

    return tuple(Stage(start, normalize_mixture(weights, domains, source=where(start), dataset=dataset))
                 for start, weights in stages)


def schedule_from_config(data_cfg: Any, domains: Sequence[str], dataset: str) -> Schedule:
    """The schedule the ``data`` config group asks for (see the module docstring)."""
    if data_cfg.schedule and data_cfg.mixture_file:
        raise DataError("data.schedule and data.mixture_file are both set; set one (a schedule "
                        "with a single stage [[0, weights]] is a plain mixture).")
    if data_cfg.schedule:
        return make_schedule(parse_schedule(data_cfg.schedule), domains, source="data.schedule",
                             dataset=dataset)
    if data_cfg.mixture_file:
        weights = read_mixture_file(data_cfg.mixture_file)
        return make_schedule([(0, weights)], domains,
                             source=f"data.mixture_file {data_cfg.mixture_file!r}", dataset=dataset)
    return make_schedule([(0, dict(data_cfg.mixture))], domains, source="data.mixture",
                         dataset=dataset)


def resolved_data_values(data_cfg: Any, schedule: Schedule) -> dict[str, Any]:
    """The ``data`` config values that say what ``schedule`` is, with nothing left to read or
    normalise: the weights of a mixture (or mixture file) as ``mixture``, a schedule as its JSON
    text; ``mixture_file`` cleared, since its weights are now in the config."""
    if data_cfg.schedule:
        stages = [[stage.start_step, dict(stage.weights)] for stage in schedule]
        return {"schedule": json.dumps(stages), "mixture_file": ""}
    return {"mixture": dict(schedule[0].weights), "mixture_file": ""}


def stage_index(schedule: Schedule, step: int) -> int:
    """Index of the stage that step ``step`` (0-based: the batch drawn after ``step`` batches) is in."""
    index = 0
    for i, stage in enumerate(schedule):
        if stage.start_step <= step:
            index = i
    return index


def _load_json_file(path: str | Path, key: str) -> Any:
    if not Path(path).is_file():
        raise DataError(f"{key} file {str(path)!r} does not exist; check the path (or, for "
                        "data.schedule, give the JSON text itself).")
    return _load_json_text(Path(path).read_text(encoding="utf-8"), f"{key} file {str(path)!r}")


def _load_json_text(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as e:
        example = ("--config.data.schedule='[[0, {\"code\": 0.5, \"math\": 0.5}], [1000, {\"code\": 1}]]'"
                   if what == "data.schedule" else "")
        fix = f" Give valid JSON (quoted for the shell), e.g. {example}" if example else " Fix the file."
        raise DataError(f"{what} is not valid JSON: {e}.{fix}") from None
