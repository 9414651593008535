"""DeepSeek-style large MoE: about 16B total / 2.7B active parameters.

Fine-grained routed experts (64, top-6, width 1408) plus 2 shared experts, first layer dense,
sigmoid-free softmax router as in DeepSeek-V2-Lite, untied embeddings. Attention is grouped-query
(moejax has no multi-head latent attention). Meant for a pod or GPU cluster, e.g. 64 chips:

./launch.sh experiments/configs/deepseek_16b.py --workdir gs://bucket/run --config.mesh.fsdp=8
(mesh.expert=8 by default; the remaining devices fill fsdp).
"""

from moejax.config import default_config


def get_config():
    c = default_config()
    c.train.steps = 100_000
    c.train.global_batch_size = 512
    c.train.seq_len = 4096
    c.train.log_every = 10
    c.train.eval_every = 1000
    c.train.eval_batches = 8
    c.train.compute_dtype = "bfloat16"
    # 4 sequences of 4096 tokens per device and micro-batch, every block rematerialised: about
    # 45 GiB per device on 64 devices by the compile-only check (python -m experiments.tools.compile_check).
    c.train.grad_accum_steps = 2
    c.train.remat = "full"
    c.train.scan_layers = True  # 27 layers: one compiled body per run of layers
    c.train.peak_flops_per_device = 989e12
    c.optim.lr = 4.2e-4
    c.optim.warmup_steps = 2000
    c.optim.schedule = "wsd"
    c.checkpoint.every_steps = 500

    m = c.model
    m.vocab_size = 102_400
    m.d_model = 2048
    m.num_layers = 27
    m.num_heads = 16
    m.num_kv_heads = 16
    m.head_dim = 128
    m.mlp_dim = 10_944
    m.tie_embeddings = False
    m.first_k_dense = 1
    m.init_std = 0.006
    m.moe.num_experts = 64
    m.moe.experts_per_token = 6
    m.moe.expert_dim = 1408
    m.moe.num_shared_experts = 2
    m.moe.shared_expert_dim = 1408
    m.moe.renormalize = False
    m.moe.routed_scaling = 1.0
    m.moe.balancing = (("switch", {"weight": 3e-3}), ("z_loss", {"weight": 1e-3}))
    m.moe.tile_size = 128
    m.moe.backend = "expert_parallel"  # experts over mesh.expert; tokens travel by all-to-all
    c.mesh.data = 1
    c.mesh.fsdp = -1
    c.mesh.expert = 8
    return c
