"""MergeMix (Wang et al., arXiv 2601.17858): mixture ratios from merge weights of domain experts.

One module per job (docs/mergemix.md):

- :mod:`.experts` trains one expert per domain from a shared base checkpoint (constant learning
  rate, short), through the sweep runner, keeping checkpoints at several budgets;
- :mod:`.merge` builds ``theta(alpha) = theta_base + sum_k alpha_k (theta_k - theta_base)`` on
  device and evaluates it with the ``moejax.eval`` machinery, caching every evaluation;
- :mod:`.batched` scores several merges per compiled call with the same numbers and fewer tokens
  (each benchmark context run once), the merge evaluator's default;
- :mod:`.search` chooses alpha: the paper's seed design -> per-task LightGBM regressors -> fine
  simplex search -> verification merges, and a direct CMA-ES search; :mod:`.objective` turns an
  evaluation's metrics into the score it maximises, :mod:`.design` places the seed mixtures and
  the candidates on the simplex;
- :mod:`.routing` measures routing breakdown under merging and calibrates the merged router
  (HARC-style);
- :mod:`.rank` measures rank consistency (Spearman with bootstrap intervals) against trained
  mixtures, :mod:`.cost` counts FLOPs, :mod:`.plots` draws the search and the score surface;
- :mod:`.pipeline` is ``python -m data_mixture mergemix`` end to end (docs/mergemix.md).
"""
