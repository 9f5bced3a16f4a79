"""Replay input checks fail before any model work, naming the missing field or setting."""

import pytest
import torch

from verl_omni.pipelines.qwen_image.training_adapter import QwenImageTrainingAdapter
from verl_omni.pipelines.sampling import SamplingSpec
from verl_omni.workers.utils.replay import check_replay_batch


def _batch(w=2, with_negative=False):
    batch = {
        "all_latents": torch.zeros(3, w + 1, 16, 4),
        "all_timesteps": torch.zeros(3, w),
        "prompt_embeds": torch.zeros(3, 5, 8),
        "prompt_embeds_mask": torch.ones(3, 5),
    }
    if with_negative:
        batch |= {"negative_prompt_embeds": torch.zeros(3, 5, 8), "negative_prompt_embeds_mask": torch.ones(3, 5)}
    return batch


def test_cfg_replay_without_negative_embeddings_names_them():
    with pytest.raises(KeyError, match="negative_prompt_embeds"):
        check_replay_batch(
            _batch(),
            SamplingSpec(num_inference_steps=4, height=32, width=32, true_cfg_scale=4.0),
            QwenImageTrainingAdapter,
        )
    check_replay_batch(
        _batch(with_negative=True),
        SamplingSpec(num_inference_steps=4, height=32, width=32, true_cfg_scale=4.0),
        QwenImageTrainingAdapter,
    )


def test_latents_must_hold_one_more_step_than_timesteps():
    batch = _batch()
    batch["all_timesteps"] = torch.zeros(3, 3)
    with pytest.raises(ValueError, match=r"must be \[B, W\+1\] \+ a 2-D latent per step"):
        check_replay_batch(batch, SamplingSpec(num_inference_steps=4, height=32, width=32), QwenImageTrainingAdapter)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"noise_level": -0.1}, "noise_level"), ({"sde_type": "ode"}, "sde_type"), ({"num_inference_steps": 0}, "steps")],
)
def test_replay_spec_rejects_bad_settings(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingSpec(**({"num_inference_steps": 4, "height": 32, "width": 32} | kwargs)).replay()


def test_sde_window_replay_refuses_an_ode_spec():
    # an ODE rollout (noise level 0, the ode_samples record) has no SDE transition to replay
    spec = SamplingSpec(num_inference_steps=4, height=32, width=32, noise_level=0.0).replay()
    with pytest.raises(ValueError, match="noise_level must be > 0"):
        check_replay_batch({}, spec, QwenImageTrainingAdapter)
