"""Every YAML default equals its dataclass default, so a Python user and a YAML user get the same run.

The node -> dataclass map comes from the YAML itself: every node with a ``_target_`` is checked against
that class's field defaults, and its sub-nodes against the defaults those fields hold. Only the keys a
file writes are compared (a node's keys from verl's own YAML are verl's business); interpolations and
required (``???``) values are skipped. The composed and experiment files are left out: they override on purpose.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from hydra.utils import get_class
from omegaconf import DictConfig, ListConfig, OmegaConf

CONFIG_DIR = Path(__file__).resolve().parents[2] / "verl_omni" / "trainer" / "config"
# composed or preset files: their values override the nodes' defaults on purpose
SKIPPED = ("_generated_", "experiment")
# a file's own keys, not settings
META_KEYS = ("_target_", "defaults", "hydra")


def config_files() -> list[Path]:
    return sorted(
        path
        for path in CONFIG_DIR.rglob("*.yaml")
        if not any(part.startswith(SKIPPED) for part in path.relative_to(CONFIG_DIR).parts)
    )


def _field_default(cls: type, name: str) -> Any:
    """The default of field ``name`` of ``cls``, or MISSING (a required field, or not a field at all)."""
    for f in dataclasses.fields(cls):
        if f.name == name:
            if f.default_factory is not dataclasses.MISSING:
                return f.default_factory()
            return f.default
    return dataclasses.MISSING


def _plain(value: Any) -> Any:
    """Tuples as lists: YAML has only lists."""
    return list(value) if isinstance(value, tuple) else value


def _node_drifts(node: DictConfig, default: Any, key: str) -> list[str]:
    """Where ``node`` differs from ``default``: a dataclass (its field defaults) or an instance (its values)."""
    drifts = []
    for name in node:
        if name in META_KEYS:
            continue
        if isinstance(default, type):
            value = _field_default(default, name)
        else:
            value = getattr(default, name, dataclasses.MISSING)
        if value is not dataclasses.MISSING:
            drifts += _drifts(node, name, value, f"{key}.{name}")
    return drifts


def _drifts(parent: DictConfig | ListConfig, name: str | int, default: Any, key: str) -> list[str]:
    """Where ``parent[name]`` (raw YAML) differs from ``default``; interpolations and ``???`` are not defaults."""
    if OmegaConf.is_missing(parent, name) or OmegaConf.is_interpolation(parent, name):
        return []
    child = parent._get_node(name)
    if isinstance(child, DictConfig) and dataclasses.is_dataclass(default):
        return _node_drifts(child, default, key)
    if isinstance(child, ListConfig) and isinstance(default, list | tuple) and len(child) == len(default):
        return [d for i, value in enumerate(default) for d in _drifts(child, i, value, f"{key}[{i}]")]
    value = OmegaConf.to_container(child, resolve=False) if OmegaConf.is_config(child) else parent[name]
    return [] if value == _plain(default) else [f"{key}: YAML {value!r}, dataclass {default!r}"]


def _targeted_nodes(node: DictConfig, key: str):
    """``(dotted key, node, class)`` of every outermost node with a ``_target_`` at or below ``node``."""
    if "_target_" in node:
        yield key, node, get_class(node._target_)
        return
    for name in node:
        child = node._get_node(name)
        if isinstance(child, DictConfig):
            yield from _targeted_nodes(child, f"{key}.{name}" if key else str(name))


def targeted_nodes() -> list[tuple[str, DictConfig, type]]:
    found = []
    for path in config_files():
        for key, node, cls in _targeted_nodes(OmegaConf.load(path), ""):
            found.append((f"{path.relative_to(CONFIG_DIR)}:{key or '<root>'}", node, cls))
    return found


def test_every_dataclass_node_of_the_config_tree_is_found():
    """The map is derived, so it must not be empty or lose a node: the nodes each have a dataclass."""
    classes = {cls.__name__ for _, _, cls in targeted_nodes()}
    nodes = {"DiffusionRolloutConfig", "DiffusionActorConfig", "DiffusionModelConfig", "DiffusionRewardConfig"}
    assert nodes | {"FlowGRPOTrainerConfig"} <= classes
    assert all(dataclasses.is_dataclass(cls) for _, _, cls in targeted_nodes())


@pytest.mark.parametrize(("where", "node", "cls"), targeted_nodes(), ids=lambda v: v if isinstance(v, str) else "")
def test_yaml_defaults_equal_dataclass_defaults(where, node, cls):
    drifts = _node_drifts(node, cls, where)
    assert not drifts, "YAML and dataclass defaults differ (make them agree):\n" + "\n".join(drifts)
