"""``DiffusionRewardManager``: scores generated images of a DataProto with the configured scorers.

Registered in verl's reward-manager registry as ``diffusion`` (``reward.reward_manager.name``).
Inputs per sample: ``batch[image_key]`` uint8 ``[3, H, W]`` (or a video ``[F, 3, H, W]``),
``non_tensor_batch[prompt_key]`` (text, or chat messages whose last user turn is the prompt and
holds the source images of an edit) and, optionally, ``non_tensor_batch[ground_truth_key]`` (text,
or a dict with ``ground_truth``), ``non_tensor_batch[source_images_key]`` (``source_images.py``) and,
when the rollout output has sound, ``batch[audio_key]`` (float32 waveforms ``[samples]``, or ``[channels,
samples]``, averaged to the mono waveform the scorers read) with
``non_tensor_batch["<audio_key>_sample_rate"]`` (Hz).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch
from verl import DataProto
from verl.experimental.reward_loop.reward_manager import register
from verl.experimental.reward_loop.reward_manager.base import RewardManagerBase

from verl_omni.reward_loop.source_images import listed_images, prompt_images
from verl_omni.utils.dataset.prompt_dataset import prompt_text
from verl_omni.utils.reward_score import MultiReward, ScoreBatch
from verl_omni.workers.config.reward import CONFIG_KEY, DiffusionRewardConfig

logger = logging.getLogger(__name__)


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
        """Pull images, prompts, targets and source images out of ``data`` (keys from the config)."""
        cfg = self.reward_config
        if data.batch is None or cfg.image_key not in data.batch.keys():
            raise KeyError(f"DataProto.batch has no images under {cfg.image_key!r} ({CONFIG_KEY}.image_key)")
        if cfg.prompt_key not in data.non_tensor_batch:
            raise KeyError(
                f"DataProto.non_tensor_batch has no prompts under {cfg.prompt_key!r} ({CONFIG_KEY}.prompt_key)"
            )
        raw_prompts = data.non_tensor_batch[cfg.prompt_key]
        prompts = [prompt_text(v, cfg.prompt_key) for v in raw_prompts]
        truths = data.non_tensor_batch.get(cfg.ground_truth_key)
        targets = None if truths is None else [ground_truth_text(v, cfg.ground_truth_key) for v in truths]
        audio, sample_rate = self.audio(data)
        sources = self.source_images(data, raw_prompts)
        return ScoreBatch(data.batch[cfg.image_key], prompts, targets, sources, audio, sample_rate)

    def audio(self, data: DataProto) -> tuple[list[torch.Tensor] | None, int | None]:
        """Each sample's float32 mono waveform and their one sample rate; ``(None, None)`` when ``data`` has no audio."""
        key = self.reward_config.audio_key
        if key not in data.batch.keys():
            return None, None
        rate_key = f"{key}_sample_rate"
        if rate_key not in data.non_tensor_batch:
            raise KeyError(
                f"DataProto.batch has audio under {key!r} ({CONFIG_KEY}.audio_key) but non_tensor_batch has no "
                f"sample rates under {rate_key!r}: the rollout must record each waveform's rate (Hz) there"
            )
        rates = {int(r) for r in data.non_tensor_batch[rate_key]}
        if len(rates) != 1:
            raise ValueError(f"non_tensor_batch[{rate_key!r}] must hold one sample rate for the batch, got {rates}")
        # a stereo track (LTX-2's vocoder) reaches the scorers as its mono mix
        return [(wave.mean(dim=0) if wave.ndim == 2 else wave).float().cpu() for wave in data.batch[key]], rates.pop()

    def source_images(self, data: DataProto, raw_prompts) -> list[list[torch.Tensor]] | None:
        """Each sample's source images (``source_images.py``); None when no sample has any (text-to-image)."""
        key = self.reward_config.source_images_key
        if key is None:
            sources = [
                prompt_images(v, f"non_tensor_batch[{self.reward_config.prompt_key!r}][{i}]")
                for i, v in enumerate(raw_prompts)
            ]
        elif key not in data.non_tensor_batch:
            raise KeyError(
                f"DataProto.non_tensor_batch has no source images under {key!r} ({CONFIG_KEY}.source_images_key); "
                "set it to null to read them from the prompt's chat messages"
            )
        else:
            sources = [
                listed_images(v, f"non_tensor_batch[{key!r}][{i}]") for i, v in enumerate(data.non_tensor_batch[key])
            ]
        return sources if any(sources) else None

    async def run_batch(self, data: DataProto) -> list[dict]:
        """Score every sample of ``data``; batched scorers see the whole batch at once (a video's image scorers
        score its frames, ``reward_score/video.py``)."""
        result = await self.reward.score(self.to_score_batch(data))
        return [
            {"reward_score": reward, "reward_extra_info": info}
            for reward, info in zip(result.rewards, result.extra_infos(), strict=True)
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
