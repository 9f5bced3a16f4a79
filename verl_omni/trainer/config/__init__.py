"""Hydra YAML tree of ``main_flowgrpo`` and the dataclasses of its trainer-level nodes."""

from verl_omni.trainer.config.config import FlowGRPOAlgoConfig, FlowGRPOTrainerConfig

__all__ = ["FlowGRPOAlgoConfig", "FlowGRPOTrainerConfig"]
