"""``DiffusionRewardManager``: scores generated images of a DataProto with the configured scorers.

Registered in verl's reward-manager registry as ``diffusion`` (``reward.reward_manager.name``).
Inputs per sample: ``batch[image_key]`` uint8 ``[3, H, W]``, ``non_tensor_batch[prompt_key]``
(text, or chat messages whose last user turn is the prompt) and, optionally,
``non_tensor_batch[ground_truth_key]`` (text, or a dict with ``ground_truth``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from verl import DataProto
from verl.experimental.reward_loop.reward_manager import register
from verl.experimental.reward_loop.reward_manager.base import RewardManagerBase

from verl_omni.utils.reward_score import MultiReward, ScoreBatch
from verl_omni.workers.config.reward import CONFIG_KEY, DiffusionRewardConfig

logger = logging.getLogger(__name__)


def prompt_text(value: Any, key: str) -> str:
    """The prompt string from a ``non_tensor_batch`` entry: a string or chat messages (last user turn)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list | tuple | np.ndarray):
        for message in reversed(list(value)):
            if isinstance(message, Mapping) and message.get("role") == "user":
                content = message.get("content")
                if isinstance(content, str):
                    return content
                if isinstance(content, list | tuple | np.ndarray):
                    return " ".join(p["text"] for p in content if isinstance(p, Mapping) and p.get("type") == "text")
    raise ValueError(f"non_tensor_batch[{key!r}] must hold a prompt string or chat messages, got {value!r:.200}")


def ground_truth_text(value: Any, key: str) -> str | None:
    """The target text from a ``non_tensor_batch`` entry: a string, a dict with ``ground_truth``, or None."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, Mapping):
        return ground_truth_text(value.get("ground_truth"), key)
    raise ValueError(f"non_tensor_batch[{key!r}] must be a string or a dict with 'ground_truth', got {value!r:.200}")


@register("diffusion")
class DiffusionRewardManager(RewardManagerBase):
    """Reward manager for images: a :class:`MultiReward` over ``reward.diffusion.scorers``."""

    def __init__(self, config, tokenizer=None, compute_score=None, reward_router_address=None, **kwargs):
        super().__init__(config, tokenizer, compute_score)
        if compute_score is not None:
            raise ValueError(
                "reward.custom_reward_function is not used by the diffusion reward manager; "
                f"register a scorer and list it in {CONFIG_KEY}.scorers instead"
            )
        self.reward_config = DiffusionRewardConfig.from_config(config.reward.get("diffusion"))
        self.reward = MultiReward.from_configs(self.reward_config.scorers, f"{CONFIG_KEY}.scorers")

    def to_score_batch(self, data: DataProto) -> ScoreBatch:
        """Pull images, prompts and targets out of ``data`` (keys from the config)."""
        cfg = self.reward_config
        if data.batch is None or cfg.image_key not in data.batch.keys():
            raise KeyError(f"DataProto.batch has no images under {cfg.image_key!r} ({CONFIG_KEY}.image_key)")
        if cfg.prompt_key not in data.non_tensor_batch:
            raise KeyError(
                f"DataProto.non_tensor_batch has no prompts under {cfg.prompt_key!r} ({CONFIG_KEY}.prompt_key)"
            )
        prompts = [prompt_text(v, cfg.prompt_key) for v in data.non_tensor_batch[cfg.prompt_key]]
        truths = data.non_tensor_batch.get(cfg.ground_truth_key)
        targets = None if truths is None else [ground_truth_text(v, cfg.ground_truth_key) for v in truths]
        images = data.batch[cfg.image_key]
        if images.ndim == 5:
            # videos [B, F, 3, H, W]: every frame is scored as an image with its video's prompt (run_batch averages)
            frames = images.shape[1]
            images = images.flatten(0, 1)
            prompts = [p for p in prompts for _ in range(frames)]
            targets = None if targets is None else [t for t in targets for _ in range(frames)]
        return ScoreBatch(images, prompts, targets)

    async def run_batch(self, data: DataProto) -> list[dict]:
        """Score every sample of ``data``; batched scorers see the whole batch at once. A video's reward and
        per-scorer values are the means over its frames (the image scorers applied per frame)."""
        result = await self.reward.score(self.to_score_batch(data))
        images = data.batch[self.reward_config.image_key]
        frames = images.shape[1] if images.ndim == 5 else 1
        rewards, infos = result.rewards, result.extra_infos()
        return [
            {
                "reward_score": sum(rewards[i : i + frames]) / frames,
                "reward_extra_info": {k: sum(info[k] for info in infos[i : i + frames]) / frames for k in infos[i]},
            }
            for i in range(0, len(rewards), frames)
        ]

    async def run_single(self, data: DataProto) -> dict:
        """Score a one-sample ``data`` (the per-sample path the agent loop calls)."""
        if len(data) != 1:
            raise ValueError(f"run_single scores one sample, got a DataProto of {len(data)}")
        return (await self.run_batch(data))[0]

    @classmethod
    def assemble_rm_scores(cls, data: DataProto, scores: list[float]) -> torch.Tensor:
        """One scalar reward per image: ``rm_scores`` is float32 ``[B]`` (there are no response tokens)."""
        return torch.tensor(scores, dtype=torch.float32)
