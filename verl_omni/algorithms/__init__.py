"""RL algorithms as plug-ins: one module each, chosen with the Hydra group ``algorithm=<name>``.

The contract is :mod:`verl_omni.algorithms.base`; ``docs/extending/algorithm.md`` says how to add one.
"""

from verl_omni.algorithms.base import (
    ALGORITHM_ENTRY_POINT_GROUP,
    ALGORITHMS,
    DEFAULT_ALGORITHM,
    NOISE_GROUP_KEY,
    REDUCTIONS,
    Algorithm,
    AlgorithmConfig,
    AlgorithmLoss,
    Phases,
    UpdateRows,
    algorithm_config_from,
    check_model_supports,
    get_algorithm,
    register_algorithm,
    supported_algorithms,
)
from verl_omni.pipelines.model_base import ODE_SAMPLES, ROLLOUT_RECORDS, SDE_WINDOW

__all__ = [
    "ALGORITHMS",
    "ALGORITHM_ENTRY_POINT_GROUP",
    "DEFAULT_ALGORITHM",
    "NOISE_GROUP_KEY",
    "ODE_SAMPLES",
    "REDUCTIONS",
    "ROLLOUT_RECORDS",
    "SDE_WINDOW",
    "Algorithm",
    "AlgorithmConfig",
    "AlgorithmLoss",
    "Phases",
    "UpdateRows",
    "algorithm_config_from",
    "check_model_supports",
    "supported_algorithms",
    "get_algorithm",
    "register_algorithm",
]
