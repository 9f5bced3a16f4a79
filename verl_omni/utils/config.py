"""Composing the project's Hydra configs outside ``@hydra.main`` (tests, benchmarks, notebooks)."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

CONFIG_DIR = Path(__file__).resolve().parents[1] / "trainer" / "config"


def compose_config(config_name: str, overrides: list[str] | None = None) -> DictConfig:
    """``config_name`` from ``verl_omni/trainer/config`` (verl's config tree on the search path), with ``overrides``."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return compose(config_name=config_name, overrides=list(overrides or []))
