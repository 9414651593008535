"""Held-out loss per domain: nats per token, perplexity and bits per byte.

Bits per byte = total nats / ln 2 / total UTF-8 bytes of the predicted (scored) tokens. Unlike
nats per token it does not depend on how much text a token holds, so models with different
tokenizers compare. Bytes come from the token ids: one per byte id for the byte tokenizer (whose
windows can split a multi-byte character, which decoding would turn into a replacement
character), and the length of the decoded text of each row's scored targets for a BPE. Special
tokens (EOS) are scored but hold no bytes.

The batches are the run's own held-out batches (``make_eval_batches`` with the training batch
shape), so ``loss_mean`` at the last step equals the training log's final ``eval_loss`` when the
same number of batches is used.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import tqdm

from moejax.data.packing import Example
from moejax.data.tokenizer import ByteTokenizer, Tokenizer
from moejax.eval.forward import Scorer
from moejax.eval.restore import Checkpoint
from moejax.eval.routing import add_sums


def target_bytes(tokenizer: Tokenizer, targets_bt: np.ndarray, mask_bt: np.ndarray) -> int:
    """UTF-8 bytes of the targets where ``mask_bt`` is set."""
    if tokenizer.name == ByteTokenizer.name:
        return int(np.sum((targets_bt < 256) & (mask_bt > 0)))
    return sum(len(tokenizer.decode(row[m > 0]).encode("utf-8")) for row, m in zip(targets_bt, mask_bt))


def loss_standard_error(rows_w2: np.ndarray) -> float | None:
    """The standard error of the loss ``sum(nats) / sum(tokens)`` over the evaluated windows
    (``rows_w2``: nats and scored tokens per window; padding rows, with no tokens, left out): the
    ratio estimator's ``sqrt(sum((n_i - L t_i)^2) / (k (k - 1))) / mean(t)`` over k windows, as if
    the windows were drawn at random from the held-out split (``train.eval_windows=sampled``; with
    ``first`` the windows are consecutive and it understates the error). None below 2 windows."""
    rows_w2 = rows_w2[rows_w2[:, 1] > 0]
    k = len(rows_w2)
    if k < 2:
        return None
    nats, tokens = rows_w2[:, 0], rows_w2[:, 1]
    loss = nats.sum() / tokens.sum()
    return float(math.sqrt(np.sum((nats - loss * tokens) ** 2) / (k * (k - 1))) / tokens.mean())


def heldout_losses(
    scorer: Scorer, ckpt: Checkpoint, eval_batches: dict[str, list[Example]], tokenizer: Tokenizer,
    *, progress: bool = True,
) -> tuple[dict[str, Any], dict[str, np.ndarray], int]:
    """(per-domain losses with their means, routing sums over all batches, tokens run)."""
    domains, routing, tokens_run = {}, None, 0
    batches = [(d, b) for d, domain_batches in eval_batches.items() for b in domain_batches]
    totals = {d: np.zeros(3) for d in eval_batches}  # nats, scored tokens, bytes
    per_row: dict[str, list[np.ndarray]] = {d: [] for d in eval_batches}  # (nats, tokens) of each window
    for domain, batch in tqdm.tqdm(batches, desc="held-out loss", unit="batch", disable=not progress, leave=False):
        out = scorer(ckpt.params, ckpt.balance, batch, routing=True)
        routing = add_sums(routing, out["routing"])
        nbytes = target_bytes(tokenizer, batch["targets"], batch["loss_mask"])
        totals[domain] += (-float(out["logprob_b"].sum()), float(out["tokens_b"].sum()), nbytes)
        per_row[domain].append(np.stack([-np.asarray(out["logprob_b"], np.float64), np.asarray(out["tokens_b"], np.float64)], 1))
        tokens_run += int(np.sum(batch["segment_ids"] > 0))
    for domain, (nats, count, nbytes) in totals.items():
        loss = nats / max(count, 1.0)
        domains[domain] = {
            "loss": loss, "loss_se": loss_standard_error(np.concatenate(per_row[domain])),
            "perplexity": math.exp(min(loss, 700.0)),
            "bits_per_byte": nats / math.log(2) / max(nbytes, 1.0), "tokens": int(count), "bytes": int(nbytes),
        }
    summary = {
        "domains": domains,
        "loss_mean": float(np.mean([d["loss"] for d in domains.values()])),
        "bits_per_byte_mean": float(np.mean([d["bits_per_byte"] for d in domains.values()])),
    }
    return summary, routing, tokens_run
