"""The CPU default: a 3.8M-parameter (1.4M active) MoE (8 experts, top-2, one shared expert) on the built-in corpus.

Trains in a few minutes on 2 CPU cores: ./launch.sh experiments/configs/tiny_moe.py --workdir runs/tiny
"""

from moejax.config import default_config


def get_config():
    return default_config()  # the defaults are sized for this run
