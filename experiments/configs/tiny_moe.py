"""The CPU default: a 3.8M-parameter (1.4M active) MoE (8 experts, top-2, one shared expert) on the built-in corpus.

Trains in a few minutes on 2 CPU cores: ./launch.sh experiments/configs/tiny_moe.py --workdir runs/tiny
(or, installed: moejax train tiny_moe --workdir runs/tiny).

The config itself ships inside the package, moejax/configs/tiny_moe.py, so an installed moejax
finds it by name from any directory; this file is its repository path
(the old path, experiments/tiny_moe.py, still works, with a note).
"""

from moejax.configs.tiny_moe import get_config  # noqa: F401
