"""vLLM-Omni's own Qwen-Image pipeline generates on CPU through our platform plugins (real engine)."""

import numpy as np
import pytest

pytestmark = pytest.mark.slow

START_TIMEOUT_S = 1200


def test_stock_pipeline_generates_three_images_from_one_request(tiny_qwen_image_path):
    from vllm_omni.entrypoints.omni import Omni
    from vllm_omni.inputs.data import OmniDiffusionSamplingParams

    from verl_omni.platforms.cpu_patches import engine_start_config

    # warm up at the size generated below and wait as long as a busy machine needs (as the rollout engine does)
    start = engine_start_config((32, 32), START_TIMEOUT_S, "START_TIMEOUT_S of this test")
    omni = Omni(
        model=str(tiny_qwen_image_path),
        dtype="float32",
        additional_config=start,
        init_timeout=START_TIMEOUT_S,
        stage_init_timeout=START_TIMEOUT_S,
    )
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
