"""Data for moejax: tokenizer, the built-in multi-domain corpus, and the grain pipeline.

Modules, in the order data flows through them:

- ``tokenizer``: ``ByteTokenizer`` and ``get_tokenizer(name)``.
- ``stdlib_text``, ``synthetic_math``, ``synthetic_knowledge``: the four domains' raw documents.
- ``corpus``: ``DOMAINS``, ``build_corpus`` (split + manifest of content hashes) and
  ``load_tokenized_corpus`` (atomic on-disk ``.npy`` cache).
- ``streams``: documents -> ``TokenStream`` (one EOS-separated stream + document offsets).
- ``packing``: windows of a stream -> packed examples (segment ids, positions, loss mask).
- ``pipeline``: ``make_train_iterator`` (grain mixture of domains, resumable) and
  ``make_eval_batches`` (fixed held-out batches).
"""

from moejax.data.corpus import (
    DOMAINS,
    Corpus,
    TokenizedCorpus,
    build_corpus,
    load_tokenized_corpus,
)
from moejax.data.pipeline import make_eval_batches, make_train_iterator, normalize_mixture
from moejax.data.tokenizer import ByteTokenizer, get_tokenizer

__all__ = [
    "DOMAINS",
    "ByteTokenizer",
    "Corpus",
    "TokenizedCorpus",
    "build_corpus",
    "get_tokenizer",
    "load_tokenized_corpus",
    "make_eval_batches",
    "make_train_iterator",
    "normalize_mixture",
]
