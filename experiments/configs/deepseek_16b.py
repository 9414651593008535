"""DeepSeek-style large MoE: about 16B total / 2.7B active parameters, for a pod or GPU cluster.

./launch.sh experiments/configs/deepseek_16b.py --workdir gs://bucket/run --config.mesh.fsdp=8
(installed: moejax train deepseek_16b ...).

The config itself ships inside the package, moejax/configs/deepseek_16b.py, so an installed
moejax finds it by name from any directory; this file is its repository path
(the old path, experiments/deepseek_16b.py, still works, with a note).
"""

from moejax.configs.deepseek_16b import get_config  # noqa: F401
