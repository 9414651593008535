"""Checkpoint evaluation: held-out losses, benchmarks, routing statistics (``python -m moejax.eval``).

Modules, in the order the data flows:

==============  ==================================================================================
``benchmarks``  the built-in benchmarks (a package: one module per version, a registry, a cache)
``restore``     a run's config, a mesh from the local devices, parameters and balancing state, and
                the run's scorer and generator (below), built there for every reader
``tasks``       benchmark JSONL files (built-in or the user's), validated line by line
``forward``     the jitted scoring forward: per-row log-likelihoods, each MoE layer's routing
``generator``   the KV-cache generator (greedy, temperature, top-p), also behind ``moejax.generate``
``losses``      held-out loss, perplexity and bits per byte per domain
``harness``     multiple choice by log-likelihood, exact match by greedy decoding (KV cache)
``calibration`` expected calibration error of the choices' softmax
``routing``     per-layer load, MaxVio, Gini, entropy and expert co-occurrence
``masking``     masking experts out of the top-k (pruning studies)
``evaluate``    one checkpoint's whole evaluation as a dict (``step_N.json``)
``report``      the printed table; ``plots``: curves over checkpoints
``lm_eval``     the lm-evaluation-harness adapter: the lm-eval model ``moejax`` and its command
==============  ==================================================================================

The ``generate`` command and :func:`moejax.load` build on these (nothing here imports
``moejax.generate``); keys, options and measured numbers in ``docs/eval.md``.
"""
