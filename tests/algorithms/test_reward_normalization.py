"""GDPO's multi-reward scores (``algorithm.reward_normalization=gdpo``) against the paper's two stages written here.

GDPO (arXiv:2601.05242): each reward normalised within its group, z_k = (r_k − group mean)/group std; the
normalised rewards combined; the combination normalised over the batch, (s − batch mean)/(batch std + ε).
"""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest
import torch

from verl_omni.algorithms import get_algorithm
from verl_omni.algorithms.base import AlgorithmConfig
from verl_omni.algorithms.flow_grpo_math import compute_flow_grpo_advantage
from verl_omni.algorithms.reward_normalization import gdpo_scores, per_scorer_advantage_metrics

UIDS = np.array(["a", "b", "a", "b", "a", "b"])


def _paper_advantage(rewards: dict[str, list[float]], weights: dict[str, float], uids, eps: float) -> list[float]:
    """The two stages with the statistics module, one sample at a time."""
    combined = []
    for i, uid in enumerate(uids):
        members = [j for j, u in enumerate(uids) if u == uid]
        total = 0.0
        for name, values in rewards.items():
            group = [values[j] for j in members]
            std = statistics.pstdev(group)
            total += weights[name] * ((values[i] - statistics.fmean(group)) / std if std > 0 else 0.0)
        combined.append(total / sum(weights.values()))
    mean, std = statistics.fmean(combined), statistics.pstdev(combined)
    return [(c - mean) / (std + eps) for c in combined]


def test_gdpo_then_the_group_advantage_is_the_papers_two_stages():
    rewards = {"bright": [0.9, 0.1, 0.5, 0.2, 0.4, 0.3], "ocr": [10.0, 3.0, 30.0, 1.0, 20.0, 2.0]}
    weights = {"bright": 2.0, "ocr": 0.5}
    scores, _ = gdpo_scores({k: np.array(v) for k, v in rewards.items()}, weights, UIDS)
    adv = compute_flow_grpo_advantage(scores, UIDS, global_std=True, epsilon=1e-4, adv_clip_max=5.0)
    torch.testing.assert_close(adv, torch.tensor(_paper_advantage(rewards, weights, UIDS, 1e-4)), rtol=1e-5, atol=1e-6)


def test_gdpo_tells_apart_reward_combinations_that_the_sum_collapses():
    """The paper's example: group x's best sample wins one of two binary rewards, group y's wins both. Summed and
    normalised per group, both get the same advantages; normalised per reward first, y's winner gets more."""
    uids = np.array(["x", "x", "y", "y"])
    first, second = np.array([0.0, 1.0, 0.0, 1.0]), np.array([0.0, 0.0, 0.0, 1.0])
    summed = torch.tensor(first + second, dtype=torch.float32)
    sum_adv = compute_flow_grpo_advantage(summed, uids, global_std=False)
    torch.testing.assert_close(sum_adv[:2], sum_adv[2:], rtol=0, atol=1e-3)  # equal but for ε in the std
    scores, _ = gdpo_scores({"first": first, "second": second}, {"first": 1.0, "second": 1.0}, uids)
    gdpo_adv = compute_flow_grpo_advantage(scores, uids, global_std=True)
    assert gdpo_adv[3] > gdpo_adv[1] > 0


def test_a_scorer_left_out_of_a_sample_is_left_out_of_its_group_and_its_mean():
    uids = np.array(["a", "a", "a"])
    kept = np.array([1.0, 2.0, 3.0])
    optional = np.array([5.0, math.nan, 1.0])
    scores, normalized = gdpo_scores({"kept": kept, "opt": optional}, {"kept": 1.0, "opt": 3.0}, uids)
    z_kept = (kept - kept.mean()) / kept.std()
    z_opt = np.array([1.0, math.nan, -1.0])
    np.testing.assert_allclose(normalized["opt"], z_opt)
    expected = [(z_kept[0] + 3 * z_opt[0]) / 4, z_kept[1], (z_kept[2] + 3 * z_opt[2]) / 4]
    torch.testing.assert_close(scores, torch.tensor(expected, dtype=torch.float32))
    metrics = per_scorer_advantage_metrics(normalized, uids)
    assert metrics["critic/advantages/opt/abs_mean"] == pytest.approx(1.0)
    assert metrics["critic/advantages/kept/zero_std_group_frac"] == 0.0


def test_a_flat_scorer_gives_its_groups_zero():
    uids = np.array(["a", "a", "b", "b"])
    scores, normalized = gdpo_scores(
        {"flat": np.array([1.0, 1.0, 2.0, 2.0]), "ranks": np.array([0.0, 1.0, 0.0, 1.0])},
        {"flat": 1.0, "ranks": 1.0},
        uids,
    )
    np.testing.assert_array_equal(normalized["flat"], np.zeros(4))
    torch.testing.assert_close(scores, torch.tensor([-0.5, 0.5, -0.5, 0.5]))
    assert per_scorer_advantage_metrics(normalized, uids)["critic/advantages/flat/zero_std_group_frac"] == 1.0


def test_reward_normalization_is_validated_and_every_algorithm_has_it():
    with pytest.raises(ValueError, match="algorithm.reward_normalization must be one of"):
        AlgorithmConfig(reward_normalization="mean")
    with pytest.raises(ValueError, match="name other scorers"):
        gdpo_scores({"a": np.zeros(2)}, {"b": 1.0}, ["u", "u"])
    for name in ("flow_grpo", "grpo_guard", "dance_grpo", "mix_grpo"):
        assert get_algorithm(name).config_cls().reward_normalization == "sum"
