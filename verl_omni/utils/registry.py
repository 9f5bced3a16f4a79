"""A name → object registry, the one pattern behind every extension point of the project.

Modeled on verl's ``register_trainer``: registration type-checks, a name bound to a different
object is rejected (never silently overwritten), and a lookup miss lists what is registered.

A registry may also be open to other packages without a list kept anywhere:

* ``discover``: a callable run once, before the first lookup or listing, that imports the
  built-in modules (they register themselves with the decorator); see :func:`import_submodules`.
* ``entry_point_group``: an installed distribution adds an entry under a name by declaring an
  entry point ``<name> = "<module>:<object>"`` in that group (``[project.entry-points."<group>"]``
  in its ``pyproject.toml``). Its names are listed without importing anything; the object is
  loaded and registered under the entry point's name on its first lookup, so one broken or heavy
  out-of-tree package costs nothing until its name is asked for.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import pkgutil
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Registry of ``kind`` objects (e.g. "advantage estimator"), each checked by ``check`` on registration.

    Args:
        kind (`str`): what the registry holds, as error messages name it.
        check (`Callable[[object], bool]`): the type check every registered object must pass.
        discover (`Callable[[], None]`, optional): imports the built-in entries; run once, before the
            first :meth:`get`, :meth:`names` or ``in``.
        entry_point_group (`str`, optional): the ``importlib.metadata`` entry-point group whose entries
            (name = registry name, value = ``module:object``) extend this registry.
        how_to_add (`str`): the sentence a lookup miss ends with, saying how to add an entry.
    """

    def __init__(
        self,
        kind: str,
        check: Callable[[object], bool] = callable,
        *,
        discover: Callable[[], None] | None = None,
        entry_point_group: str | None = None,
        how_to_add: str = "",
    ):
        self.kind = kind
        self._check = check
        self._entries: dict[str, T] = {}
        self._discover = discover
        self._discovered = discover is None
        self.entry_point_group = entry_point_group
        self._entry_points: dict[str, importlib.metadata.EntryPoint] | None = None
        self._loaded_entry_points: set[str] = set()
        self.how_to_add = how_to_add

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
        self._ensure_discovered()
        self._load_entry_point(name)
        try:
            return self._entries[name]
        except KeyError:
            hint = f" {self.how_to_add}" if self.how_to_add else ""
            raise ValueError(
                f"Unknown {self.kind} {name!r}. Available: {', '.join(self.names()) or '<none>'}.{hint}"
            ) from None

    def names(self) -> list[str]:
        """Every name a lookup resolves: registered ones and those of installed entry points (not loaded)."""
        self._ensure_discovered()
        return sorted(set(self._entries) | set(self._installed_entry_points()))

    def __contains__(self, name: object) -> bool:
        return name in self.names()

    # ---- discovery -----------------------------------------------------------------------------

    def _ensure_discovered(self) -> None:
        if not self._discovered:
            self._discover()
            self._discovered = True

    def _installed_entry_points(self) -> dict[str, importlib.metadata.EntryPoint]:
        """This registry's entry points by name, read once per process (a scan of every installed distribution)."""
        if self._entry_points is None:
            found: dict[str, importlib.metadata.EntryPoint] = {}
            if self.entry_point_group is not None:
                for ep in importlib.metadata.entry_points(group=self.entry_point_group):
                    other = found.get(ep.name)
                    if other is not None and other.value != ep.value:
                        raise ValueError(
                            f"two installed packages declare {self.kind} {ep.name!r} in entry-point group "
                            f"{self.entry_point_group!r} ({other.value} and {ep.value}): uninstall one"
                        )
                    found[ep.name] = ep
            self._entry_points = found
        return self._entry_points

    def _load_entry_point(self, name: str) -> None:
        """Load and register the entry point named ``name`` (once); a name bound to a built-in is rejected."""
        ep = self._installed_entry_points().get(name)
        if ep is None or name in self._loaded_entry_points:
            return
        try:
            obj = ep.load()
        except Exception as e:  # any import-time failure of a third-party package: re-raised with its origin
            raise ImportError(
                f"{self.kind} {name!r}: entry point {ep.value!r} (group {self.entry_point_group!r}) failed to load: {e}"
            ) from e
        self.register(name)(obj)
        self._loaded_entry_points.add(name)


def import_submodules(package: str, module: str | None = None, skip_private: bool = True) -> list[str]:
    """Import what a package's folder holds, without a list: the way built-ins register themselves.

    With ``module`` None: every module and subpackage directly in ``package``. Otherwise
    ``<package>.<sub>.<module>`` for every subpackage ``<sub>`` that has one (subpackages without it are
    shared code, skipped). Names starting with ``_`` are skipped when ``skip_private``. Returns the
    imported module names; an import error inside a found module propagates (it is a bug to fix, never
    a reason to drop the entry silently).
    """
    root = importlib.import_module(package)
    imported = []
    for info in sorted(pkgutil.iter_modules(root.__path__), key=lambda m: m.name):
        if skip_private and info.name.startswith("_"):
            continue
        if module is None:
            name = f"{package}.{info.name}"
        elif info.ispkg and _has_module(f"{package}.{info.name}", module):
            name = f"{package}.{info.name}.{module}"
        else:
            continue
        importlib.import_module(name)
        imported.append(name)
    return imported


def _has_module(package: str, module: str) -> bool:
    """Whether ``package``'s folder holds ``module`` (a ``.py`` file or a subpackage), found without importing it."""
    return any(info.name == module for info in pkgutil.iter_modules(importlib.import_module(package).__path__))
