"""Config of the reward-hacking guard: the YAML node ``reward.guard``.

A policy can learn to please its reward without getting better (brighter images for a brightness
reward, text pasted anywhere for an OCR reward). The guard scores the validation samples with
held-out scorers the run never trains on: when the trained reward has risen while a held-out
scorer fell by more than ``max_drop`` from its best, the run is probably fooling its reward
(docs/guide/rewards.md, "Reward-hacking guard").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any

from verl.base_config import BaseConfig

from verl_omni.workers.config.reward import scorer_config_from

GUARD_KEY = "reward.guard"
GUARD_ACTIONS = ("stop", "warn")


@dataclass
class RewardGuardConfig(BaseConfig):
    """The reward-hacking guard (``reward.guard``); off while ``scorers`` is empty.

    Args:
        scorers (list[ScorerConfig]): held-out scorers, the same form as ``reward.diffusion.scorers``,
            computed on the validation samples only (in the driver) and never part of the trained reward.
        max_drop (float): the guard fires when the trained validation score is above its first value and a
            held-out scorer's validation mean is more than this below its best so far (in the scorer's units).
        action (str): ``stop`` (save a checkpoint, write the reason to the summary, exit with status 3) or
            ``warn`` (log the reason and go on).
    """

    scorers: list = field(default_factory=list)
    max_drop: float = 0.05
    action: str = "stop"

    def __post_init__(self):
        scorers = [scorer_config_from(s, f"{GUARD_KEY}.scorers[{i}]") for i, s in enumerate(self.scorers)]
        object.__setattr__(self, "scorers", scorers)
        seen: set[str] = set()
        for i, scorer in enumerate(scorers):
            device = scorer.validate(f"{GUARD_KEY}.scorers[{i}]")
            if not device.startswith("cpu"):
                raise ValueError(
                    f"{GUARD_KEY}.scorers[{i}].params.device={device!r}: held-out scorers run in the driver, "
                    "on the CPU; serve a GPU model behind an http scorer instead"
                )
            if scorer.label in seen:
                raise ValueError(f"{GUARD_KEY}.scorers[{i}].name {scorer.label!r} is used twice; names must be unique")
            seen.add(scorer.label)
        if not isinstance(self.max_drop, int | float) or not math.isfinite(self.max_drop) or self.max_drop <= 0:
            raise ValueError(f"{GUARD_KEY}.max_drop must be a number > 0, got {self.max_drop!r}")
        if self.action not in GUARD_ACTIONS:
            raise ValueError(f"{GUARD_KEY}.action must be one of {GUARD_ACTIONS}, got {self.action!r}")

    @property
    def enabled(self) -> bool:
        return bool(self.scorers)

    @classmethod
    def from_config(cls, node: Any) -> RewardGuardConfig:
        """Build from the ``reward.guard`` node (DictConfig, dict, an instance, or None: the guard off)."""
        if isinstance(node, cls):
            return node
        if node is None:
            return cls()
        from omegaconf import DictConfig, OmegaConf

        data = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node)
        data.pop("_target_", None)
        allowed = {f.name for f in fields(cls)} - {"_target_"}
        unknown = sorted(set(data) - allowed)
        if unknown:
            raise ValueError(f"{GUARD_KEY}: unknown key(s) {unknown}; allowed: {sorted(allowed)}")
        return cls(**data)
