"""``python -m moejax COMMAND ...``: the same as the installed ``moejax`` command (moejax/cli.py)."""

from moejax.cli import main

if __name__ == "__main__":
    main()
