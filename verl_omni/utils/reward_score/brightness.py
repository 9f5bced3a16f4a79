"""Mean brightness: a toy, model-free reward for smoke tests and the built-in CPU run.

It says nothing about image quality. It exists because a tiny random model can visibly learn it
in minutes on a CPU, which makes it a cheap end-to-end check that rewards flow into updates.
"""

from __future__ import annotations

import logging

from verl_omni.utils.reward_score.base import ScoreBatch, ThreadedScorer
from verl_omni.utils.reward_score.registry import register_scorer

logger = logging.getLogger(__name__)


@register_scorer("brightness")
class BrightnessScorer(ThreadedScorer):
    """Mean pixel value / 255 over all channels. Range [0, 1]: 0 black, 1 white. Toy reward."""

    def score_sync(self, batch: ScoreBatch) -> list[float]:
        return (batch.images.float().mean(dim=(1, 2, 3)) / 255.0).tolist()
