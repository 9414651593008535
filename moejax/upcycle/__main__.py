"""``python -m moejax.upcycle`` (see :mod:`moejax.upcycle.cli`)."""

import sys

from moejax.upcycle.cli import main

if __name__ == "__main__":
    sys.exit(main())
