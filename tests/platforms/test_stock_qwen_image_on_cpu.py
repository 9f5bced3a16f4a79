"""vLLM-Omni's own Qwen-Image pipeline generates on CPU through our platform plugins (real engine)."""

import numpy as np
import pytest

pytestmark = pytest.mark.slow


def test_stock_pipeline_generates_three_images_from_one_request(tiny_qwen_image_path):
    from vllm_omni.entrypoints.omni import Omni
    from vllm_omni.inputs.data import OmniDiffusionSamplingParams

    omni = Omni(model=str(tiny_qwen_image_path), dtype="float32")
    try:
        params = OmniDiffusionSamplingParams(
            height=32, width=32, num_inference_steps=3, num_outputs_per_prompt=3, seed=1
        )
        (output,) = omni.generate(["a red cat on a chair"], sampling_params_list=[params])
    finally:
        omni.close()
    assert len(output.images) == 3
    arrays = [np.asarray(image) for image in output.images]
    assert all(a.shape == (32, 32, 3) and a.dtype == np.uint8 for a in arrays)
    assert not np.array_equal(arrays[0], arrays[1])
