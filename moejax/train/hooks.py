"""Hooks: what runs after a training step, and how often.

The loop (:func:`moejax.train.loop.run_steps`) only trains steps; after each one it fires the
hooks that are due, in order. Logging, evaluation, checkpoints, preemption, the divergence check,
the trackers and the progress bar are all hooks (:mod:`moejax.train.default_hooks`), and a user
adds their own the same way, without editing the loop::

    import optax
    from moejax.train.hooks import Hook
    from moejax.train.loop import train

    def param_norm(info):  # info: StepInfo
        info.log(param_norm=float(optax.tree.norm(info.state["params"])))

    train(cfg, "runs/tiny", hooks=[Hook(param_norm, every=50)])

A hook is due when ``step % every == 0``, when its ``when(info)`` says so, and at the run's last
step, where every hook fires once (as Levanter's trainer forces its hooks at the end). User hooks
fire after the built-in ones that fill the step's record (metrics, evaluation) and before the
record is written, so what they ``log`` lands in the same line of ``metrics.jsonl`` (and every
tracker) as the step's loss; on a step where nothing else is logged, their values make a record
of their own. Only process 0 writes records, but every process fires every hook (multi-host: a
hook that runs a computation over sharded arrays must run everywhere).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from moejax.errors import ConfigError


@dataclasses.dataclass
class StepInfo:
    """What a hook sees after a training step."""

    step: int  # steps done so far (the step just trained is number ``step``)
    state: dict[str, Any]  # the train state after it: "params", "opt_state", "balance", "step"
    metrics: dict[str, Any]  # the train step's outputs (device arrays): loss, grad_norm, lr, skipped, ...
    last: bool  # the run's final step: every hook fires
    record: dict[str, Any] = dataclasses.field(default_factory=dict)  # what is logged at this step
    events: set[str] = dataclasses.field(default_factory=set)  # set by the built-ins: "diverged", "stage", "preempted"

    def log(self, **values: Any) -> None:
        """Adds ``values`` (numbers, or arrays/lists of them) to this step's logged record."""
        self.record.update(values)


@dataclasses.dataclass(frozen=True)
class Hook:
    """``fn(info)`` after every ``every``-th step, when ``when(info)`` is true, and at the last step."""

    fn: Callable[[StepInfo], None]
    every: int = 1
    when: Callable[[StepInfo], bool] | None = None
    name: str = ""

    def due(self, info: StepInfo) -> bool:
        return info.last or info.step % self.every == 0 or (self.when is not None and self.when(info))


def fire(hooks: Sequence[Hook], info: StepInfo) -> None:
    """Runs every hook that is due after ``info.step``, in order."""
    for hook in hooks:
        if hook.due(info):
            hook.fn(info)


def check_hooks(hooks: Sequence[Any]) -> tuple[Hook, ...]:
    """``hooks`` as a tuple, or a ``ConfigError`` naming the first that is not a usable ``Hook``."""
    for i, hook in enumerate(hooks):
        if not isinstance(hook, Hook) or not callable(hook.fn):
            raise ConfigError(f"hooks[{i}] is {hook!r}; allowed: a moejax.train.hooks.Hook(fn, every=N), "
                              "fn a function of one StepInfo.")
        if not isinstance(hook.every, int) or hook.every < 1:
            raise ConfigError(f"hooks[{i}] ({hook.name or getattr(hook.fn, '__name__', 'hook')}) has every="
                              f"{hook.every!r}; allowed: an integer >= 1 (steps between calls).")
    return tuple(hooks)
