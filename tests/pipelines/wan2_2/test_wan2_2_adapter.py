"""The Wan2.2 training adapter's facts against the tiny checkpoint, diffusers' transformer and vLLM-Omni's schedule.

The rollout ↔ replay check on the real engine is ``test_diffusers_rollout_engine.py`` (parametrized over wan2_2);
here are the facts that check reads: registration, the size and frame multiples the VAE and patch size imply, the
schedule the rollout samples with, FSDP blocks and LoRA targets, prompt ids, and the recorded latent layout.
"""

from __future__ import annotations

import json

import pytest
import torch

from verl_omni.pipelines.wan2_2.training_adapter import TEXT_LENGTH, Wan22TrainingAdapter, padded_text


@pytest.fixture(scope="module")
def tiny_wan(tiny_model):
    return tiny_model("wan2_2")


@pytest.fixture(scope="module")
def transformer(tiny_wan):
    return Wan22TrainingAdapter.build_module(tiny_wan).eval()


def test_registered_under_the_pipeline_class_with_the_vaes_multiples(tiny_wan):
    from verl_omni.pipelines.model_base import get_model_adapter

    assert get_model_adapter(tiny_wan) is Wan22TrainingAdapter
    vae = json.loads((tiny_wan / "vae" / "config.json").read_text())
    patch = json.loads((tiny_wan / "transformer" / "config.json").read_text())["patch_size"]
    assert Wan22TrainingAdapter.vae_scale_factor(tiny_wan) == vae["scale_factor_spatial"] == 16
    assert Wan22TrainingAdapter.latent_multiple == vae["scale_factor_spatial"] * patch[1]
    assert Wan22TrainingAdapter.frame_multiple == vae["scale_factor_temporal"]


@pytest.mark.parametrize("steps", [4, 10])
def test_the_replays_schedule_is_vllm_omnis_euler_schedule_with_the_checkpoints_shift(tiny_wan, steps):
    from vllm_omni.diffusion.models.wan2_2.scheduling_wan_euler import WanEulerScheduler

    from verl_omni.pipelines.sampling import SamplingSpec

    scheduler = Wan22TrainingAdapter.build_scheduler(tiny_wan)
    Wan22TrainingAdapter.set_schedule(scheduler, SamplingSpec(num_inference_steps=steps, sde_window_size=1), 0)
    rollout = WanEulerScheduler(shift=5.0)
    rollout.set_timesteps(steps)
    torch.testing.assert_close(scheduler.sigmas, rollout.sigmas, rtol=0, atol=1e-7)
    torch.testing.assert_close(scheduler.timesteps, rollout.timesteps, rtol=0, atol=1e-4)


def test_fsdp_blocks_and_lora_targets_name_modules_of_the_transformer(transformer):
    classes = {type(m).__name__ for m in transformer.modules()}
    assert set(Wan22TrainingAdapter.fsdp_wrap_blocks) <= classes
    names = [n for n, _ in transformer.named_modules()]
    for target in Wan22TrainingAdapter.lora_target_modules:
        assert any(n.endswith(f".attn1.{target}") for n in names) and any(n.endswith(f".attn2.{target}") for n in names)
    assert Wan22TrainingAdapter.rollout_name("blocks.0.attn1.to_out.0") == "blocks.0.attn1.to_out"


def test_prompt_ids_are_the_pipelines_unpadded_umt5_ids(tiny_wan):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_wan, subfolder="tokenizer")
    ids = Wan22TrainingAdapter.prompt_token_ids(tokenizer, "  a red   apple on a table ")
    assert ids == tokenizer("a red apple on a table").input_ids
    assert ids[-1] == tokenizer.eos_token_id and tokenizer.pad_token_id not in ids
    assert Wan22TrainingAdapter.prompt_token_ids(tokenizer, "") == [tokenizer.eos_token_id]


def test_step_velocity_is_the_transformers_classic_cfg_on_5d_latents(transformer):
    """``[B, W+1, C, F', h, w]`` latents pass the shape check; the velocity is v_neg + w (v_pos - v_neg) with the
    embeddings zero-padded to 512 tokens (what vLLM-Omni's encode_prompt hands the transformer)."""
    from verl_omni.pipelines.sampling import SamplingSpec

    torch.manual_seed(0)
    batch = {
        "all_latents": torch.randn(2, 3, 4, 2, 2, 4),
        "all_timesteps": torch.tensor([[900.0, 800.0], [700.0, 600.0]]),
        "prompt_embeds": torch.randn(2, 6, 32),
        "prompt_embeds_mask": torch.tensor([[1] * 6, [1] * 4 + [0] * 2]),
        "negative_prompt_embeds": torch.randn(2, 1, 32),
        "negative_prompt_embeds_mask": torch.ones(2, 1, dtype=torch.long),
    }
    Wan22TrainingAdapter.check_latents(batch["all_latents"], batch["all_timesteps"])
    with pytest.raises(ValueError, match=r"4-D latent per step \(Wan22TrainingAdapter.latent_ndim\)"):
        Wan22TrainingAdapter.check_latents(batch["all_latents"].flatten(3), batch["all_timesteps"])
    spec = SamplingSpec(num_inference_steps=4, height=32, width=64, num_frames=5, true_cfg_scale=3.0)
    with torch.no_grad():
        velocity = Wan22TrainingAdapter.step_velocity(transformer, batch, 1, spec, 16)

        def plain(prefix):
            text = padded_text(batch[f"{prefix}prompt_embeds"], batch[f"{prefix}prompt_embeds_mask"], torch.float32)
            assert text.shape == (2, TEXT_LENGTH, 32) and not text[1, 4:].any()
            latents, t = batch["all_latents"][:, 1], batch["all_timesteps"][:, 1]
            return transformer(hidden_states=latents, timestep=t, encoder_hidden_states=text, return_dict=False)[0]

        expected = plain("negative_") + 3.0 * (plain("") - plain("negative_"))
    assert velocity.shape == (2, 4, 2, 2, 4)
    torch.testing.assert_close(velocity, expected, rtol=0, atol=1e-6)
