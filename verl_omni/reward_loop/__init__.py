"""Reward loop for generated images: manager, Ray worker and the ``diffusion`` reward manager.

Importing it registers ``diffusion`` in verl's reward-manager registry (the driver and the reward workers import it;
the plugin does not, so the workers that never score skip its imports).
"""

from verl_omni.reward_loop.reward_loop import DiffusionRewardLoopManager, DiffusionRewardLoopWorker
from verl_omni.reward_loop.reward_manager import DiffusionRewardManager

__all__ = ["DiffusionRewardLoopManager", "DiffusionRewardLoopWorker", "DiffusionRewardManager"]
