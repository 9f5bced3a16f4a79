"""Builders shared by the reward loop tests (configs, image batches, DataProtos)."""

from __future__ import annotations

import numpy as np
import torch
from omegaconf import OmegaConf
from verl import DataProto


def make_config(**diffusion):
    """A trainer config with just what the reward loop reads: ``reward.reward_manager`` and ``reward.diffusion``."""
    return OmegaConf.create(
        {
            "reward": {
                "reward_manager": {"source": "register", "name": "diffusion", "module": {"path": None, "name": None}},
                "custom_reward_function": {"path": None, "name": "compute_score"},
                "diffusion": diffusion,
            }
        }
    )


def make_images(n: int, size: int = 32) -> torch.Tensor:
    """Alternating flat (even index) and noise (odd index) uint8 images ``[n, 3, size, size]``."""
    gen = torch.Generator().manual_seed(n)
    images = [
        torch.full((3, size, size), 40 * i % 256, dtype=torch.uint8)
        if i % 2 == 0
        else torch.randint(0, 256, (3, size, size), dtype=torch.uint8, generator=gen)
        for i in range(n)
    ]
    return torch.stack(images)


def make_data(images: torch.Tensor, prompts: list, truths: list | None = None) -> DataProto:
    non_tensors = {"raw_prompt": np.array(prompts + [None], dtype=object)[:-1]}
    if truths is not None:
        non_tensors["reward_model"] = np.array([{"ground_truth": t} for t in truths], dtype=object)
    return DataProto.from_dict(tensors={"responses": images}, non_tensors=non_tensors)
