"""The SD3.5 / FLUX.1 / Z-Image rollout pipelines on CUDA: vLLM-Omni in bf16 on the tiny bf16 checkpoints.

One engine per model (module-scoped, parametrized), as ``test_diffusers_rollout_engine.py`` runs
them on CPU in fp32. Here the engine computes in bf16 on the GPU and the actor's side replays the
recorded steps with the model's training adapter under bf16 autocast on the same GPU, as the
trainer's bf16 actor does.
"""

from __future__ import annotations

import pytest
import torch
from diffusers_helpers import replay_log_probs, start_engine, tokenized_prompt

H = W = 64
STEPS = 6
WINDOW = 2
NOISE = 0.7
# per model: guidance the model's way (as the CPU engine test)
MODELS = {
    "sd3": {"true_cfg_scale": 4.5},
    "flux": {"guidance_scale": 2.5},
    "z_image": {"true_cfg_scale": 4.0, "model_kwargs": {"cfg_truncation": 0.6, "cfg_normalization": 1.0}},
}
# max |rollout log-prob − actor replay| with both sides in bf16: the Qwen-Image bf16 trainer run measured
# 5.4e-3 (docs/gpu.md) and its test allows 10 × max(step 1's difference, 1e-3); the floor's 10 × 1e-3 here
REPLAY_BOUND_BF16 = 1e-2
SAMPLES = 4

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


@pytest.fixture(scope="module", params=sorted(MODELS))
def model_name(request):
    return request.param


@pytest.fixture(scope="module")
def tiny_path(model_name, tiny_model):
    # saved in bf16 like the released checkpoints: vLLM-Omni loads the text encoders in their saved dtype
    return tiny_model(model_name, "bfloat16")


@pytest.fixture(scope="module")
def adapter(tiny_path):
    from verl_omni.pipelines.model_base import get_training_adapter

    return get_training_adapter(tiny_path)


@pytest.fixture(scope="module")
def gpu_engine(tiny_path, loop):
    rollout = start_engine(loop, tiny_path, "bfloat16", (H, W))
    yield rollout
    rollout.shutdown()


@pytest.fixture(scope="module")
def ids(tiny_path, adapter):
    return tokenized_prompt(tiny_path, adapter, "a red cat on a chair")


def sampling(model_name):
    base = {"height": H, "width": W, "num_inference_steps": STEPS, "noise_level": NOISE, "sde_window_size": WINDOW}
    return {**base, **MODELS[model_name], "seed": 5}


@pytest.fixture(scope="module")
def outputs(loop, gpu_engine, model_name, ids):
    """``SAMPLES`` samples of one request (the batched path); with CFG the negative prompt is the empty one
    (none sent), as the authors' SD3.5 recipe samples."""
    return loop.run(gpu_engine.engine_call(ids, sampling(model_name), f"gpu-{model_name}", SAMPLES))


def test_bf16_rollout_gives_distinct_images_and_finite_log_probs(model_name, outputs):
    assert len(outputs) == SAMPLES
    for out in outputs:
        assert out.diffusion_output.dtype == torch.uint8 and out.diffusion_output.shape == (3, H, W)
        assert out.rollout_log_probs.shape == (WINDOW,) and bool(torch.isfinite(out.rollout_log_probs).all())
        assert out.extra_fields["all_latents"].shape[0] == WINDOW + 1
    assert not torch.equal(outputs[0].diffusion_output, outputs[1].diffusion_output)
    print(f"{model_name} cuda bf16 rollout log-probs: {torch.stack([o.rollout_log_probs for o in outputs]).tolist()}")


def test_bf16_actor_replay_matches_the_rollout(model_name, adapter, tiny_path, outputs):
    replayed = replay_log_probs(adapter, tiny_path, outputs, sampling(model_name), "cuda", torch.bfloat16)
    rollout = torch.stack([o.rollout_log_probs for o in outputs]).float()
    assert replayed.shape == rollout.shape == (SAMPLES, WINDOW)
    diff = float((replayed - rollout).abs().max())
    print(f"{model_name}: bf16 rollout vs bf16 actor replay on CUDA, max |log-prob diff| = {diff:.3e}")
    assert diff <= REPLAY_BOUND_BF16
