"""The exception type of the data package, and its warning helper.

``DataError`` (a ``ConfigError``: bad data input is a problem with what the user asked for) and
``user_stacklevel`` live in :mod:`moejax.errors`, below every package; this module re-exports
them, so ``from moejax.data.errors import DataError`` keeps working.
"""

from __future__ import annotations

from moejax.errors import DataError, user_stacklevel

__all__ = ["DataError", "user_stacklevel"]
