"""Reward loop for generated images: manager, Ray worker and the ``diffusion`` reward manager.

Importing it registers ``diffusion`` in verl's reward-manager registry (done by ``verl_omni.plugin``).
"""

from verl_omni.reward_loop.reward_loop import DiffusionRewardLoopManager, DiffusionRewardLoopWorker
from verl_omni.reward_loop.reward_manager import DiffusionRewardManager

__all__ = ["DiffusionRewardLoopManager", "DiffusionRewardLoopWorker", "DiffusionRewardManager"]
