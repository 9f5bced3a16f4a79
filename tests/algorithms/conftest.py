"""Fixtures shared by the algorithm tests."""

import pytest


@pytest.fixture
def compose(tiny_qwen_image_path, tmp_path):
    """The trainer config from Hydra, as ``main_flowgrpo <overrides>`` builds it, on the tiny model (or ``model``)."""
    from verl_omni.utils.config import compose_config
    from verl_omni.utils.dataset.t2i_prompts import ensure_tiny_prompts

    train, val = ensure_tiny_prompts(tmp_path / "prompts")

    def build(*overrides: str, model=tiny_qwen_image_path):
        base = [f"actor_rollout_ref.model.path={model}", f"data.train_files={train}", f"data.val_files={val}"]
        return compose_config("flowgrpo_trainer", [*base, f"trainer.default_local_dir={tmp_path / 'run'}", *overrides])

    return build
