"""Diffusion agent loops (see ``docs/guide/rollout.md``); importing the package registers ``diffusion_single_turn``."""

from verl_omni.agent_loop.agent_loop import (
    DiffusionAgentLoopBase,
    DiffusionAgentLoopManager,
    DiffusionAgentLoopOutput,
    DiffusionAgentLoopWorker,
)
from verl_omni.agent_loop.single_turn_agent_loop import DiffusionSingleTurnAgentLoop

__all__ = [
    "DiffusionAgentLoopBase",
    "DiffusionAgentLoopManager",
    "DiffusionAgentLoopOutput",
    "DiffusionAgentLoopWorker",
    "DiffusionSingleTurnAgentLoop",
]
