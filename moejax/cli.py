"""The installed ``moejax COMMAND ...`` command (``data-mixture COMMAND ...`` is data_mixture's own).

``pip install`` puts both on the PATH (``[project.scripts]`` in pyproject.toml);
``python -m moejax COMMAND ...`` is the same as ``moejax COMMAND ...``. Each command is a thin door
to a module that keeps its own ``python -m`` form and its own options:

=============  =================================  ==========================================
command        same as                            does
=============  =================================  ==========================================
``train``      ``python -m moejax.main``          train (or resume) a config
``eval``       ``python -m moejax.eval``          evaluate a workdir's checkpoints
``generate``   ``python -m moejax.generate``      sample from a checkpoint
``prepare``    ``python -m moejax.data.prepare``  text/JSONL/Parquet -> a token dataset
``export``     ``python -m moejax.data.export``   a prepared dataset back to JSONL
``l3-alloc``   ``python -m moejax.data.l3_alloc`` rows per token for Large Lookup Layers
``hf``         ``python -m moejax.interop.hf``    Hugging Face checkpoints in and out
``upcycle``    ``python -m moejax.upcycle``       a dense model made into an MoE (a new workdir)
``configs``                                       list the built-in configs
=============  =================================  ==========================================

Every command but ``configs`` takes ``-q/--quiet`` (warnings, errors and its result only) and
``-v/--verbose`` (debug messages too): :mod:`moejax.log`.

``moejax train [CONFIG] [--workdir DIR] [--config.KEY=VALUE ...]`` reads like ``./launch.sh``:
CONFIG is a file, or the name of a built-in config (``moejax/configs``; default ``tiny_moe``),
and the workdir defaults to ``runs/<config name>`` under the current directory.

Like launch.sh, the commands run with mimalloc preloaded when the ``cmeel-mimalloc`` package is
installed (:mod:`moejax.allocator`: XLA:CPU steps run faster with the same numbers; measured in
experiments/benchmarks/LOG.md, section 2, change 6): the process re-executes itself once with
``LD_PRELOAD`` set, before anything heavy is imported.
``MOEJAX_ALLOCATOR=system`` keeps the system allocator.
"""

from __future__ import annotations

import importlib
import os
import sys
import warnings

from moejax import allocator
from moejax import configs as builtin_configs

PROG = "moejax"
# command -> (module with main(argv), what it does); ``train`` is handled by ``_train``.
COMMANDS = {
    "train": ("moejax.main", "train (or resume) a config: moejax train [CONFIG|NAME] [--workdir DIR] "
                             "[--config.KEY=VALUE ...]"),
    "eval": ("moejax.eval.__main__", "evaluate a workdir's checkpoints (losses, benchmarks, routing)"),
    "generate": ("moejax.generate", "sample text from a checkpoint"),
    "prepare": ("moejax.data.prepare", "turn text/JSONL/Parquet files into a token dataset"),
    "export": ("moejax.data.export", "write a prepared dataset back out as JSONL"),
    "l3-alloc": ("moejax.data.l3_alloc", "allocate Large Lookup Layer rows per token"),
    "hf": ("moejax.interop.hf", "import/export Hugging Face MoE checkpoints"),
    "lm-eval": ("moejax.eval.lm_eval.__main__", "run lm-evaluation-harness tasks on a checkpoint (offline; "
                                                "the eval extra)"),
    "prune": ("moejax.prune.cli", "remove experts from a checkpoint (Schur-A*, Step, least-used) into a new workdir"),
    "upcycle": ("moejax.upcycle.cli", "make a dense model (workdir or HF Llama/Qwen2/Qwen3) into an MoE in a new "
                                      "workdir (copy or drop upcycling)"),
    "configs": ("", "list the built-in configs"),
}


def _usage() -> str:
    width = max(len(name) for name in COMMANDS)
    lines = [f"usage: {PROG} COMMAND [arguments]   ({PROG} COMMAND --help for a command's options)", "",
             "commands:"]
    lines += [f"  {name:<{width}}  {what}" for name, (_, what) in COMMANDS.items()]
    lines += ["", "every command but configs takes -q/--quiet (warnings, errors and its result only) and "
              "-v/--verbose (debug messages too)"]
    lines += ["", f"built-in configs: {', '.join(builtin_configs.BUILTIN)} (moejax train NAME); the mixture "
              "laws: data-mixture --help"]
    return "\n".join(lines)


def preload_allocator() -> None:
    """Re-executes this process's command line once with mimalloc preloaded, as launch.sh starts
    its processes (:func:`moejax.allocator.reexec_with_mimalloc`)."""
    allocator.reexec_with_mimalloc(PROG)


def _train(args: list[str]) -> None:
    """``moejax train [CONFIG] [--workdir DIR] [overrides]`` -> ``moejax.main.main``."""
    from moejax import main as train_main

    args = list(args)
    config = None
    if args and not args[0].startswith("-"):
        config = args.pop(0)
    given = any(a == "--config" or a.startswith("--config=") for a in args)
    if config is not None and given:
        sys.stderr.write(f"{PROG} train: error: give the config once, as the first argument or as --config.\n")
        sys.exit(2)
    if not given:
        config = config or builtin_configs.DEFAULT
        args = ["--config", config, *args]
    else:
        config = next(a.split("=", 1)[1] if "=" in a else args[i + 1]
                      for i, a in enumerate(args) if a == "--config" or a.startswith("--config="))
    asks_help = any(a in ("-h", "--help", "--helpfull", "-help") for a in args)
    if not asks_help and not any(a == "--workdir" or a.startswith("--workdir=") for a in args):
        name = os.path.basename(config.split(":", 1)[0])
        name = name[:-3] if name.endswith(".py") else name
        args += ["--workdir", os.path.join("runs", name)]
    warnings.showwarning = train_main._show_warning
    train_main.main([f"{PROG} train", *args])


def main(argv: list[str] | None = None) -> None:
    """``moejax COMMAND [arguments]``."""
    args = sys.argv[1:] if argv is None else list(argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(_usage())
        sys.exit(0 if args else 2)
    if args[0] in ("-V", "--version"):
        import moejax

        print(f"moejax {moejax.__version__}")
        return
    command, rest = args[0], args[1:]
    if command not in COMMANDS:
        import difflib

        near = difflib.get_close_matches(command, COMMANDS, n=1)
        hint = f" Did you mean {near[0]!r}?" if near else ""
        sys.stderr.write(f"{PROG}: error: unknown command {command!r}.{hint}\n{_usage()}\n")
        sys.exit(2)
    if command == "configs":
        for name in builtin_configs.BUILTIN:
            print(f"{name:<14} {builtin_configs.path(name)}")
        return
    if argv is None:
        preload_allocator()
    if command == "train":
        _train(rest)
        return
    module = importlib.import_module(COMMANDS[command][0])
    if hasattr(module, "_show_warning"):
        warnings.showwarning = module._show_warning
    code = module.main(rest)  # every command starts through moejax.runner.run
    if code:
        sys.exit(code)
