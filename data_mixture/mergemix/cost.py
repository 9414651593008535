"""FLOP accounting of mixture search methods, in the runs table's convention.

Training costs ``6 x N_active x tokens`` (forward + backward, the ``flops`` column of the runs
table); an evaluation costs ``2 x N_active x tokens`` (forward only; generation is counted per
token processed, as the evaluator's throughput reports it). Attention's sequence-length term is
left out on both sides, as in the runs table, so the methods compare on one scale.

- MergeMix: the experts' training (one per domain, each ``expert_tokens``) plus every merge
  evaluated (the evaluation cache's misses). The shared base is reported separately: a researcher
  who already has a pretrained base does not pay for it, one who trains it for the search does.
- Mixture laws: every proxy run's training plus the evaluation of every evaluated checkpoint.
- Brute force: training each candidate mixture at the target size.
"""

from __future__ import annotations


def train_flops(params_active: float, tokens: float) -> float:
    return 6.0 * params_active * tokens


def eval_flops(params_active: float, tokens: float) -> float:
    return 2.0 * params_active * tokens


def mergemix_cost(*, params_active: float, base_tokens: float, expert_tokens: float, num_experts: int,
                  merges: int, eval_tokens_per_merge: float) -> dict[str, float]:
    """FLOPs of a MergeMix search (module docstring); ``total`` excludes the base."""
    experts = num_experts * train_flops(params_active, expert_tokens)
    merge_evals = merges * eval_flops(params_active, eval_tokens_per_merge)
    return {"base": train_flops(params_active, base_tokens), "experts": experts, "merges": merge_evals,
            "total": experts + merge_evals, "total_with_base": experts + merge_evals
            + train_flops(params_active, base_tokens)}


def sweep_cost(runs: list[dict], eval_tokens_per_checkpoint: float) -> dict[str, float]:
    """FLOPs of a proxy sweep: ``runs`` holds per run ``params_active``, ``tokens`` (trained) and
    ``checkpoints`` (evaluated)."""
    training = sum(train_flops(r["params_active"], r["tokens"]) for r in runs)
    evaluation = sum(r["checkpoints"] * eval_flops(r["params_active"], eval_tokens_per_checkpoint) for r in runs)
    return {"training": training, "evaluation": evaluation, "total": training + evaluation}
