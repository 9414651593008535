"""The lm-eval model ``moejax``: a training run's checkpoint behind lm-eval's ``LM`` interface.

``MoejaxLM(workdir=DIR, step=N, batch_size=B)`` opens the checkpoint with :func:`moejax.load`
(the Python API: the run's config, its tokenizer, the local devices, the evaluation's jitted
forward and the KV-cache generator) and answers lm-eval's three request types:

- ``loglikelihood``: summed log-probabilities of continuations after contexts, and whether greedy
  decoding would have produced them (:mod:`.rows`), by the same jitted forward as moejax's own
  multiple-choice scoring;
- ``loglikelihood_rolling``: a document's log-likelihood over rolling windows of the training
  sequence length;
- ``generate_until``: greedy (or sampled, with ``do_sample``/``temperature``) decoding with the
  KV cache of :class:`moejax.eval.generator.Generator`, stopping at the ``until`` strings, at the
  end-of-sequence token or after ``max_gen_toks`` tokens.

Requests are batched (rows of equal padded width, ``batch_size`` at a time), so an evaluation
compiles once per width. Importing this module registers the class with lm-eval as ``moejax``.
"""

from __future__ import annotations

import logging
from typing import Any

import lm_eval.models  # noqa: F401  lm-eval's own models first: see _register
import numpy as np
import tqdm
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model

from moejax.eval.lm_eval.rows import Row, continuation_rows, rolling_rows, score_rows
from moejax.eval.generator import Generator
from moejax.trained import load

log = logging.getLogger(__name__)

NAME = "moejax"
DEFAULT_BATCH_SIZE = 32
DEFAULT_MAX_GEN_TOKS = 256  # lm-eval's own default for generate_until
# Passed by lm-eval to every model and ignored: JAX places the model on the devices it sees.
IGNORED_OPTIONS = {"max_batch_size", "device", "trust_remote_code"}


