"""Multi-reward combiner: a per-sample weighted mean of named scorers with a failure policy.

reward_i = Σ_k w_k·s_ik / Σ_k w_k over the scorers k that scored sample i (with every scorer
present and weights summing to 1 this is the weighted sum). A required scorer that fails raises
:class:`ScorerError` naming it and its cause; an optional one is logged and left out of the mean
of the samples it failed on, never counted as 0. A sample that no scorer could score raises.
Video samples reach each scorer through :func:`~verl_omni.utils.reward_score.video.score_any`
(image scorers per frame, with the entry's ``frame_stride``).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

from verl_omni.utils.reward_score.base import ScoreBatch, Scorer, ScorerError, build_params, check_scores
from verl_omni.utils.reward_score.registry import get_scorer_cls
from verl_omni.utils.reward_score.video import score_any

logger = logging.getLogger(__name__)

EXTRA_INFO_PREFIX = "reward/"


@dataclass
class WeightedScorer:
    """One term: ``frame_stride`` keeps frames ``0, s, 2s, ...`` of video samples (``video.py``)."""

    name: str
    scorer: Scorer
    weight: float
    required: bool
    frame_stride: int = 1


@dataclass
class MultiRewardResult:
    """``rewards[i]``: combined reward of sample i; ``per_scorer[name][i]``: that scorer's value or None if excluded."""

    rewards: list[float]
    per_scorer: dict[str, list[float | None]]

    def extra_infos(self) -> list[dict[str, float]]:
        """Per-sample ``{"reward/<name>": value}``, NaN marking an excluded scorer."""
        return [
            {
                EXTRA_INFO_PREFIX + name: (math.nan if values[i] is None else values[i])
                for name, values in self.per_scorer.items()
            }
            for i in range(len(self.rewards))
        ]


class MultiReward:
    """Runs its scorers concurrently on a :class:`ScoreBatch` and combines them per sample."""

    def __init__(self, entries: Sequence[WeightedScorer]):
        if not entries:
            raise ValueError("MultiReward needs at least one scorer")
        self.entries = list(entries)

    @classmethod
    def from_configs(cls, configs, key: str) -> MultiReward:
        """Build from :class:`ScorerConfig` entries found at dotted config ``key``."""
        entries = []
        for i, cfg in enumerate(configs):
            scorer_cls = get_scorer_cls(cfg.type)
            params = build_params(scorer_cls.params_cls, cfg.params, f"{key}[{i}].params")
            scorer = scorer_cls(params)
            entries.append(WeightedScorer(cfg.label, scorer, float(cfg.weight), bool(cfg.required), cfg.frame_stride))
        return cls(entries)

    async def score(self, batch: ScoreBatch) -> MultiRewardResult:
        results = await asyncio.gather(*(self._run(entry, batch) for entry in self.entries))
        per_scorer = {entry.name: values for entry, values in zip(self.entries, results, strict=True)}
        return MultiRewardResult(self._combine(per_scorer, len(batch)), per_scorer)

    async def _run(self, entry: WeightedScorer, batch: ScoreBatch) -> list[float | None]:
        if not entry.scorer.per_sample:
            return await self._run_one(entry, batch)
        singles = await asyncio.gather(*(self._run_one(entry, batch.select(i)) for i in range(len(batch))))
        return [values[0] for values in singles]

    @staticmethod
    async def _run_one(entry: WeightedScorer, batch: ScoreBatch) -> list[float | None]:
        try:
            scores = await score_any(entry.scorer, batch, entry.name, entry.frame_stride)
        except ScorerError as e:
            if entry.required:
                raise ScorerError(f"required scorer {entry.name!r} failed: {e}") from e
            logger.warning(
                "optional scorer %r failed on %d sample(s), left out of their reward: %s", entry.name, len(batch), e
            )
            return [None] * len(batch)
        return check_scores(scores, len(batch), entry.name)

    def _combine(self, per_scorer: dict[str, list[float | None]], size: int) -> list[float]:
        rewards = []
        for i in range(size):
            terms = [(e.weight, per_scorer[e.name][i]) for e in self.entries if per_scorer[e.name][i] is not None]
            if not terms:
                raise ScorerError(f"sample {i}: every scorer failed ({', '.join(per_scorer)}), it has no reward")
            rewards.append(sum(w * s for w, s in terms) / sum(w for w, _ in terms))
        return rewards


def reward_metrics(rewards: Sequence[float], extra_infos: Sequence[dict[str, float]]) -> dict[str, float]:
    """Batch metrics: ``reward/mean`` and, per scorer, ``reward/<name>/mean`` (over the samples it
    scored; absent if none) and ``reward/<name>/excluded`` (samples it was left out of)."""
    metrics = {"reward/mean": float(sum(rewards) / len(rewards))} if rewards else {}
    keys = [k for k in (extra_infos[0] if extra_infos else {}) if k.startswith(EXTRA_INFO_PREFIX)]
    for key in keys:
        values = [float(info[key]) for info in extra_infos]
        scored = [v for v in values if not math.isnan(v)]
        if scored:
            metrics[f"{key}/mean"] = sum(scored) / len(scored)
        metrics[f"{key}/excluded"] = float(len(values) - len(scored))
    return metrics
