"""The error every part of the Hugging Face interop raises for what it cannot convert exactly."""

from moejax.errors import UserError


class InteropError(UserError):
    """A checkpoint or config that cannot be converted exactly; the message says what and why."""
