"""Scoring benchmark tasks: multiple choice by log-likelihood, exact match by greedy decoding.

Multiple choice. Every (item, choice) pair is one row: the context's tokens followed by the
choice's (each encoded on its own, so a choice's tokens do not depend on the context), cut from
the left to the model's training length; the score is the sum of the log-probabilities of the
choice's tokens. The prediction is the choice with the highest score (``accuracy``), or with the
highest score per token (``accuracy_per_token``) or per UTF-8 byte of the choice text
(``accuracy_per_byte``): the normalised variants do not favour short choices. ``ece`` is the
expected calibration error of the softmax over the choices' scores (:mod:`calibration`).
``gold_logprob`` is the continuous score: the mean over items of the log-probability (nats, summed
over its tokens) of the correct choice, which still moves when the accuracy has saturated.

Rows are batched by length: each batch is padded to a bucket width (a power of two up to the
training length) and to a fixed number of rows, so a whole task compiles once per bucket.

Exact match. Prompts are decoded greedily in fixed-size batches with the KV-cache
:class:`moejax.eval.generator.Generator` until every row has produced a newline (or EOS, or the token
budget); the text up to the first newline, stripped, must equal the stripped answer. Its continuous score
``gold_logprob`` is the answer's log-probability after the prompt, by teacher forcing (scored like
a multiple-choice item with the answer as its only choice).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tqdm

from moejax.data.packing import Example
from moejax.data.tokenizer import Tokenizer
from moejax.eval.calibration import choice_probabilities, expected_calibration_error
from moejax.eval.forward import Scorer
from moejax.eval.restore import Checkpoint
from moejax.eval.tasks import Task
from moejax.eval.generator import Generator, length_bucket

EXAMPLES_KEPT = 3  # exact-match predictions shown in the report


def choice_rows(task: Task, tokenizer: Tokenizer, max_len: int) -> list[tuple[int, int, np.ndarray, int]]:
    """(item, choice, token ids, number of choice tokens) per pair; ids hold at most max_len + 1.

    Items with a choice longer than ``max_len`` tokens cannot be scored like the others and are
    left out (the result counts them as ``skipped``).
    """
    rows = []
    for i, item in enumerate(task.items):
        context_ids = tokenizer.encode(item["context"])
        choice_ids = [tokenizer.encode(choice) for choice in item["choices"]]
        if max(len(ids) for ids in choice_ids) > max_len:
            continue
        for c, ids in enumerate(choice_ids):
            row_ids = np.concatenate([context_ids, ids]).astype(np.int32)[-(max_len + 1):]
            rows.append((i, c, row_ids, len(ids)))
    return rows


def pack_rows(rows: list[tuple[np.ndarray, int]], width: int, batch_size: int) -> Example:
    """A batch of ``batch_size`` rows of ``width`` inputs; row r scores its last ``n_r`` targets.
    Padding (positions past a row, rows past the list) has segment id 0 and no loss."""
    batch = {
        "inputs": np.zeros((batch_size, width), np.int32), "targets": np.zeros((batch_size, width), np.int32),
        "segment_ids": np.zeros((batch_size, width), np.int32),
        "positions": np.broadcast_to(np.arange(width, dtype=np.int32), (batch_size, width)).copy(),
        "loss_mask": np.zeros((batch_size, width), np.float32),
    }
    for r, (ids, n_scored) in enumerate(rows):
        n = len(ids) - 1
        batch["inputs"][r, :n], batch["targets"][r, :n] = ids[:-1], ids[1:]
        batch["segment_ids"][r, :n] = 1
        batch["loss_mask"][r, n - n_scored : n] = 1.0
    return batch


MC_METRICS = ("accuracy", "accuracy_per_token", "accuracy_per_byte", "ece", "gold_logprob")


def multiple_choice_metrics(
    loglik_nc: np.ndarray, tokens_nc: np.ndarray, bytes_nc: np.ndarray, gold_n: np.ndarray
) -> dict[str, float]:
    """Accuracy (raw, per token, per byte), ECE and mean gold log-prob of items with equally many choices."""
    probs_nc = choice_probabilities(loglik_nc)
    correct_n = np.argmax(loglik_nc, axis=1) == gold_n
    return {
        "accuracy": float(correct_n.mean()),
        "accuracy_per_token": float((np.argmax(loglik_nc / tokens_nc, axis=1) == gold_n).mean()),
        "accuracy_per_byte": float((np.argmax(loglik_nc / bytes_nc, axis=1) == gold_n).mean()),
        "ece": expected_calibration_error(probs_nc.max(axis=1), correct_n),
        "gold_logprob": float(np.take_along_axis(loglik_nc, gold_n[:, None], axis=1).mean()),
    }


def choice_logliks(
    scorer: Scorer, ckpt: Checkpoint, task: Task, tokenizer: Tokenizer, *, max_len: int, batch_size: int,
    progress: bool = True,
) -> tuple[dict[tuple[int, int], float], dict[tuple[int, int], int], int]:
    """(log-likelihood and token count of each (item, choice), tokens run)."""
    rows = choice_rows(task, tokenizer, max_len)
    by_width: dict[int, list] = {}
    for row in sorted(rows, key=lambda r: len(r[2])):
        by_width.setdefault(length_bucket(len(row[2]) - 1, max_len, smallest=64), []).append(row)
    batches = [(width, group[s : s + batch_size]) for width, group in by_width.items()
               for s in range(0, len(group), batch_size)]
    loglik = {}
    for width, group in tqdm.tqdm(batches, desc=task.name, unit="batch", disable=not progress, leave=False):
        out = scorer(ckpt.params, ckpt.balance, pack_rows([(r[2], r[3]) for r in group], width, batch_size))
        for (i, c, _, _), value in zip(group, out["logprob_b"]):
            loglik[i, c] = float(value)
    return loglik, {(i, c): n for i, c, _, n in rows}, sum(len(r[2]) - 1 for r in rows)


def score_multiple_choice(
    scorer: Scorer, ckpt: Checkpoint, task: Task, tokenizer: Tokenizer, *, max_len: int, batch_size: int,
    progress: bool = True,
) -> tuple[dict[str, Any], int]:
    """(the task's results, tokens run)."""
    loglik, num_tokens, tokens_run = choice_logliks(
        scorer, ckpt, task, tokenizer, max_len=max_len, batch_size=batch_size, progress=progress
    )
    scored = sorted({i for i, _ in loglik})
    counts = {"kind": "multiple_choice", "items": len(scored), "skipped": len(task.items) - len(scored)}
    if not scored:  # e.g. a short-context model: no choice fits; the metrics are undefined
        return {**counts, **dict.fromkeys(MC_METRICS)}, 0
    # Items may have different numbers of choices: score each group of equal size together.
    results, weights = [], []
    for num_choices in sorted({len(task.items[i]["choices"]) for i in scored}):
        index = [i for i in scored if len(task.items[i]["choices"]) == num_choices]
        loglik_nc = np.array([[loglik[i, c] for c in range(num_choices)] for i in index])
        tokens_nc = np.array([[num_tokens[i, c] for c in range(num_choices)] for i in index])
        bytes_nc = np.array([[len(ch.encode("utf-8")) for ch in task.items[i]["choices"]] for i in index])
        gold_n = np.array([task.items[i]["gold"] for i in index])
        results.append(multiple_choice_metrics(loglik_nc, tokens_nc, bytes_nc, gold_n))
        weights.append(len(index))
    merged = {key: float(np.average([r[key] for r in results], weights=weights)) for key in results[0]}
    return {**counts, **merged}, tokens_run


def score_exact_match(
    generator: Generator, ckpt: Checkpoint, task: Task, tokenizer: Tokenizer, *, max_new_tokens: int,
    batch_size: int, progress: bool = True,
) -> tuple[dict[str, Any], int]:
    """(the task's results, tokens run: prompts plus generated tokens)."""
    prompts = [tokenizer.encode(item["prompt"]) for item in task.items]
    predictions, tokens_run = [], 0
    starts = range(0, len(prompts), batch_size)
    for start in tqdm.tqdm(starts, desc=task.name, unit="batch", disable=not progress, leave=False):
        chunk = prompts[start : start + batch_size]
        padded = chunk + [chunk[0]] * (batch_size - len(chunk))  # a fixed batch shape: one compile
        new_rows = generator.generate(
            ckpt.params, ckpt.balance, padded, max_new_tokens=max_new_tokens, stop_ids=(tokenizer.eos_id,),
            done=lambda ids: "\n" in tokenizer.decode(ids),
        )[: len(chunk)]
        predictions += [tokenizer.decode(row).split("\n")[0].strip() for row in new_rows]
        tokens_run += sum(min(len(p), generator.max_len - max_new_tokens) + len(r) for p, r in zip(chunk, new_rows))
    correct = [p == item["answer"].strip() for p, item in zip(predictions, task.items)]
    examples = [
        {"prompt": item["prompt"], "answer": item["answer"], "prediction": p}
        for p, item in list(zip(predictions, task.items))[:EXAMPLES_KEPT]
    ]
    return {"kind": "exact_match", "items": len(task.items), "exact_match": float(np.mean(correct)),
            "examples": examples}, tokens_run


def answers_as_choices(task: Task) -> Task:
    """An exact-match task as multiple-choice items whose only choice (the gold) is the answer after
    the prompt: the rows that score its answers by teacher forcing (:func:`answer_logprob`)."""
    return Task(task.name, task.kind, tuple({"context": it["prompt"], "choices": [it["answer"]], "gold": 0}
                                            for it in task.items), task.source)


def answer_logprob(
    scorer: Scorer, ckpt: Checkpoint, task: Task, tokenizer: Tokenizer, *, max_len: int, batch_size: int,
    progress: bool = True,
) -> tuple[float | None, int]:
    """(mean log-probability of an exact-match task's answers after their prompts, tokens run); None
    when no answer fits ``max_len``."""
    loglik, _, tokens_run = choice_logliks(scorer, ckpt, answers_as_choices(task), tokenizer, max_len=max_len,
                                           batch_size=batch_size, progress=progress)
    return (float(np.mean(list(loglik.values()))) if loglik else None), tokens_run
