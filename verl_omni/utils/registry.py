"""A name → object registry, the one pattern behind every extension point of the project.

Modeled on verl's ``register_trainer``: registration type-checks, a name bound to a different
object is rejected (never silently overwritten), and a lookup miss lists what is registered.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Registry of ``kind`` objects (e.g. "advantage estimator"), each checked by ``check`` on registration."""

    def __init__(self, kind: str, check: Callable[[object], bool] = callable):
        self.kind = kind
        self._check = check
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator registering the decorated object under ``name``."""
        if not isinstance(name, str) or not name:
            raise TypeError(f"{self.kind} name must be a non-empty string, got {name!r}")

        def decorator(obj: T) -> T:
            if not self._check(obj):
                raise TypeError(f"cannot register {obj!r} as {self.kind} {name!r}: wrong type")
            existing = self._entries.get(name)
            if existing is not None and existing is not obj:
                raise ValueError(f"{self.kind} {name!r} is already registered to {existing!r}; cannot re-register it")
            self._entries[name] = obj
            return obj

        return decorator

    def get(self, name: str) -> T:
        try:
            return self._entries[name]
        except KeyError:
            raise ValueError(
                f"Unknown {self.kind} {name!r}. Available: {', '.join(self.names()) or '<none>'}."
            ) from None

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries
