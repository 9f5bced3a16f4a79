"""Multi-reward combiner: weights, failure policy and metric names.

The stand-in scorers below are real Scorer subclasses returning fixed values, so the arithmetic
of the combiner can be checked exactly.
"""

import asyncio
import math

import pytest
import torch

from verl_omni.utils.reward_score import MultiReward, ScoreBatch, Scorer, ScorerError, reward_metrics
from verl_omni.utils.reward_score.multi import WeightedScorer


class Fixed(Scorer):
    def __init__(self, values=None, error=None):
        super().__init__()
        self.values, self.error = values, error

    async def score(self, batch):
        if self.error is not None:
            raise self.error
        return self.values[: len(batch)]


BATCH = ScoreBatch(torch.zeros(3, 3, 4, 4, dtype=torch.uint8), ["a", "b", "c"])


def run(entries):
    return asyncio.run(MultiReward(entries).score(BATCH))


def test_reward_is_the_weighted_mean_of_the_scorers():
    result = run(
        [WeightedScorer("a", Fixed([1.0, 0.0, 0.5]), 3.0, True), WeightedScorer("b", Fixed([0.0, 1.0, 0.5]), 1.0, True)]
    )
    assert result.rewards == pytest.approx([0.75, 0.25, 0.5])
    assert result.per_scorer == {"a": [1.0, 0.0, 0.5], "b": [0.0, 1.0, 0.5]}


def test_optional_failure_renormalizes_over_the_remaining_weights():
    result = run(
        [
            WeightedScorer("a", Fixed([0.2, 0.4, 0.6]), 1.0, True),
            WeightedScorer("b", Fixed(error=ScorerError("down")), 9.0, False),
        ]
    )
    assert result.rewards == pytest.approx([0.2, 0.4, 0.6])
    assert result.per_scorer["b"] == [None, None, None]


def test_required_failure_raises_with_name_and_cause():
    cause = ScorerError("backend unreachable")
    with pytest.raises(ScorerError, match="required scorer 'b' failed: backend unreachable") as info:
        run([WeightedScorer("a", Fixed([0.0] * 3), 1.0, True), WeightedScorer("b", Fixed(error=cause), 1.0, True)])
    assert info.value.__cause__ is cause


def test_a_sample_no_scorer_could_score_raises():
    with pytest.raises(ScorerError, match="sample 0: every scorer failed"):
        run([WeightedScorer("b", Fixed(error=ScorerError("down")), 1.0, False)])


def test_nan_score_raises_naming_scorer_and_sample_even_when_optional():
    with pytest.raises(ValueError, match="scorer 'b' returned a non-finite score nan for sample 2"):
        run([WeightedScorer("b", Fixed([0.0, 0.0, math.nan]), 1.0, False)])


def test_bugs_in_a_scorer_are_not_swallowed_by_the_optional_policy():
    with pytest.raises(ZeroDivisionError):
        run(
            [
                WeightedScorer("a", Fixed([1.0] * 3), 1.0, True),
                WeightedScorer("b", Fixed(error=ZeroDivisionError()), 1.0, False),
            ]
        )


def test_metric_names_and_values():
    result = run(
        [
            WeightedScorer("ocr", Fixed([1.0, 0.5, 0.0]), 1.0, True),
            WeightedScorer("pick", Fixed(error=ScorerError("x")), 1.0, False),
        ]
    )
    metrics = reward_metrics(result.rewards, result.extra_infos())
    assert metrics == {
        "reward/mean": pytest.approx(0.5),
        "reward/ocr/mean": pytest.approx(0.5),
        "reward/ocr/excluded": 0.0,
        "reward/pick/excluded": 3.0,
    }
