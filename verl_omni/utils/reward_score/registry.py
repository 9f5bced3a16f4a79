"""Registry of reward scorers, selected by name from ``reward.diffusion.scorers[*].type``.

Built on the project's :class:`~verl_omni.utils.registry.Registry` (verl ``register_trainer``
semantics): only :class:`Scorer` subclasses register, a name bound to another class is refused,
and a lookup miss lists the registered names.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from verl_omni.utils.registry import Registry
from verl_omni.utils.reward_score.base import Scorer

logger = logging.getLogger(__name__)

SCORERS: Registry[type[Scorer]] = Registry(
    "scorer", check=lambda obj: isinstance(obj, type) and issubclass(obj, Scorer)
)


def register_scorer(name: str) -> Callable[[type[Scorer]], type[Scorer]]:
    """Class decorator registering a :class:`Scorer` subclass under ``name``."""
    return SCORERS.register(name)


def available_scorers() -> list[str]:
    return SCORERS.names()


def get_scorer_cls(name: str) -> type[Scorer]:
    """Return the scorer class registered under ``name``; a miss lists the available names."""
    return SCORERS.get(name)
