"""The per-step loss the engine calls while replaying (cf. ``verl.workers.utils.losses.ppo_loss``).

The loss is the run's algorithm's (``algorithm=<name>``, :mod:`verl_omni.algorithms`): a class
that reads its declared batch keys from a replayed micro-batch and returns ``(loss, metrics)``. This
module is where the actor gets it; the loss math lives only in the algorithm's module.

A worker never picks an algorithm itself: the trainer passes the run's ``algorithm`` node, and a worker
built without one fails naming the key, so a run cannot train another algorithm than the one it asked for.
"""

from __future__ import annotations

import logging

from verl_omni.algorithms import Algorithm, AlgorithmConfig, AlgorithmLoss, get_algorithm
from verl_omni.workers.config.actor import DiffusionActorConfig

logger = logging.getLogger(__name__)


def run_algorithm(algorithm_config: AlgorithmConfig | None, who: str) -> type[Algorithm]:
    """The registered algorithm the run's ``algorithm`` node names; ``who`` (the component being built) is named
    when the node is missing or is not an algorithm's config."""
    if algorithm_config is None:
        raise ValueError(
            f"{who} needs the run's algorithm node (config key `algorithm`, chosen with algorithm=<name>, e.g. "
            "algorithm=flow_grpo); got None. Pass the trainer's `configs.algorithm`, or in code an algorithm's "
            "config such as `get_algorithm('flow_grpo').config_cls()` (verl_omni.algorithms)"
        )
    if not isinstance(algorithm_config, AlgorithmConfig):
        raise TypeError(
            f"{who}: the algorithm node must be an AlgorithmConfig (verl_omni.algorithms.algorithm_config_from "
            f"turns a mapping into one), got {type(algorithm_config).__name__}"
        )
    return get_algorithm(algorithm_config.name)


def make_policy_loss(config: DiffusionActorConfig, algorithm_config: AlgorithmConfig) -> AlgorithmLoss:
    """``loss(replayed, micro_batch, step) -> (loss, metrics)`` of the algorithm ``algorithm_config.name``,
    built from the actor's loss settings and the algorithm's node."""
    return run_algorithm(algorithm_config, "make_policy_loss").build_loss(config, algorithm_config)
