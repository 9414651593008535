"""The moejax model: a decoder-only Mixture-of-Experts transformer in Flax NNX.

Array names carry their shapes. Dimension letters:

====  ==========================================
b     batch (sequences)
t, s  time: query / key positions
d     model width (d_model)
n     query heads
k     key/value heads (attention); experts per token (routing); row slots per token (L3)
h     head dimension
f     hidden width of an MLP or expert
e     experts
v     vocabulary
g     groups of tokens for dispatch (one per sequence)
c     expert capacity slots (capacity backend)
m     sorted (token, choice) rows (dropless backend)
l     layers (MoE layers in routing statistics; all layers in a KV cache)
p     devices on the expert mesh axis (expert_parallel backend)
r     rows of an L3 key/value table (the budget)
q, w  L3 key width, value width
u     L3 up-projection width
====  ==========================================

Modules: ``layers`` (RMSNorm, RoPE, attention, SwiGLU MLP), ``router`` (float32 scores, top-k,
routing statistics), ``balancing`` (pluggable load-balancing objectives and their state),
``grouped_matmul``, ``dispatch`` and ``expert_parallel`` (capacity, dropless and expert-parallel
backends), ``moe`` (the MoE block), ``l3`` (Large Lookup Layers: each token attends over its own
rows of a key/value table; host-resident tables for inference), ``transformer`` (the decoder: runs
of stacked layers applied with ``nnx.scan``, split at L3 positions, optional rematerialisation),
``decode`` (the KV cache and sampling).

The model takes typed configs, not the command line's ConfigDict: :class:`~moejax.schema.ModelConfig`
(``Transformer``), :class:`~moejax.schema.MoEConfig` (``MoE``, ``Router``) and
:class:`~moejax.schema.DispatchConfig` (``dispatch``), converted once with
``ModelConfig.from_config(cfg.model)`` (``moejax.train.state.make_model`` does it).
"""
