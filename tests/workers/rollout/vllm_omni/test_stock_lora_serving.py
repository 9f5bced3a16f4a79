"""A checkpoint's LoRA directory served by stock vLLM-Omni, as a user would serve it (real engine, CPU, fp32).

Per model adapter, one engine of vLLM-Omni's own pipeline for the tiny model (no custom pipeline, no
worker extension of ours), module-scoped. The LoRA directory is what checkpoints write
(``checkpoint.save_lora_dir``: diffusers' file + the PEFT layout under the rollout's names); the
engine reads it from disk through a file ``LoRARequest``. The adapted image must differ from the
base one, and a request without LoRA after it must give the base image again, to the bit.

A video model's output is its frames; an image-to-video or editing model's request carries a source image.
Z-Image and FLUX.2-klein are not here: vLLM-Omni 0.26's own ``ZImagePipeline`` builds its transformer with
the released model's sizes whatever ``transformer/config.json`` says, so it cannot load the tiny checkpoint,
and its FLUX.2-klein engine fails its own warm-up (``docs/guide/models.md``). Z-Image's LoRA directory is
served from file by vLLM-Omni's LoRA manager in the rollout engine instead (``test_diffusers_rollout_engine.py``,
equal to the in-memory sync bit for bit).
"""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.slow

H = W = 32
STEPS = 2
PROMPT = "a red cat on a chair"
START_TIMEOUT_S = 1200
# per model: the stock pipeline's sampling arguments beyond the shared ones: its guidance (FLUX.1-dev and FLUX.2-dev:
# their embedded guidance), a video's frames (a few), a side other than H = W
MODELS = {
    "qwen_image": {"true_cfg_scale": 4.0},
    "sd3": {"guidance_scale": 4.5},
    "flux": {"guidance_scale": 2.5},
    # FLUX.2-dev declares image input, so the warm-up sends a blank source image, refused under 64 px
    "flux2": {"guidance_scale": 2.5, "height": 64, "width": 64},
    "wan2_2": {"guidance_scale": 4.0, "num_frames": 5},
    "wan2_2_i2v_a14b": {"guidance_scale": 3.5, "num_frames": 5},
    "ltx2": {"guidance_scale": 3.0, "num_frames": 9},
    "hunyuan_video_1_5": {"guidance_scale": 6.0, "num_frames": 5},
    "hunyuan_video_1_5_i2v": {"guidance_scale": 6.0, "num_frames": 5},
}


@pytest.fixture(scope="module", params=sorted(MODELS))
def model_name(request):
    return request.param


@pytest.fixture(scope="module")
def tiny_path(model_name, tiny_model):
    return tiny_model(model_name)


@pytest.fixture(scope="module")
def lora_dir(tiny_path, tmp_path_factory):
    """A checkpoint's ``lora/`` directory of a random LoRA on the adapter's default targets."""
    from diffusers_helpers import random_lora_module

    from verl_omni.pipelines.model_base import get_model_adapter
    from verl_omni.workers.engine.fsdp.checkpoint import ADAPTER_NAME, gather_lora_state_dict, save_lora_dir

    adapter = get_model_adapter(tiny_path)
    module = random_lora_module(adapter, tiny_path)
    directory = tmp_path_factory.mktemp("ckpt") / "lora"
    save_lora_dir(adapter, directory, gather_lora_state_dict(module), module.peft_config[ADAPTER_NAME].to_dict())
    return directory


@pytest.fixture(scope="module")
def stock_engine(tiny_path, model_name):
    """vLLM-Omni's own engine for the checkpoint; ``model_class_name`` (a stock argument) where vLLM-Omni would
    infer another pipeline from the directory's name (HunyuanVideo-1.5 image to video)."""
    from vllm_omni.entrypoints.omni import Omni

    from verl_omni.platforms.cpu_patches import engine_start_config
    from verl_omni.utils.vllm_omni_compat import checkpoint_model_class

    size = (MODELS[model_name].get("height", H), MODELS[model_name].get("width", W))
    start = engine_start_config(size, START_TIMEOUT_S, "START_TIMEOUT_S of this test")
    omni = Omni(
        model=str(tiny_path),
        dtype="float32",
        additional_config=start,
        init_timeout=START_TIMEOUT_S,
        stage_init_timeout=START_TIMEOUT_S,
        **checkpoint_model_class(tiny_path),
    )
    yield omni
    omni.close()


def _image(omni, model_name, tiny_path, lora_request=None) -> np.ndarray:
    """The image (a video: its frames) of one request; an editing or image-to-video model's carries a source
    image."""
    from PIL import Image
    from vllm_omni.inputs.data import OmniDiffusionSamplingParams

    from verl_omni.pipelines.model_base import get_model_adapter

    settings = {"height": H, "width": W} | MODELS[model_name]
    params = OmniDiffusionSamplingParams(num_inference_steps=STEPS, seed=1, lora_request=lora_request, **settings)
    prompt = PROMPT
    if get_model_adapter(tiny_path).max_source_images:
        source = np.random.RandomState(0).randint(0, 256, (24, 40, 3), dtype=np.uint8)
        prompt = {"prompt": PROMPT, "multi_modal_data": {"image": Image.fromarray(source)}}
    (output,) = omni.generate([prompt], sampling_params_list=[params])
    return np.stack([np.asarray(x.convert("RGB") if isinstance(x, Image.Image) else x) for x in output.images])


def test_stock_engine_serves_the_checkpoint_lora_and_a_later_request_without_it_is_the_base(
    stock_engine, model_name, tiny_path, lora_dir
):
    from vllm_omni.lora.request import LoRARequest

    lora = LoRARequest(lora_name="ckpt", lora_int_id=1, lora_path=str(lora_dir))
    base = _image(stock_engine, model_name, tiny_path)
    adapted = _image(stock_engine, model_name, tiny_path, lora)
    after = _image(stock_engine, model_name, tiny_path)
    assert base.min() < base.max(), "the base image is blank"
    assert adapted.shape == base.shape
    assert np.abs(adapted.astype(np.float64) - base.astype(np.float64)).max() > 0
    assert np.array_equal(after, base)
