"""lm-evaluation-harness adapter: moejax checkpoints as the lm-eval model ``moejax``.

==============  ==================================================================================
``model``       :class:`MoejaxLM`, lm-eval's ``LM`` interface over a training run's checkpoint
``rows``        lm-eval's scoring requests as rows of token ids, scored in fixed-shape batches
``offline``     the tasks asked for exist and read local files (no dataset downloads)
``__main__``    ``python -m moejax.eval.lm_eval``: moejax's command, or lm-eval's own with ``run``
==============  ==================================================================================

Importing this package registers ``moejax`` with lm-eval, so that in Python::

    import lm_eval
    import moejax.eval.lm_eval  # noqa: F401
    lm_eval.simple_evaluate(model="moejax", model_args={"workdir": "runs/tiny_moe"}, tasks=[...])

lm-eval 0.4.x discovers no third-party models by itself: the plain ``lm_eval --model moejax`` command
does not know the name; ``python -m moejax.eval.lm_eval run --model moejax ...`` is that command with
the model registered. Usage, the local example tasks and a measured table: ``docs/eval.md``.
"""

from moejax.eval.lm_eval.model import MoejaxLM

__all__ = ["MoejaxLM"]
