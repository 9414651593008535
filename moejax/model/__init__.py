"""The moejax model: a decoder-only Mixture-of-Experts transformer in Flax NNX.

Array names carry their shapes. Dimension letters:

====  ==========================================
b     batch (sequences)
t, s  time: query / key positions
d     model width (d_model)
n     query heads
k     key/value heads (attention); experts per token (routing)
h     head dimension
f     hidden width of an MLP or expert
e     experts
v     vocabulary
g     groups of tokens for dispatch (one per sequence)
c     expert capacity slots (capacity backend)
m     sorted (token, choice) rows (dropless backend)
l     layers (MoE layers in routing statistics; all layers in a KV cache)
p     devices on the expert mesh axis (expert_parallel backend)
====  ==========================================

Modules: ``layers`` (RMSNorm, RoPE, attention, SwiGLU MLP), ``router`` (float32 scores, top-k,
routing statistics), ``balancing`` (pluggable load-balancing objectives and their state),
``grouped_matmul``, ``dispatch`` and ``expert_parallel`` (capacity, dropless and expert-parallel
backends), ``moe`` (the MoE block), ``transformer`` (the decoder: runs of stacked layers applied
with ``nnx.scan``, optional rematerialisation), ``decode`` (the KV cache and sampling).
"""
