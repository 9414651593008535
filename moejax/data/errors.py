"""The one exception type of the data package.

``DataError`` subclasses ``moejax.config.ConfigError`` on purpose: bad data input (a missing
path, an empty source, a mixture naming a domain without data, a tokenizer mismatch) is a
problem with what the user asked for, found before anything is compiled, and the command line
prints it as one paragraph (``moejax: error: ...``) rather than a traceback. Every message names
the source (a path, a config key or a domain) and says how to fix it.
"""

from __future__ import annotations

from moejax.config import ConfigError


class DataError(ConfigError):
    """Bad data input, found before training starts; the message names the source and the fix."""
