"""Qwen-Image-2512 is a Qwen-Image checkpoint: its ``model_index.json`` names ``QwenImagePipeline`` (the class of
Qwen-Image's transformer, VAE and text encoder, loaded by the same diffusers and vLLM-Omni pipelines), so the Qwen-Image
adapter serves it unchanged. What its index holds besides (the diffusers version that saved it) must not change the
lookup."""

import json
import shutil

import torch

from verl_omni.pipelines.model_base import get_model_adapter
from verl_omni.pipelines.qwen_image.training_adapter import QwenImageTrainingAdapter

# the released Qwen-Image-2512 model_index.json's class and the diffusers version that saved it (the tiny builder's
# index has the installed version)
QWEN_IMAGE_2512_INDEX = {"_class_name": "QwenImagePipeline", "_diffusers_version": "0.36.0.dev0"}


def test_a_qwen_image_saved_as_2512_resolves_to_the_qwen_image_adapter_and_loads_the_same_transformer(
    tiny_qwen_image_path, tmp_path
):
    checkpoint = tmp_path / "qwen_image_2512"
    shutil.copytree(tiny_qwen_image_path, checkpoint)
    index = checkpoint / "model_index.json"
    index.write_text(json.dumps({**json.loads(index.read_text()), **QWEN_IMAGE_2512_INDEX}, indent=2))

    assert get_model_adapter(checkpoint) is QwenImageTrainingAdapter
    loaded = QwenImageTrainingAdapter.build_module(checkpoint).state_dict()
    original = QwenImageTrainingAdapter.build_module(tiny_qwen_image_path).state_dict()
    assert loaded.keys() == original.keys()
    assert all(torch.equal(loaded[k], original[k]) for k in original)
