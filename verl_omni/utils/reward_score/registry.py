"""Registry of reward scorers, selected by name from ``reward.diffusion.scorers[*].type``.

Modeled on verl's ``register_trainer``: registration type-checks the class and refuses to rebind a
name to a different class; a lookup miss lists the registered names.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from verl_omni.utils.reward_score.base import Scorer

logger = logging.getLogger(__name__)

SCORER_REGISTRY: dict[str, type[Scorer]] = {}


def register_scorer(name: str) -> Callable[[type[Scorer]], type[Scorer]]:
    """Class decorator registering a :class:`Scorer` subclass under ``name``."""
    from verl_omni.utils.reward_score.base import Scorer

    def decorator(cls: type[Scorer]) -> type[Scorer]:
        if not (isinstance(cls, type) and issubclass(cls, Scorer)):
            raise TypeError(f"register_scorer({name!r}) expected a Scorer subclass, got {cls!r}")
        existing = SCORER_REGISTRY.get(name)
        if existing is not None and existing is not cls:
            raise ValueError(
                f"Scorer name {name!r} is already registered to {existing.__qualname__}; "
                f"cannot re-register it to {cls.__qualname__}."
            )
        SCORER_REGISTRY[name] = cls
        return cls

    return decorator


def available_scorers() -> list[str]:
    return sorted(SCORER_REGISTRY)


def get_scorer_cls(name: str) -> type[Scorer]:
    """Return the scorer class registered under ``name``; a miss lists the available names."""
    try:
        return SCORER_REGISTRY[name]
    except KeyError:
        available = ", ".join(available_scorers()) or "<none>"
        raise ValueError(f"Unknown scorer {name!r}. Available scorers: {available}.") from None
