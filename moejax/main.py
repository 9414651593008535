"""Command-line entry point: ``python -m moejax.main --config FILE --workdir DIR [--config.key=value]``.

``launch.sh`` wraps this. Bad options and bad config values end with a one-paragraph message that
says how to fix them, before anything is compiled.
"""

from __future__ import annotations

import os
import sys

from absl import flags
from ml_collections import config_flags

from moejax.config import ConfigError

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment file with get_config().")
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for metrics, checkpoints and config.json.")


def _die(message: str) -> None:
    sys.stderr.write(f"moejax: error: {message}\n")
    sys.exit(2)


def _parse(argv: list[str]) -> None:
    try:
        flags.FLAGS(argv)
    except KeyError as e:  # an override naming a key the config does not have
        key = e.args[0] if e.args else e
        _die(
            f"unknown config key in a --config.* override: {key}. Overrides must name an existing key, "
            "e.g. --config.model.num_layers=4; see moejax/config.py for every key and its meaning."
        )
    except (flags.Error, TypeError, ValueError) as e:  # bad override value, or a bad experiment file
        _die(f"{e}. Run with --helpfull for the flags, see moejax/config.py for the config keys.")
    if _WORKDIR.value is None:
        _die("--workdir is required, e.g. --workdir runs/tiny.")


def maybe_initialize_distributed() -> None:
    """Multi-host: one process per host, coordinated by JAX's own runtime.

    Set JAX_COORDINATOR_ADDRESS (host:port of process 0), JAX_NUM_PROCESSES and JAX_PROCESS_ID on
    every host; on TPU pods or under SLURM set MOEJAX_DISTRIBUTED=1 and JAX detects them itself.
    """
    address = os.environ.get("JAX_COORDINATOR_ADDRESS")
    if not (address or os.environ.get("MOEJAX_DISTRIBUTED")):
        return
    import jax

    kwargs = {}
    if address:
        kwargs = dict(
            coordinator_address=address,
            num_processes=int(os.environ["JAX_NUM_PROCESSES"]),
            process_id=int(os.environ["JAX_PROCESS_ID"]),
        )
    jax.distributed.initialize(**kwargs)


def main(argv: list[str] | None = None) -> None:
    _parse(sys.argv if argv is None else argv)
    maybe_initialize_distributed()
    from moejax.train.loop import Diverged, train
    from moejax.train.preemption import Preempted

    try:
        summary = train(_CONFIG.value, _WORKDIR.value)
    except ConfigError as e:
        _die(f"{e}")
    except Preempted as e:
        sys.stderr.write(f"moejax: {e}; checkpoint saved. Rerun the same command to resume.\n")
        sys.exit(128 + e.signum)
    except Diverged as e:
        sys.stderr.write(f"moejax: {e}\n")
        sys.exit(3)
    if "eval_loss" in summary:
        print(
            f"done: step {summary['final_step']}, eval_loss {summary.get('initial_eval_loss', float('nan')):.3f}"
            f" -> {summary['eval_loss']:.3f}, workdir {_WORKDIR.value}"
        )


if __name__ == "__main__":
    main()
