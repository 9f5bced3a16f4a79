"""Config dataclasses reject bad values with the dotted key in the message."""

import pytest

from verl_omni.workers.config.actor import DiffusionActorConfig
from verl_omni.workers.config.model import DiffusionLoraConfig, DiffusionModelConfig


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"rank": -1}, "model.lora.rank"),
        ({"alpha": 0}, "model.lora.alpha"),
        ({"init_lora_weights": "pissa"}, "model.lora.init_lora_weights"),
        ({"dropout": 1.0}, "model.lora.dropout"),
    ],
)
def test_lora_config_names_the_bad_key(kwargs, key):
    with pytest.raises(ValueError, match=key):
        DiffusionLoraConfig(**kwargs)


def test_model_config_requires_a_diffusers_directory(tmp_path):
    with pytest.raises(ValueError, match="model.path"):
        DiffusionModelConfig(path=str(tmp_path))
    with pytest.raises(ValueError, match="model.path"):
        DiffusionModelConfig()


def test_model_config_exposes_verl_lora_rank(tiny_qwen_image_path):
    config = DiffusionModelConfig(path=str(tiny_qwen_image_path), lora=DiffusionLoraConfig(rank=8))
    assert config.lora_rank == 8
    assert config.get("lora").get("merge") is False


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"ppo_epochs": 0}, "actor.ppo_epochs"),
        ({"ppo_mini_batch_size": 0}, "actor.ppo_mini_batch_size"),
        ({"rollout_n": 0}, "actor.rollout_n"),
        ({"ppo_micro_batch_size_per_gpu": 0}, "actor.ppo_micro_batch_size_per_gpu"),
        ({"clip_ratio": 0.0}, "actor.clip_ratio"),
        ({"kl_beta": -0.1}, "actor.kl_beta"),
    ],
)
def test_actor_config_names_the_bad_key(kwargs, key):
    with pytest.raises(ValueError, match=key):
        DiffusionActorConfig(**kwargs)


def test_actor_config_validates_batch_sizes_against_data_parallel_size():
    DiffusionActorConfig(ppo_mini_batch_size=8, ppo_micro_batch_size_per_gpu=2).validate(dp_size=2)
    with pytest.raises(ValueError, match="data-parallel size 3"):
        DiffusionActorConfig(ppo_mini_batch_size=8).validate(dp_size=3)
    with pytest.raises(ValueError, match="ppo_micro_batch_size_per_gpu=3"):
        DiffusionActorConfig(ppo_mini_batch_size=8, ppo_micro_batch_size_per_gpu=3).validate(dp_size=2)


def test_actor_mini_batch_counts_prompts_as_verl_does():
    """``ppo_mini_batch_size`` is prompts; the update and the per-rank checks work on its samples (x ``rollout_n``)."""
    config = DiffusionActorConfig(ppo_mini_batch_size=2, rollout_n=4, ppo_micro_batch_size_per_gpu=4)
    assert config.mini_batch_samples == 8
    config.validate(dp_size=2)
    with pytest.raises(ValueError, match=r"ppo_mini_batch_size \* rollout.n = 2 \* 4 = 8 samples .* size 3"):
        config.validate(dp_size=3)
