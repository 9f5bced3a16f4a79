"""Qwen-Image-Edit's prompt ids and the multi-image "Plus" variant against diffusers (CPU, fp32).

The single-image model is covered with the other diffusers models (``test_diffusers_adapters.py``) and on
the engine (``test_diffusers_rollout_engine.py``, both variants). Here: the ids the rollout builds for K
source images are the tokenizer's ids of the Plus pipelines' text, and the tiny Plus checkpoint runs in
diffusers' own ``QwenImageEditPlusPipeline`` with two source images, where a LoRA saved as checkpoints save it
loads and changes the edit. diffusers' Plus pipeline reads each image at 1024² (VAE) and 384² (vision tower):
its module-level sizes are set to 32² for this CPU (the rollout's ``condition_area`` / ``vl_condition_area``).
"""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module")
def tokenizer():
    from verl_omni.utils.tiny_models.tokenizer import build_qwen2_tokenizer

    return build_qwen2_tokenizer()


@pytest.mark.parametrize("count", [1, 2, 4])
def test_ids_for_k_pictures_are_the_plus_texts_ids(tokenizer, count):
    from verl_omni.pipelines.qwen_image_edit.rollout_request import (
        PICTURE_BLOCK,
        QWEN_IMAGE_EDIT_PROMPT_TEMPLATE,
        picture_ids,
    )
    from verl_omni.pipelines.qwen_image_edit_plus.training_adapter import QwenImageEditPlusTrainingAdapter

    instruction = "put the cat on the boat"
    ids = picture_ids(tokenizer, QwenImageEditPlusTrainingAdapter.prompt_token_ids(tokenizer, instruction), count)
    blocks = "".join(PICTURE_BLOCK.format(i) for i in range(1, count + 1))
    assert ids == tokenizer(QWEN_IMAGE_EDIT_PROMPT_TEMPLATE.format(blocks + instruction)).input_ids


def test_image_pads_widen_in_order_and_a_count_mismatch_is_refused():
    from verl_omni.pipelines.qwen_image_edit.rollout_request import expand_image_pads

    assert expand_image_pads([1, 9, 2, 9, 3], 9, [2, 3]) == [1, 9, 9, 2, 9, 9, 9, 3]
    with pytest.raises(ValueError, match="2 image placeholder tokens .* for 1 source images"):
        expand_image_pads([1, 9, 2, 9], 9, [4])


def test_tiny_plus_runs_in_diffusers_with_two_images_and_a_saved_lora_changes_the_edit(tiny_model, tmp_path):
    import numpy as np
    from diffusers import QwenImageEditPlusPipeline
    from diffusers.pipelines.qwenimage import pipeline_qwenimage_edit_plus as plus
    from peft import LoraConfig
    from PIL import Image

    from verl_omni.pipelines.model_base import get_model_adapter
    from verl_omni.workers.engine.fsdp.checkpoint import ADAPTER_NAME, gather_lora_state_dict, save_lora_dir

    path = tiny_model("qwen_image_edit_plus")
    adapter = get_model_adapter(path)
    assert (
        adapter.__name__ == "QwenImageEditPlusTrainingAdapter"
        and adapter.lora_file_pipeline == "QwenImageEditPlusPipeline"
    )
    module = adapter.build_module(path)
    torch.manual_seed(0)
    module.add_adapter(
        LoraConfig(r=4, lora_alpha=4, target_modules=list(adapter.lora_target_modules), init_lora_weights=False)
    )
    save_lora_dir(
        adapter, tmp_path / "lora", gather_lora_state_dict(module), module.peft_config[ADAPTER_NAME].to_dict()
    )

    rng = np.random.RandomState(0)
    images = [Image.fromarray(rng.randint(0, 256, (h, w, 3), dtype=np.uint8)) for w, h in [(40, 24), (24, 24)]]
    pipe = QwenImageEditPlusPipeline.from_pretrained(path)
    pipe.set_progress_bar_config(disable=True)
    kwargs = dict(prompt="a red cat", negative_prompt=" ", true_cfg_scale=4.0, height=32, width=32)
    kwargs |= dict(num_inference_steps=2, output_type="pt")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(plus, "VAE_IMAGE_SIZE", 32 * 32)
        patch.setattr(plus, "CONDITION_IMAGE_SIZE", 32 * 32)
        base = pipe(image=images, generator=torch.Generator().manual_seed(0), **kwargs).images
        one_image = pipe(image=images[:1], generator=torch.Generator().manual_seed(0), **kwargs).images
        pipe.load_lora_weights(tmp_path / "lora")
        tuned = pipe(image=images, generator=torch.Generator().manual_seed(0), **kwargs).images
    assert base.shape == (1, 3, 32, 32) and bool(torch.isfinite(base).all())
    assert (one_image - base).abs().max() > 0, "the second source image must change the edit"
    assert (tuned - base).abs().max() > 1e-3
