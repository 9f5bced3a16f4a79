"""Composing the project's Hydra configs outside ``@hydra.main`` (tests, benchmarks, notebooks)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

CONFIG_DIR = Path(__file__).resolve().parents[1] / "trainer" / "config"
# resolver naming verl's config directory, for the YAML trees' hydra.searchpath (file://${...:})
VERL_CONFIG_DIR_RESOLVER = "verl_omni.verl_config_dir"


def verl_config_dir() -> str:
    """verl's ``trainer/config`` directory, found without importing verl.

    ``pkg://verl.trainer.config`` in ``hydra.searchpath`` imports the ``verl`` package, which imports
    torch, tensordict and Ray (15-20 s): composing a config, and failing on a bad value, would wait for it.
    """
    spec = importlib.util.find_spec("verl")
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError("verl is not installed: the config tree composes verl's config nodes")
    return str(Path(spec.origin).parent / "trainer" / "config")


def register_resolvers() -> None:
    """Register the resolvers the YAML trees use (idempotent); before Hydra composes them."""
    if not OmegaConf.has_resolver(VERL_CONFIG_DIR_RESOLVER):
        OmegaConf.register_new_resolver(VERL_CONFIG_DIR_RESOLVER, verl_config_dir)


def compose_config(config_name: str, overrides: list[str] | None = None) -> DictConfig:
    """``config_name`` from ``verl_omni/trainer/config`` (verl's config tree on the search path), with ``overrides``."""
    from hydra import compose, initialize_config_dir

    register_resolvers()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return compose(config_name=config_name, overrides=list(overrides or []))
