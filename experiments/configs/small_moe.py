"""About 100M total parameters (16 experts, top-2, one shared expert), sized for one GPU.

./launch.sh experiments/configs/small_moe.py --workdir runs/small   (installed: moejax train small_moe)
On CPU it runs too, slowly; pass e.g. --config.train.steps=20 to smoke-test it.

The config itself ships inside the package, moejax/configs/small_moe.py, so an installed moejax
finds it by name from any directory; this file is its repository path
(the old path, experiments/small_moe.py, still works, with a note).
"""

from moejax.configs.small_moe import cpu_benchmark_config, get_config  # noqa: F401
