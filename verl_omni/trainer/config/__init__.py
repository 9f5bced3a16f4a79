"""Hydra YAML tree of ``main_flowgrpo`` and the dataclasses of its trainer-level nodes.

The dataclasses are exported lazily: they build on verl's ``BaseConfig``, and importing verl
imports torch and Ray, which the preflight (``preflight.py``, in this package) must not wait for.
``FlowGRPOAlgoConfig`` lives with its algorithm (:mod:`verl_omni.algorithms.flow_grpo`).
"""

__all__ = ["FlowGRPOAlgoConfig", "FlowGRPOTrainerConfig"]


def __getattr__(name: str):
    if name == "FlowGRPOAlgoConfig":
        from verl_omni.algorithms.flow_grpo import FlowGRPOAlgoConfig

        return FlowGRPOAlgoConfig
    if name in __all__:
        from verl_omni.trainer.config import config

        return getattr(config, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
