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
l     MoE layers
====  ==========================================

Modules: ``layers`` (RMSNorm, RoPE, attention, SwiGLU MLP), ``router`` (float32 scores, top-k,
routing statistics), ``balancing`` (pluggable load-balancing objectives and their state),
``grouped_matmul`` and ``dispatch`` (capacity and dropless backends), ``moe`` (the MoE block),
``transformer`` (the decoder).
"""
