"""A trained LoRA in the rollout's form: renamed by the model's adapter, fused layers fused exactly.

The engine tests load this form into the rollout (``tests/workers/rollout/vllm_omni/``); here the
arithmetic: each slice of a fused adapter's scaled ``B·A`` is its sub-layer adapter's, to the bit.
"""

import pytest
import torch

from verl_omni.pipelines.flux.training_adapter import FluxTrainingAdapter
from verl_omni.pipelines.qwen_image.training_adapter import QwenImageTrainingAdapter
from verl_omni.pipelines.rollout_lora import PEFT_PREFIX

SUBS = ("to_q", "to_k", "to_v")


def _lora(modules, rank=2, dim=6, seed=0):
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for module in modules:
        tensors[f"{module}.lora_A.weight"] = torch.randn(rank, dim, generator=gen)
        tensors[f"{module}.lora_B.weight"] = torch.randn(dim, rank, generator=gen)
    return tensors


def _scaling(config):
    return config["lora_alpha"] / (config["r"] ** 0.5 if config.get("use_rslora") else config["r"])


@pytest.mark.parametrize("use_rslora", [False, True])
def test_fused_adapter_applies_each_sub_layers_update_and_keeps_the_scaling(use_rslora):
    block = "transformer_blocks.0.attn"
    modules = [f"{block}.{s}" for s in SUBS] + [f"{block}.to_out.0"]
    tensors = _lora(modules)
    config = {"r": 2, "lora_alpha": 3, "use_rslora": use_rslora, "target_modules": {"to_q", "to_k", "to_v", "to_out.0"}}

    out_config, out = FluxTrainingAdapter.rollout_lora(tensors, config)

    assert out_config["target_modules"] == ["to_out.0", "to_qkv"]
    assert out_config["r"] == 6 and _scaling(out_config) == pytest.approx(_scaling(config), rel=1e-12)
    a, b = out[f"{PEFT_PREFIX}{block}.to_qkv.lora_A.weight"], out[f"{PEFT_PREFIX}{block}.to_qkv.lora_B.weight"]
    for i, sub in enumerate(SUBS):
        expected = tensors[f"{block}.{sub}.lora_B.weight"] @ tensors[f"{block}.{sub}.lora_A.weight"]
        assert torch.equal((b @ a)[6 * i : 6 * (i + 1)], expected)
    # an unfused module keeps its rank-r tensors under its own name
    assert torch.equal(out[f"{PEFT_PREFIX}{block}.to_out.0.lora_A.weight"], tensors[f"{block}.to_out.0.lora_A.weight"])
    assert len(out) == 4


def test_fusing_needs_every_sub_layer_of_the_fused_layer():
    tensors = _lora(["single_transformer_blocks.0.attn.to_q", "single_transformer_blocks.0.attn.to_v"])
    with pytest.raises(ValueError, match=r"single_transformer_blocks\.0\.attn.*'to_qkv'.*\['to_k'\]"):
        FluxTrainingAdapter.rollout_lora(tensors, {"r": 2, "lora_alpha": 2, "target_modules": ["to_q", "to_v"]})


def test_model_without_fused_layers_only_renames():
    tensors = _lora(["transformer_blocks.0.attn.to_q", "transformer_blocks.0.attn.to_out.0"])
    config, out = QwenImageTrainingAdapter.rollout_lora(
        tensors, {"r": 2, "lora_alpha": 2, "target_modules": {"to_q", "to_out.0"}}
    )
    assert config == {"r": 2, "lora_alpha": 2, "target_modules": ["to_out", "to_q"]}
    assert sorted(out) == sorted(
        f"{PEFT_PREFIX}transformer_blocks.0.attn.{m}.lora_{p}.weight" for m in ("to_q", "to_out") for p in "AB"
    )


def test_a_fused_layer_named_by_a_trailing_path_fuses_only_those_sub_layers():
    """LTX-2's rollout fuses the video self-attention's q/k/v (``attn1.to_qkv``) and keeps the audio self-attention's
    (``audio_attn1``, a name ending in ``attn1`` but not on a ``.`` boundary) and the cross-attentions' apart."""
    from verl_omni.pipelines.ltx2.training_adapter import LTX2TrainingAdapter

    block = "transformer_blocks.0"
    attentions = ("attn1", "audio_attn1", "attn2")
    tensors = _lora([f"{block}.{attention}.{s}" for attention in attentions for s in SUBS])
    config, out = LTX2TrainingAdapter.rollout_lora(tensors, {"r": 2, "lora_alpha": 2, "target_modules": list(SUBS)})

    assert config["target_modules"] == ["to_k", "to_q", "to_qkv", "to_v"] and config["r"] == 6
    fused = f"{PEFT_PREFIX}{block}.attn1.to_qkv"
    a, b = out[f"{fused}.lora_A.weight"], out[f"{fused}.lora_B.weight"]
    for i, sub in enumerate(SUBS):
        expected = tensors[f"{block}.attn1.{sub}.lora_B.weight"] @ tensors[f"{block}.attn1.{sub}.lora_A.weight"]
        assert torch.equal((b @ a)[6 * i : 6 * (i + 1)], expected)
    kept = sorted(k for k in out if not k.startswith(fused))
    assert kept == sorted(
        f"{PEFT_PREFIX}{block}.{attention}.{s}.lora_{p}.weight"
        for attention in attentions[1:]
        for s in SUBS
        for p in "AB"
    )
