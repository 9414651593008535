"""About 100M total parameters (16 experts, top-2, one shared expert), sized for one GPU.

./launch.sh experiments/configs/small_moe.py --workdir runs/small
On CPU it runs too, slowly; pass e.g. --config.train.steps=20 to smoke-test it.
"""

from moejax.config import default_config


def get_config():
    c = default_config()
    c.train.steps = 20_000
    c.train.global_batch_size = 64
    c.train.seq_len = 1024
    c.train.log_every = 50
    c.train.eval_every = 1000
    c.train.eval_batches = 4
    c.train.compute_dtype = "bfloat16"
    c.train.scan_layers = True  # compile one body per run of layers; lets train.remat cut memory
    c.train.peak_flops_per_device = 989e12  # H100/H200 dense bf16; set yours for a meaningful MFU
    c.optim.lr = 1e-3
    c.optim.warmup_steps = 1000
    c.checkpoint.every_steps = 1000

    m = c.model
    m.vocab_size = 272
    m.d_model = 512
    m.num_layers = 8
    m.num_heads = 8
    m.num_kv_heads = 4
    m.head_dim = 64
    m.mlp_dim = 2048
    m.moe.num_experts = 16
    m.moe.experts_per_token = 2
    m.moe.expert_dim = 448
    m.moe.num_shared_experts = 1
    m.moe.shared_expert_dim = 512
    m.moe.tile_size = 128
    return c


def cpu_benchmark_config(batch: int = 8, seq: int = 512):
    """The config at the reduced batch the CPU benchmarks time (step_time.py, profile_step.py):
    ``batch`` x ``seq`` tokens in float32 (bf16 matmuls are slower than f32 on CPU)."""
    c = get_config()
    c.train.global_batch_size, c.train.seq_len, c.train.compute_dtype = batch, seq, "float32"
    return c
