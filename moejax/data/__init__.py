"""Data for moejax: tokenizers, the built-in corpus, prepared datasets, grain pipeline.

Modules, in the order data flows through them:

- ``tokenizer``: the ``Tokenizer`` protocol, ``ByteTokenizer``, ``load_tokenizer`` and
  ``check_tokenizer_matches``; ``bpe``: the byte-level BPE trained on the user's corpus;
  ``hf_tokenizer``: any Hugging Face tokenizer (a ``tokenizer.json`` or a model directory).
- ``stdlib_text``, ``synthetic_math``, ``synthetic_knowledge``: the built-in domains' documents.
- ``corpus``: ``DOMAINS``, ``build_corpus`` (split + manifest of content hashes) and
  ``load_tokenized_corpus`` (atomic on-disk ``.npy`` cache); ``export``: the built-in corpus as
  text files. The built-in benchmarks derived from it are evaluation tasks:
  :mod:`moejax.eval.benchmarks`.
- ``sources`` (which files a ``DOMAIN=PATH`` names, and their documents), ``layout`` (where a
  prepared dataset keeps its files) and ``prepare`` (``python -m moejax.data.prepare``).
- ``dataset``: ``open_dataset(path)``, one view of the built-in corpus or a prepared dataset;
  ``verify_dataset(path)`` checks every shard file of a prepared dataset against its manifest
  (training checks each the first time it reads it: ``shard_check``).
- ``streams``: documents -> ``TokenStream``; ``packing``: windows -> packed examples.
- ``mixture``: weights and schedules; ``pipeline``: ``MixtureIterator`` (grain mixture of
  domains, staged, resumable, per-process rows) and ``make_eval_batches``.
- ``from_config``: ``make_data(cfg)``, what the training loop calls.

Every bad input raises :class:`moejax.errors.DataError` (a ``ConfigError``) naming the source and the fix.
"""

import importlib
from typing import Any

# Names exported here, and the module each lives in. They are imported on first access (PEP 562),
# so ``python -m moejax.data.prepare`` and its worker processes do not pay for grain and jax.
_EXPORTS = {
    "DOMAINS": "corpus",
    "build_corpus": "corpus",
    "load_tokenized_corpus": "corpus",
    "TokenDataset": "dataset",
    "describe_dataset": "dataset",
    "open_dataset": "dataset",
    "verify_dataset": "dataset",
    "TrainData": "from_config",
    "check_data_config": "from_config",
    "make_data": "from_config",
    "MixtureWarning": "mixture",
    "Schedule": "mixture",
    "Stage": "mixture",
    "normalize_mixture": "mixture",
    "MixtureIterator": "pipeline",
    "make_eval_batches": "pipeline",
    "make_train_iterator": "pipeline",
    "ByteTokenizer": "tokenizer",
    "Tokenizer": "tokenizer",
    "check_tokenizer_matches": "tokenizer",
    "load_tokenizer": "tokenizer",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'moejax.data' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"moejax.data.{_EXPORTS[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
