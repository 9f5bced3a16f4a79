"""Registry of reward scorers, selected by name from ``reward.diffusion.scorers[*].type``.

Built on the project's :class:`~verl_omni.utils.registry.Registry` (verl ``register_trainer``
semantics): only :class:`Scorer` subclasses register, a name bound to another class is refused,
and a lookup miss lists the registered names. Built-in scorers are the modules of this package
(imported by its ``__init__``); an installed distribution adds one with an entry point in the group
:data:`SCORER_ENTRY_POINT_GROUP`, ``<name> = "<module>:<ScorerClass>"``, loaded on its first lookup.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from verl_omni.utils.registry import Registry
from verl_omni.utils.reward_score.base import Scorer

logger = logging.getLogger(__name__)

SCORER_ENTRY_POINT_GROUP = "verl_omni.reward_scorers"

SCORERS: Registry[type[Scorer]] = Registry(
    "scorer",
    check=lambda obj: isinstance(obj, type) and issubclass(obj, Scorer),
    entry_point_group=SCORER_ENTRY_POINT_GROUP,
    how_to_add=(
        "Add a scorer as a module in verl_omni/utils/reward_score/ decorating a Scorer subclass with "
        "@register_scorer('<name>'), or install a package declaring an entry point in group "
        f"{SCORER_ENTRY_POINT_GROUP!r}: '<name> = \"<module>:<ScorerClass>\"' (docs/extending/scorer.md)."
    ),
)


def register_scorer(name: str) -> Callable[[type[Scorer]], type[Scorer]]:
    """Class decorator registering a :class:`Scorer` subclass under ``name``."""
    return SCORERS.register(name)


def available_scorers() -> list[str]:
    return SCORERS.names()


def get_scorer_cls(name: str) -> type[Scorer]:
    """Return the scorer class registered under ``name``; a miss lists the available names."""
    return SCORERS.get(name)
