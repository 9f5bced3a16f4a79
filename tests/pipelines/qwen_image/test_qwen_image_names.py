"""Qwen-Image's LoRA names: the adapter (not the rollout's LoRA loader) maps diffusers names onto vLLM-Omni's."""

import pytest

from verl_omni.pipelines.qwen_image.training_adapter import QwenImageTrainingAdapter


@pytest.mark.parametrize(
    ("trained", "rollout"),
    [
        # diffusers wraps the attention output as ``to_out = [Linear, Dropout]``; vLLM-Omni has one layer
        (
            "base_model.model.transformer_blocks.0.attn.to_out.0.lora_A.weight",
            "base_model.model.transformer_blocks.0.attn.to_out.lora_A.weight",
        ),
        ("to_out.0", "to_out"),
        ("to_add_out", "to_add_out"),
        ("to_q", "to_q"),
        # already a rollout name: renaming again changes nothing
        ("transformer_blocks.0.attn.to_out", "transformer_blocks.0.attn.to_out"),
    ],
)
def test_diffusers_attention_output_name_maps_to_the_single_omni_layer(trained, rollout):
    assert QwenImageTrainingAdapter.rollout_name(trained) == rollout


def test_peft_config_targets_are_renamed_and_the_rest_kept():
    config = {"r": 4, "lora_alpha": 8, "target_modules": set(QwenImageTrainingAdapter.lora_target_modules)}
    out = QwenImageTrainingAdapter.rollout_peft_config(config)
    assert "to_out" in out["target_modules"] and "to_out.0" not in out["target_modules"]
    assert out["target_modules"] == sorted(out["target_modules"]) and (out["r"], out["lora_alpha"]) == (4, 8)
    assert config["target_modules"] == set(QwenImageTrainingAdapter.lora_target_modules)  # input untouched
