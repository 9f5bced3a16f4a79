"""The per-step loss the engine calls while replaying (cf. ``verl.workers.utils.losses.ppo_loss``).

The loss is the run's algorithm's (``algorithm=<name>``, :mod:`verl_omni.trainer.algorithms`): a class
that reads its declared batch keys from a replayed micro-batch and returns ``(loss, metrics)``. This
module is where the actor gets it; the loss math lives only in the algorithm's module.
"""

from __future__ import annotations

import logging

from verl_omni.trainer.algorithms import DEFAULT_ALGORITHM, AlgorithmConfig, AlgorithmLoss, get_algorithm
from verl_omni.workers.config.actor import DiffusionActorConfig

logger = logging.getLogger(__name__)


def default_algorithm_config() -> AlgorithmConfig:
    """The default algorithm's config with its defaults (what a run without ``algorithm=`` uses)."""
    return get_algorithm(DEFAULT_ALGORITHM).config_cls()


def make_policy_loss(config: DiffusionActorConfig, algorithm_config: AlgorithmConfig | None = None) -> AlgorithmLoss:
    """``loss(replayed, micro_batch, step) -> (loss, metrics)`` of the algorithm ``algorithm_config.name``
    (the default algorithm when None), built from the actor's loss settings and the algorithm's node."""
    algorithm_config = algorithm_config or default_algorithm_config()
    return get_algorithm(algorithm_config.name).build_loss(config, algorithm_config)
