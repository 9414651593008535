"""``python -m moejax.interop.hf import|export ...`` (see :mod:`moejax.interop.hf.cli`)."""

from moejax.interop.hf.cli import main

if __name__ == "__main__":
    main()
