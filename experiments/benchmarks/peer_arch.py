"""The PyTorch peer's architecture, built twice: as a moejax config and as a PyTorch
``transformers.Qwen2MoeForCausalLM``, with the same shapes.

d_model 256, 4 layers, 4 query heads and 4 key/value heads of width 64 with q/k/v biases (Qwen2),
16 routed experts top-2 of width 512 with renormalised top-k weights, no shared expert, untied
embeddings over a 256-token vocabulary, sequences of 256 tokens, batches of 16, AdamW (lr 3e-3,
weight decay 0.1, betas 0.9/0.95, global-norm clipping at 1), float32, one device. The peer's
router auxiliary loss is on (``output_router_logits``), like moejax's default Switch loss.

Used by :mod:`experiments.benchmarks.peer` (the side-by-side race) and
:mod:`experiments.benchmarks.profile_step` (where a step's time goes).
"""

from __future__ import annotations

from moejax.config import default_config

D_MODEL, LAYERS, HEADS, HEAD_DIM = 256, 4, 4, 64
EXPERTS, TOP_K, EXPERT_DIM = 16, 2, 512
VOCAB, SEQ, BATCH = 256, 256, 16
LR, WEIGHT_DECAY, B1, B2, CLIP = 3e-3, 0.1, 0.9, 0.95, 1.0


def moejax_config(backend: str = "dropless", dense: bool = False):
    """The peer architecture as a moejax config. ``dense=True``: the same model with every MoE
    layer replaced by a dense SwiGLU of the routed experts' active width (top_k * expert_dim), so
    the active FLOPs per token are equal."""
    c = default_config()
    c.train.global_batch_size, c.train.seq_len = BATCH, SEQ
    c.train.steps = 1000
    c.optim.lr, c.optim.weight_decay, c.optim.b1, c.optim.b2, c.optim.clip_norm = LR, WEIGHT_DECAY, B1, B2, CLIP
    m = c.model
    m.vocab_size, m.d_model, m.num_layers = VOCAB, D_MODEL, LAYERS
    m.num_heads = m.num_kv_heads = HEADS
    m.head_dim = HEAD_DIM
    m.attn_bias = True
    m.tie_embeddings = False
    m.mlp_dim = TOP_K * EXPERT_DIM
    m.moe.num_experts, m.moe.experts_per_token, m.moe.expert_dim = EXPERTS, TOP_K, EXPERT_DIM
    m.moe.num_shared_experts = 0
    m.moe.backend = backend
    m.moe.balancing = (("switch", {"weight": 1e-2}),)
    if dense:
        m.first_k_dense = LAYERS  # every layer dense
    return c


def torch_model(seed: int = 0):
    """The peer: ``Qwen2MoeForCausalLM`` of the same shapes (float32, CPU), and its AdamW."""
    import torch
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

    torch.manual_seed(seed)
    config = Qwen2MoeConfig(
        vocab_size=VOCAB, hidden_size=D_MODEL, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
        num_key_value_heads=HEADS, head_dim=HEAD_DIM, intermediate_size=TOP_K * EXPERT_DIM,
        moe_intermediate_size=EXPERT_DIM, shared_expert_intermediate_size=0, num_experts=EXPERTS,
        num_experts_per_tok=TOP_K, norm_topk_prob=True, output_router_logits=True,
        router_aux_loss_coef=1e-2, tie_word_embeddings=False, max_position_embeddings=SEQ,
        use_cache=False, qkv_bias=True,
    )
    config._attn_implementation = "sdpa"
    model = Qwen2MoeForCausalLM(config).float()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, betas=(B1, B2), weight_decay=WEIGHT_DECAY)
    return model, optimizer


def torch_step(model, optimizer, tokens):
    """One training step of the peer on int64 ``tokens`` [B, T] (next-token loss; transformers
    shifts the labels itself)."""
    import torch

    optimizer.zero_grad(set_to_none=True)
    out = model(input_ids=tokens, labels=tokens)
    out.loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
    optimizer.step()
    return out.loss