class MoejaxLM(LM):
    """A moejax checkpoint as an lm-eval model (``--model moejax --model_args workdir=DIR[,step=N]``)."""

    def __init__(self, workdir: str, step: int | None = None, batch_size: int | str | None = None,
                 progress: bool = True, **lm_eval_options: Any):
        super().__init__()
        unknown = sorted(set(lm_eval_options) - IGNORED_OPTIONS)
        if unknown:
            raise ValueError(f"moejax: unknown model argument(s) {unknown}; allowed: workdir, step, batch_size, "
                             "progress (e.g. --model_args workdir=runs/tiny_moe,step=400).")
        self.model = load(str(workdir), None if step in (None, "") else int(step), batch_size=_batch_size(batch_size))
        self.erun, self.ckpt, self.tokenizer = self.model.erun, self.model.checkpoint, self.model.tokenizer
        self.max_len = self.model.max_len
        self.batch_size = self.model.batch_size  # a multiple of the devices a batch is split over
        self.progress = progress
        self.scorer = self.model.scorer
        self._warned: set[str] = set()

    # -- lm-eval's interface --------------------------------------------------------------------

    def loglikelihood(self, requests) -> list[tuple[float, bool]]:
        encode = self.tokenizer.encode
        per_request = [
            continuation_rows(encode(context) if context else np.zeros(0, np.int32), encode(continuation),
                              self.tokenizer.eos_id, self.max_len)
            for context, continuation in (r.args for r in requests)
        ]
        results = [(float(logprob), bool(greedy)) for logprob, greedy in self._score(per_request, "loglikelihood")]
        for request, result in zip(requests, results):
            self.cache_hook.add_partial("loglikelihood", request.args, result)
        return results

    def loglikelihood_rolling(self, requests) -> list[float]:
        per_request = [rolling_rows(self.tokenizer.encode(text), self.tokenizer.eos_id, self.max_len)
                       for (text,) in (r.args for r in requests)]
        results = [float(logprob) for logprob, _ in self._score(per_request, "loglikelihood_rolling")]
        for request, result in zip(requests, results):
            self.cache_hook.add_partial("loglikelihood_rolling", request.args, result)
        return results

    def generate_until(self, requests) -> list[str]:
        groups: dict[tuple, list[int]] = {}
        for index, request in enumerate(requests):
            groups.setdefault(self._generation_settings(request.args[1]), []).append(index)
        results: list[str] = [""] * len(requests)
        bar = tqdm.tqdm(total=len(requests), desc="generate_until", disable=not self.progress, leave=False)
        for (until, max_gen_toks, temperature, top_p), indices in groups.items():
            prompts = {i: self._prompt(requests[i].args[0]) for i in indices}
            order = sorted(indices, key=lambda i: len(prompts[i]))
            for start in range(0, len(order), self.batch_size):
                chunk = order[start : start + self.batch_size]
                texts = self._generate([prompts[i] for i in chunk], until, max_gen_toks, temperature, top_p)
                for i, text in zip(chunk, texts):
                    results[i] = text
                    self.cache_hook.add_partial("generate_until", requests[i].args, text)
                bar.update(len(chunk))
        bar.close()
        return results

    @property
    def generator(self) -> Generator:
        """The KV-cache generator over the training context (built on first use)."""
        return self.model.generator()

    @property
    def tokenizer_name(self) -> str:
        return self.tokenizer.name

    def get_model_info(self) -> dict[str, Any]:
        """Recorded in lm-eval's results under ``config``."""
        return {"moejax_workdir": self.erun.workdir, "moejax_step": self.ckpt.step,
                "moejax_tokenizer": self.tokenizer.name, "moejax_max_length": self.max_len}

    # -- helpers ----------------------------------------------------------------------------------

    def _score(self, per_request: list[list[Row]], desc: str) -> list[tuple[float, bool]]:
        """Scores every row of every request in shared batches; sums each request's rows."""
        flat = [row for rows in per_request for row in rows]
        logprob, greedy = score_rows(self.scorer, self.ckpt, flat, max_len=self.max_len,
                                     batch_size=self.batch_size, desc=desc, progress=self.progress)
        out, start = [], 0
        for rows in per_request:
            end = start + len(rows)
            out.append((float(logprob[start:end].sum()), bool(greedy[start:end].all())))
            start = end
        return out

    def _generation_settings(self, gen_kwargs: dict[str, Any]) -> tuple[tuple[str, ...], int, float, float]:
        kwargs = dict(gen_kwargs or {})
        until = kwargs.pop("until", None) or ()
        until = tuple(s for s in ((until,) if isinstance(until, str) else until) if s)
        max_gen_toks = int(kwargs.pop("max_gen_toks", DEFAULT_MAX_GEN_TOKS))
        cap = self.max_len // 2
        if max_gen_toks > cap:
            self._warn_once(f"moejax: max_gen_toks={max_gen_toks} cut to {cap}: half of the {self.max_len} positions "
                            "the model was trained on (train.seq_len), so that the prompt keeps the other half.")
            max_gen_toks = cap
        do_sample = bool(kwargs.pop("do_sample", False))
        temperature = float(kwargs.pop("temperature", 1.0 if do_sample else 0.0))
        top_p = float(kwargs.pop("top_p", 1.0))
        if not do_sample:
            temperature = 0.0
        if kwargs:
            self._warn_once(f"moejax: generation options {sorted(kwargs)} are not supported and are ignored.")
        return until, max(max_gen_toks, 1), temperature, top_p

    def _warn_once(self, message: str) -> None:
        if message not in self._warned:
            self._warned.add(message)
            log.warning(message)

    def _prompt(self, context: str) -> np.ndarray:
        ids = self.tokenizer.encode(context) if context else np.zeros(0, np.int32)
        return ids if len(ids) else np.array([self.tokenizer.eos_id], np.int32)

    def _generate(self, prompts: list[np.ndarray], until: tuple[str, ...], max_gen_toks: int,
                  temperature: float, top_p: float) -> list[str]:
        decode = self.tokenizer.decode
        padded = prompts + [prompts[0]] * (self.batch_size - len(prompts))  # one batch shape: one compile
        rows = self.generator.generate(
            self.ckpt.params, self.ckpt.balance, padded, max_new_tokens=max_gen_toks, temperature=temperature,
            top_p=top_p, stop_ids=(self.tokenizer.eos_id,),
            done=(lambda ids: any(s in decode(ids) for s in until)) if until else None,
        )[: len(prompts)]
        return [cut_at_stop(decode(row), until) for row in rows]


def cut_at_stop(text: str, until: tuple[str, ...]) -> str:
    """``text`` up to the earliest occurrence of any stop string (lm-eval's convention)."""
    cut = min((text.find(s) for s in until if s and s in text), default=len(text))
    return text[:cut]


def _batch_size(value: int | str | None) -> int:
    if value in (None, "", "auto") or (isinstance(value, str) and value.startswith("auto")):
        return DEFAULT_BATCH_SIZE
    size = int(value)
    if size < 1:
        raise ValueError(f"moejax: batch_size must be a positive integer or 'auto', got {value!r}.")
    return size


def _register() -> None:
    """Registers :class:`MoejaxLM` as ``moejax``. lm-eval fills its model registry with its own models
    only when the registry is empty, so they are imported first (above): registering into an empty
    registry would hide ``hf`` and the others from the rest of the process."""
    register_model(NAME)(MoejaxLM)


_register()
