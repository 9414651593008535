"""lm-eval's scoring requests as rows of token ids, scored in batches of fixed shapes.

A row is ``(ids, n)``: the model reads ``ids[:-1]`` and the log-probabilities of the last ``n``
targets (``ids[-n:]``) are summed. A row holds at most ``max_len + 1`` ids (``max_len`` inputs,
the training sequence length).

- ``loglikelihood(context, continuation)``: context and continuation are encoded each on its own
  (as :mod:`moejax.eval.harness` scores multiple choice, so the two give the same numbers) and the
  row is cut from the left to ``max_len + 1`` ids; an empty context is the end-of-sequence token.
  A continuation longer than ``max_len`` tokens is scored in rolling windows, like a document.
- ``loglikelihood_rolling(text)``: lm-eval's disjoint rolling windows
  (``lm_eval.utils.get_rolling_token_windows``): the first window is conditioned on the
  end-of-sequence token, every token is predicted exactly once, and each later window keeps as
  much preceding text as fits as its context.

Rows are sorted by length, padded to a power-of-two width (64 ... ``max_len``, as the multiple-choice
harness does) and to ``batch_size`` rows, so a whole evaluation compiles once per width.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import tqdm
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from moejax.eval.forward import Scorer
from moejax.eval.harness import pack_rows
from moejax.eval.restore import Checkpoint
from moejax.eval.generator import length_bucket

Row = tuple[np.ndarray, int]  # (token ids, number of scored targets at the end)
SMALLEST_WIDTH = 64


def rolling_rows(ids: Sequence[int] | np.ndarray, prefix_id: int, max_len: int) -> list[Row]:
    """Rows that predict every token of ``ids`` once, the first one after ``prefix_id``."""
    windows = get_rolling_token_windows(
        token_list=[int(t) for t in ids], prefix_token=int(prefix_id), max_seq_len=max_len, context_len=1
    )
    rows = []
    for window in windows:
        context, predicted = make_disjoint_window(window)
        rows.append((np.asarray(context + predicted, np.int32), len(predicted)))
    return rows


def continuation_rows(context_ids: np.ndarray, continuation_ids: np.ndarray, prefix_id: int, max_len: int) -> list[Row]:
    """The rows scoring ``continuation_ids`` after ``context_ids`` (``[prefix_id]`` when empty)."""
    context_ids = np.asarray(context_ids, np.int32) if len(context_ids) else np.array([prefix_id], np.int32)
    continuation_ids = np.asarray(continuation_ids, np.int32)
    if len(continuation_ids) <= max_len:
        return [(np.concatenate([context_ids, continuation_ids])[-(max_len + 1):], len(continuation_ids))]
    return rolling_rows(continuation_ids, int(context_ids[-1]), max_len)


def score_rows(
    scorer: Scorer, ckpt: Checkpoint, rows: list[Row], *, max_len: int, batch_size: int, desc: str,
    progress: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """(summed log-probability of each row's scored targets, whether each was the greedy choice)."""
    logprob, greedy = np.zeros(len(rows)), np.zeros(len(rows), bool)
    by_width: dict[int, list[int]] = {}
    for index in sorted(range(len(rows)), key=lambda i: len(rows[i][0])):
        width = length_bucket(len(rows[index][0]) - 1, max_len, smallest=min(SMALLEST_WIDTH, max_len))
        by_width.setdefault(width, []).append(index)
    batches = [(width, group[s : s + batch_size]) for width, group in by_width.items()
               for s in range(0, len(group), batch_size)]
    for width, group in tqdm.tqdm(batches, desc=desc, unit="batch", disable=not progress, leave=False):
        out = scorer(ckpt.params, ckpt.balance, pack_rows([rows[i] for i in group], width, batch_size))
        logprob[group] = out["logprob_b"][: len(group)]
        greedy[group] = out["greedy_b"][: len(group)]
    return logprob, greedy
