"""Every registered model composes with the default trainer config: only ``actor_rollout_ref.model.path`` changed,
the config validates exactly as the entry point does before Ray (``validate_config``), the model's own defaults
filling the keys the default leaves null (``sde_window_size``: the model's window range; guidance)."""

from __future__ import annotations

import pytest

from verl_omni.utils.tiny_models import available_builders

# the tiny builders of reward models (scorers), not of a generator the trainer runs
SCORER_BUILDERS = {"clip", "detr", "hps", "hpsv3", "image_reward", "paddle_ocr", "videoalign"}
MODEL_BUILDERS = [name for name in available_builders() if name not in SCORER_BUILDERS]


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    from verl_omni.utils.dataset.t2i_prompts import ensure_tiny_prompts

    return ensure_tiny_prompts(tmp_path_factory.mktemp("prompts"))


@pytest.fixture(scope="module")
def edit_prompts(tmp_path_factory):
    """A set with a source image per row: what a model that takes source images reads."""
    from trainer_helpers import write_edit_prompt_files

    return write_edit_prompt_files(tmp_path_factory.mktemp("edit_prompts"))


@pytest.mark.parametrize("builder", MODEL_BUILDERS)
def test_default_config_validates_with_only_the_model_path_changed(
    builder, tiny_model, prompts, edit_prompts, tmp_path
):
    """The defaults serve every model; an editor or the image-to-video model reads a set with source images."""
    from verl_omni.pipelines.model_base import get_model_adapter
    from verl_omni.trainer.config.validation import validate_config
    from verl_omni.utils.config import compose_config

    train, val = edit_prompts if get_model_adapter(tiny_model(builder)).max_source_images else prompts
    config = compose_config(
        "flowgrpo_trainer",
        [
            f"actor_rollout_ref.model.path={tiny_model(builder)}",
            f"data.train_files={train}",
            f"data.val_files={val}",
            f"trainer.default_local_dir={tmp_path / 'run'}",
        ],
    )
    configs = validate_config(config)
    adapter = configs.model.adapter
    rollout = configs.rollout
    end = adapter.max_sde_window_end(rollout.num_inference_steps)
    # the window is every step the model can take an SDE step at, in the dataclass and in what Ray's workers read
    assert rollout.sde_window_size == end
    assert config.actor_rollout_ref.rollout.sde_window_size == end
    spec = rollout.sampling_spec(adapter=adapter, model=configs.model.path)
    assert spec.window_range[1] - spec.window_range[0] >= spec.sde_window_size == end
    assert spec.guidance_scale == adapter.default_guidance_scale


def test_a_window_size_the_user_sets_is_kept_and_checked_against_the_models_range(tiny_model, prompts, tmp_path):
    from verl_omni.trainer.config.validation import validate_config
    from verl_omni.utils.config import compose_config

    train, val = prompts
    base = [
        f"actor_rollout_ref.model.path={tiny_model('z_image')}",
        f"data.train_files={train}",
        f"data.val_files={val}",
        f"trainer.default_local_dir={tmp_path / 'run'}",
    ]
    assert validate_config(compose_config("flowgrpo_trainer", [*base, "actor_rollout_ref.rollout.sde_window_size=3"]))
    # Z-Image's last step is sigma 0 -> 0: a window of all 6 steps is refused, naming the key
    with pytest.raises(ValueError, match=r"actor_rollout_ref.rollout.sde_window_range=\[0, 5\] is shorter"):
        validate_config(compose_config("flowgrpo_trainer", [*base, "actor_rollout_ref.rollout.sde_window_size=6"]))
