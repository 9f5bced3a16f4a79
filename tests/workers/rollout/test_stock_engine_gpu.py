"""vLLM-Omni's stock Qwen-Image pipeline serves the tiny random model on CUDA (the carried stack works)."""

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


def test_stock_engine_generates_distinct_images_from_one_request(tiny_qwen_image_bf16_path):
    from vllm_omni.entrypoints.omni import Omni
    from vllm_omni.inputs.data import OmniDiffusionSamplingParams

    omni = Omni(model=str(tiny_qwen_image_bf16_path))
    try:
        params = OmniDiffusionSamplingParams(
            height=64, width=64, num_inference_steps=4, num_outputs_per_prompt=3, seed=0
        )
        outputs = omni.generate({"prompt": "a red cat"}, params)
    finally:
        omni.close()
    images = [img for out in outputs for img in out.images]
    print(f"stock engine: {len(outputs)} outputs, {len(images)} images, size {images[0].size if images else None}")
    assert len(images) == 3
    arrays = [np.asarray(img) for img in images]
    assert arrays[0].shape == (64, 64, 3)
    assert not np.array_equal(arrays[0], arrays[1])
