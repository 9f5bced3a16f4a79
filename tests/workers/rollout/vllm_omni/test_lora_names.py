"""PEFT/diffusers LoRA names are mapped onto vLLM-Omni's Qwen-Image module names."""

import pickle

import torch

from verl_omni.workers.rollout.vllm_omni.lora import TensorLoRARequest, _omni_module_name, in_memory_lora_path


def test_diffusers_attention_output_name_maps_to_the_single_omni_layer():
    name = "base_model.model.transformer_blocks.0.attn.to_out.0.lora_A.weight"
    assert _omni_module_name(name) == "base_model.model.transformer_blocks.0.attn.to_out.lora_A.weight"
    assert _omni_module_name("to_out.0") == "to_out"
    assert _omni_module_name("to_add_out") == "to_add_out"
    assert _omni_module_name("to_q") == "to_q"


def test_tensor_request_survives_pickling_and_drops_tensors_for_generation():
    request = TensorLoRARequest(
        lora_name="a",
        lora_int_id=3,
        lora_path=in_memory_lora_path(3),
        peft_config={"r": 2},
        lora_tensors={"x.lora_A.weight": torch.ones(2, 4)},
    )
    copy = pickle.loads(pickle.dumps(request))
    assert torch.equal(copy.lora_tensors["x.lora_A.weight"], torch.ones(2, 4))
    light = copy.without_tensors()
    assert light.lora_int_id == 3 and not hasattr(light, "lora_tensors")
