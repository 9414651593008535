"""The data_mixture commands, one module per command: ``python -m data_mixture COMMAND``.

``data_mixture/__main__.py`` only dispatches: it lists the commands (``COMMANDS``), builds one
argparse sub-parser per command from that command's module here, and runs it through
:func:`moejax.runner.run` after the path checks every command shares
(:mod:`data_mixture.user_files`). Each command's arguments are declared beside the code that
runs them, in ``data_mixture/cli/<command>.py``, which defines:

- ``HELP``: one sentence (the sub-command's line in ``--help`` and its description);
- ``EXAMPLE``: one or more command lines that run as printed (its ``--help`` epilog and the
  top-level one);
- ``INTERRUPTED``: what Ctrl-C leaves, printed after ``interrupted:`` (None: the command handles
  Ctrl-C itself, as ``sweep`` does);
- ``add_arguments(parser)``: the command's flags (``-q/-v`` are added for every command); a flag
  whose value is a path declares a path type of :mod:`data_mixture.cli.flags` (``type=path_type``,
  ``named_path_type`` for ``NAME=PATH``, ...), so it means the user's directory
  (``tests/test_dm_path_flags.py`` finds any that does not);
- ``run(args)``: the command's body; bad input raises a :class:`moejax.errors.UserError`
  (:class:`data_mixture.cli.flags.UsageError` for a bad flag value).

``--help`` and usage errors must answer at once, so these modules import only the standard
library, :mod:`moejax.errors` and :mod:`data_mixture.cli.flags` at the top: ``run`` imports its
library (numpy, JAX, the laws) inside its body, after it has checked every flag value it can
check without data (``tests/test_cli_imports.py`` checks that no ``--help`` imports JAX). Shared
flag parsers (``DOMAIN=NUMBER`` lists, JSON text or file, comma-separated numbers) live in
:mod:`data_mixture.cli.flags`.

To add a command ``recommend``: write ``data_mixture/cli/recommend.py`` with the five names above,
add ``"recommend"`` to ``COMMANDS`` in ``data_mixture/__main__.py`` (the order of ``--help``), and
document it in docs/.
"""
