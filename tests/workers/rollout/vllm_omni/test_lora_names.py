"""The in-memory LoRA request: it pickles with its tensors and drops them for generation.

Name mapping is the model adapter's (``tests/pipelines/qwen_image/test_qwen_image_names.py``); the loader
takes rollout names as given (``tests/sanity/test_model_neutral.py``).
"""

import pickle

import torch

from verl_omni.workers.rollout.vllm_omni.lora import TensorLoRARequest, in_memory_lora_path


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
