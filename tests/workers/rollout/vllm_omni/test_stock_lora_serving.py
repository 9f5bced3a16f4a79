"""A checkpoint's LoRA directory served by stock vLLM-Omni, as a user would serve it (real engine, CPU, fp32).

Per model adapter, one engine of vLLM-Omni's own pipeline for the tiny model (no custom pipeline, no
worker extension of ours), module-scoped. The LoRA directory is what checkpoints write
(``checkpoint.save_lora_dir``: diffusers' file + the PEFT layout under the rollout's names); the
engine reads it from disk through a file ``LoRARequest``. The adapted image must differ from the
base one, and a request without LoRA after it must give the base image again, to the bit.

Z-Image is not here: vLLM-Omni 0.26's own ``ZImagePipeline`` builds its transformer with the released
model's sizes whatever ``transformer/config.json`` says, so it cannot load the tiny checkpoint at all
(``docs/guide/models.md``). Its LoRA directory is served from file by vLLM-Omni's LoRA manager in the rollout
engine instead (``test_diffusers_rollout_engine.py``, equal to the in-memory sync bit for bit).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.slow

H = W = 32
STEPS = 2
PROMPT = "a red cat on a chair"
START_TIMEOUT_S = 1200
# per model: the stock pipeline's guidance arguments (FLUX.1-dev: its embedded guidance)
MODELS = {"qwen_image": {"true_cfg_scale": 4.0}, "sd3": {"guidance_scale": 4.5}, "flux": {"guidance_scale": 2.5}}


@pytest.fixture(scope="module", params=sorted(MODELS))
def model_name(request):
    return request.param


@pytest.fixture(scope="module")
def tiny_path(model_name, tiny_model):
    return tiny_model(model_name)


@pytest.fixture(scope="module")
def lora_dir(tiny_path, tmp_path_factory):
    """A checkpoint's ``lora/`` directory of a random LoRA on the adapter's default targets."""
    from peft import LoraConfig

    from verl_omni.pipelines.model_base import get_model_adapter
    from verl_omni.workers.engine.fsdp.checkpoint import ADAPTER_NAME, gather_lora_state_dict, save_lora_dir

    adapter = get_model_adapter(tiny_path)
    module = adapter.build_module(tiny_path)
    torch.manual_seed(0)
    module.add_adapter(
        LoraConfig(r=4, lora_alpha=8, target_modules=list(adapter.lora_target_modules), init_lora_weights=False)
    )
    directory = tmp_path_factory.mktemp("ckpt") / "lora"
    save_lora_dir(adapter, directory, gather_lora_state_dict(module), module.peft_config[ADAPTER_NAME].to_dict())
    return directory


@pytest.fixture(scope="module")
def stock_engine(tiny_path):
    from vllm_omni.entrypoints.omni import Omni

    from verl_omni.platforms.cpu_patches import engine_start_config

    start = engine_start_config((H, W), START_TIMEOUT_S, "START_TIMEOUT_S of this test")
    omni = Omni(
        model=str(tiny_path),
        dtype="float32",
        additional_config=start,
        init_timeout=START_TIMEOUT_S,
        stage_init_timeout=START_TIMEOUT_S,
    )
    yield omni
    omni.close()


def _image(omni, model_name, lora_request=None) -> np.ndarray:
    from vllm_omni.inputs.data import OmniDiffusionSamplingParams

    params = OmniDiffusionSamplingParams(
        height=H, width=W, num_inference_steps=STEPS, seed=1, lora_request=lora_request, **MODELS[model_name]
    )
    (output,) = omni.generate([PROMPT], sampling_params_list=[params])
    (image,) = output.images
    return np.asarray(image.convert("RGB"))


def test_stock_engine_serves_the_checkpoint_lora_and_a_later_request_without_it_is_the_base(
    stock_engine, model_name, lora_dir
):
    from vllm_omni.lora.request import LoRARequest

    base = _image(stock_engine, model_name)
    adapted = _image(stock_engine, model_name, LoRARequest(lora_name="ckpt", lora_int_id=1, lora_path=str(lora_dir)))
    after = _image(stock_engine, model_name)
    assert np.abs(adapted.astype(int) - base.astype(int)).max() > 0
    assert np.array_equal(after, base)
