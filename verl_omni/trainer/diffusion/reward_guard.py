"""The reward-hacking guard (``reward.guard``): held-out scorers and image statistics of each validation.

At every validation the driver scores the validation samples with the held-out scorers (never part of the
trained reward) and logs ``guard/<scorer>/mean``, and logs the samples' image statistics and their change
since the first validation (``guard/stats/*``). A policy that fools its reward shows it there first: the
trained score climbs while a scorer that measures something else falls, or the images drift to one extreme
(all bright, all saturated, low entropy). The guard fires when the trained validation score is above its
first value and a held-out scorer is more than ``max_drop`` below its best; the trainer then stops the run
(``action=stop``) or logs the reason (``warn``).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import torch

from verl_omni.utils.reward_score.base import ScoreBatch
from verl_omni.utils.reward_score.multi import MultiReward
from verl_omni.workers.config.reward_guard import GUARD_KEY, RewardGuardConfig

logger = logging.getLogger(__name__)

IMAGE_STATS = ("brightness", "saturation", "contrast", "entropy")


def image_stats(images: torch.Tensor) -> dict[str, float]:
    """Mean over the images (a video's frames count as images) of: brightness (mean luma, 0..1), saturation
    (HSV's (max − min)/max), contrast (std of luma over the pixels) and entropy (bits of the 256-bin luma
    histogram, 0..8). ``images``: uint8 ``[N, 3, H, W]`` or ``[N, F, 3, H, W]``."""
    x = images.reshape(-1, *images.shape[-3:]).to(torch.float64) / 255
    luma = (0.299 * x[:, 0] + 0.587 * x[:, 1] + 0.114 * x[:, 2]).flatten(1)
    high, low = x.amax(dim=1), x.amin(dim=1)
    saturation = torch.where(high > 0, (high - low) / high.clamp_min(1e-12), torch.zeros_like(high))
    levels = (luma * 255).round().long().clamp(0, 255)
    counts = torch.zeros(len(levels), 256, dtype=torch.float64).scatter_add_(1, levels, torch.ones_like(luma))
    p = counts / counts.sum(dim=1, keepdim=True)
    entropy = -(p * torch.log2(torch.where(p > 0, p, torch.ones_like(p)))).sum(dim=1)
    return {
        "brightness": luma.mean().item(),
        "saturation": saturation.mean().item(),
        "contrast": luma.std(dim=1, unbiased=False).mean().item(),
        "entropy": entropy.mean().item(),
    }


@dataclass(frozen=True)
class GuardAlarm:
    """Why the guard fired: the held-out ``scorer`` fell from ``best`` to ``now`` at ``step`` while the trained
    validation score rose from ``trained_first`` to ``trained_now``."""

    scorer: str
    best: float
    now: float
    step: int
    trained_first: float
    trained_now: float

    def reason(self) -> str:
        return (
            f"reward guard: held-out scorer {self.scorer!r} fell from its best {self.best:.6g} to {self.now:.6g} "
            f"at step {self.step} while the trained validation score rose from {self.trained_first:.6g} to "
            f"{self.trained_now:.6g}: the policy may be fooling its reward"
        )


class RewardGuard:
    """One run's guard: the held-out scorers, the first validation's statistics and each scorer's best."""

    def __init__(self, config: RewardGuardConfig):
        self.config = config
        self.reward = MultiReward.from_configs(config.scorers, f"{GUARD_KEY}.scorers")
        self.first_stats: dict[str, float] | None = None
        self.trained_first: float | None = None
        self.best: dict[str, float] = {}

    def observe(
        self, step: int, images: torch.Tensor, prompts: list[str], trained_score: float
    ) -> tuple[dict[str, float], GuardAlarm | None]:
        """Score one validation's samples; returns the ``guard/*`` metrics and the alarm, if the guard fired."""
        result = asyncio.run(self.reward.score(ScoreBatch(images.cpu(), prompts)))
        means = {}
        for name, values in result.per_scorer.items():
            scored = [v for v in values if v is not None]
            if scored:
                means[name] = sum(scored) / len(scored)
        metrics = {f"guard/{name}/mean": value for name, value in means.items()}
        stats = image_stats(images)
        self.first_stats = self.first_stats or stats
        for name, value in stats.items():
            metrics[f"guard/stats/{name}"] = value
            metrics[f"guard/stats/{name}_change"] = value - self.first_stats[name]
        alarm = self._check(step, trained_score, means)
        metrics["guard/fired"] = float(alarm is not None)
        return metrics, alarm

    def _check(self, step: int, trained_score: float, means: dict[str, float]) -> GuardAlarm | None:
        if self.trained_first is None:
            self.trained_first = trained_score
        alarm = None
        for name, now in means.items():
            best = max(self.best.get(name, now), now)
            self.best[name] = best
            if alarm is None and trained_score > self.trained_first and best - now > self.config.max_drop:
                alarm = GuardAlarm(name, best, now, step, self.trained_first, trained_score)
        return alarm


class GuardStop(Exception):
    """The guard stopped the run (``reward.guard.action=stop``); ``main_flowgrpo`` exits with ``EXIT_GUARD_STOP`` (``utils/exit_codes.py``)."""

    def __init__(self, alarm: GuardAlarm):
        super().__init__(alarm.reason())
        self.alarm = alarm
