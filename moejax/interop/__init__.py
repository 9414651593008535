"""Interoperation with other frameworks' checkpoints.

``hf``: Hugging Face ``transformers`` safetensors checkpoints of Mixtral, Qwen2-MoE, Qwen3-MoE
and dots1 (DeepSeek-V3 MoE with standard attention) models, imported into moejax workdirs and
exported back; see docs/hf_interop.md.
"""
