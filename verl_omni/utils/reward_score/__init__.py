"""Reward scorers for generated images and videos, selected by name (see ``docs/guide/rewards.md``).

Importing this package registers every built-in scorer: it imports every module in this folder,
so a new scorer is a new module here whose class is decorated with ``@register_scorer("<name>")``
(no list to edit). Scorers of other packages register through the ``verl_omni.reward_scorers``
entry-point group (``registry.py``). Heavy models load lazily on first use, not on import.
"""

from verl_omni.utils.registry import import_submodules  # noqa: I001
from verl_omni.utils.reward_score.base import (
    Scorer,
    ScoreBatch,
    ScorerError,
    ThreadedScorer,
    build_params,
    check_scores,
)
from verl_omni.utils.reward_score.registry import (
    SCORER_ENTRY_POINT_GROUP,
    SCORERS,
    available_scorers,
    get_scorer_cls,
    register_scorer,
)
from verl_omni.utils.reward_score.multi import MultiReward, MultiRewardResult, reward_metrics

# registration: every module of this package (each scorer module decorates its class)
import_submodules(__name__)

__all__ = [
    "SCORER_ENTRY_POINT_GROUP",
    "SCORERS",
    "MultiReward",
    "MultiRewardResult",
    "ScoreBatch",
    "Scorer",
    "ScorerError",
    "ThreadedScorer",
    "available_scorers",
    "build_params",
    "check_scores",
    "get_scorer_cls",
    "register_scorer",
    "reward_metrics",
]
