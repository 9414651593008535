"""``none``: no balancing objective at all (routing is left to the language-model loss)."""

from __future__ import annotations

import dataclasses

from moejax.model.balancing.base import Objective


@dataclasses.dataclass(frozen=True, kw_only=True)
class NoBalancing(Objective):
    """No loss, no state, no selection bias. Listed alone: ``(('none', {}),)`` equals ``()``."""

    name = "none"
