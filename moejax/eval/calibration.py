"""Calibration of multiple-choice answers: expected calibration error (ECE)."""

from __future__ import annotations

import numpy as np


def choice_probabilities(loglik_nc: np.ndarray) -> np.ndarray:
    """Softmax over each item's choices of their total log-likelihoods: the model's belief in each
    choice *given that one of them is right*."""
    shifted_nc = loglik_nc - loglik_nc.max(axis=1, keepdims=True)
    probs_nc = np.exp(shifted_nc)
    return probs_nc / probs_nc.sum(axis=1, keepdims=True)


def expected_calibration_error(confidence_n: np.ndarray, correct_n: np.ndarray, bins: int = 10) -> float:
    """ECE = sum_b (n_b / N) |accuracy_b - mean confidence_b| over equal-width confidence bins.

    Bin b holds confidences in (b/bins, (b+1)/bins] (the first bin also holds 0). 0 for a model
    whose stated confidence matches how often it is right; up to 1 for one that is always sure and
    always wrong.
    """
    confidence_n = np.asarray(confidence_n, np.float64)
    correct_n = np.asarray(correct_n, np.float64)
    if confidence_n.size == 0:
        return 0.0
    bin_n = np.clip(np.ceil(confidence_n * bins).astype(int) - 1, 0, bins - 1)
    ece = 0.0
    for b in range(bins):
        in_bin = bin_n == b
        if in_bin.any():
            ece += in_bin.mean() * abs(correct_n[in_bin].mean() - confidence_n[in_bin].mean())
    return float(ece)
