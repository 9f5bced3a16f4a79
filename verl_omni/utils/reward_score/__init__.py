"""Reward scorers for generated images, selected by name (see ``docs/reward.md``).

Importing this package registers every built-in scorer; heavy models load lazily on first use.
"""

from verl_omni.utils.reward_score.base import Scorer, ScoreBatch, ScorerError, build_params, check_scores  # noqa: I001
from verl_omni.utils.reward_score.registry import SCORERS, available_scorers, get_scorer_cls, register_scorer
from verl_omni.utils.reward_score import aesthetic, brightness, clip, http_scorer, jpeg, ocr  # noqa: F401  (registration)
from verl_omni.utils.reward_score.multi import MultiReward, MultiRewardResult, reward_metrics

__all__ = [
    "SCORERS",
    "MultiReward",
    "MultiRewardResult",
    "ScoreBatch",
    "Scorer",
    "ScorerError",
    "available_scorers",
    "build_params",
    "check_scores",
    "get_scorer_cls",
    "register_scorer",
    "reward_metrics",
]
