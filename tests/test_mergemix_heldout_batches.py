"""The ranking-noise arithmetic of experiments/benchmarks/mergemix_heldout_batches.py on a hand-made
per-batch array with known answers."""

import itertools

import numpy as np
import pytest

from experiments.benchmarks import mergemix_heldout_batches as hb


def _sums():
    """3 merges (A, B, C) x 2 domains x 2 batches x (nats, tokens).

    Domain 0, 10 tokens a batch, losses per batch A 1, 4; B 2, 2.5; C 3, 3 (A best on batch 0 only).
    Domain 1, the same for every merge: 30 tokens at loss 1, then 10 tokens at loss 5 (its loss over
    both batches is 80 / 40 = 2, by tokens, not the batches' mean 3)."""
    loss0_mb = np.array([[1.0, 4.0], [2.0, 2.5], [3.0, 3.0]])
    sums = np.zeros((3, 2, 2, 2))
    sums[:, 0, :, 0], sums[:, 0, :, 1] = 10 * loss0_mb, 10
    sums[:, 1, 0], sums[:, 1, 1] = (30.0, 30.0), (50.0, 10.0)
    return sums


def test_losses_flips_and_regret_of_a_prefix_against_all_batches():
    sums = _sums()
    full_m = hb.subset_mean_loss(sums, np.array([[0, 1], [0, 1]]))
    prefix_m = hb.subset_mean_loss(sums, np.array([[0], [0]]))
    np.testing.assert_allclose(full_m, [2.25, 2.125, 2.5])
    np.testing.assert_allclose(prefix_m, [1.0, 1.5, 2.0])
    # repeats: domain 0's batch 1 twice, domain 1's batch 0 twice
    np.testing.assert_allclose(hb.subset_mean_loss(sums, np.array([[1, 1], [0, 0]])), [2.5, 1.75, 2.0])
    # the prefix orders A < B < C, all batches B < A < C: one pair of three flipped
    assert hb.flip_rate(prefix_m, full_m) == pytest.approx(1 / 3)
    assert hb.flipped_pairs(prefix_m, full_m).tolist() == [True, False, False]  # (A,B), (A,C), (B,C)
    assert hb.regret(prefix_m, full_m) == pytest.approx(0.125)  # picks A: 2.25 against B's 2.125
    assert hb.flip_rate(full_m, full_m) == 0.0 and hb.regret(full_m, full_m) == 0.0
    table = hb.ranking_table(sums, [1, 2], draws=50, seed=0)
    assert table[1]["spearman"] == pytest.approx(0.5)
    assert table[1]["flip_rate"] == pytest.approx(1 / 3)
    assert table[1]["max_flipped_gap"] == pytest.approx(0.125)
    assert table[1]["regret"] == pytest.approx(0.125)
    assert table[2]["spearman"] == pytest.approx(1.0) and table[2]["flip_rate"] == 0.0


def test_bootstrap_draws_batches_with_replacement_per_domain():
    sums = _sums()
    boot_rm = hb.bootstrap_losses(sums, 2, draws=300, rng=np.random.default_rng(0))
    # every draw is one of the 3 x 3 multisets of two batches per domain, and all of them occur
    combos = [hb.subset_mean_loss(sums, np.array([a, b]))
              for a, b in itertools.product([[0, 0], [0, 1], [1, 1]], repeat=2)]
    matches = [[int(np.allclose(row, c)) for c in combos] for row in boot_rm]
    assert all(sum(m) == 1 for m in matches)
    assert np.all(np.sum(matches, axis=0) > 0)
    # identical batches: every draw is the full loss, no flip, no regret
    same = np.repeat(sums[:, :, :1], 4, axis=2)
    table = hb.ranking_table(same, [1, 2], draws=20, seed=0)
    assert all(table[k]["boot_flip_mean"] == 0.0 and table[k]["boot_regret_mean"] == 0.0 for k in (1, 2))


def test_the_merges_are_the_vertices_the_uniform_merge_and_dirichlet_points():
    alphas, kinds = hb.merge_alphas(4, 3, seed=0)
    assert kinds == ["vertex"] * 4 + ["uniform"] + ["random"] * 3
    np.testing.assert_array_equal(alphas[:4], np.eye(4))
    np.testing.assert_allclose(alphas[4], 0.25)
    np.testing.assert_allclose(alphas.sum(axis=1), 1.0)
