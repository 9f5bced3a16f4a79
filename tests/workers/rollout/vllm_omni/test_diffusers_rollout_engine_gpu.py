"""The SD3.5 / FLUX.1 / FLUX.2-klein / Z-Image / Wan2.2 (text and image to video) / Qwen-Image-Edit / FLUX.1-Kontext
rollout pipelines on CUDA: vLLM-Omni in bf16 on the tiny bf16 checkpoints.

One engine per model (module-scoped, parametrized), as ``test_diffusers_rollout_engine.py`` runs
them on CPU in fp32. Here the engine computes in bf16 on the GPU and the actor's side replays the
recorded steps with the model's training adapter under bf16 autocast on the same GPU, as the
trainer's bf16 actor does.
"""

from __future__ import annotations

import pytest
import torch
from diffusers_helpers import replay_log_probs, source_images, start_engine, tokenized_prompt
from figures import figure

H = W = 64
STEPS = 6
WINDOW = 2
NOISE = 0.7
# per model: guidance the model's way (as the CPU engine test)
MODELS = {
    "sd3": {"true_cfg_scale": 4.5},
    "flux": {"guidance_scale": 2.5},
    # FLUX.2-dev's embedded guidance
    "flux2": {"guidance_scale": 2.5},
    # the base klein's CFG; the step-distilled klein samples without
    "flux2_klein": {"true_cfg_scale": 4.0},
    "flux2_klein_distilled": {},
    "z_image": {"true_cfg_scale": 4.0, "model_kwargs": {"cfg_truncation": 0.6, "cfg_normalization": 1.0}},
    # a video of 5 frames (two latent frames) at 64² (2×2 transformer patches), the TI2V-5B example's CFG 5
    "wan2_2": {"true_cfg_scale": 5.0, "num_frames": 5},
    # image to video: the source image is the first frame; both experts sample (the I2V launcher's CFG 3.5)
    "wan2_2_i2v_a14b": {"true_cfg_scale": 3.5, "num_frames": 5},
    # LTX-2: 9 frames (two latent frames of 2x2 cells) and their sound as one latent; the release's per-stream CFG
    "ltx2": {"true_cfg_scale": 3.0, "num_frames": 9, "model_kwargs": {"audio_cfg_scale": 7.0}},
    # HunyuanVideo-1.5: 5 frames at 64² (1x1 patches), the released guider's CFG 6; image to video with the source image
    "hunyuan_video_1_5": {"true_cfg_scale": 6.0, "num_frames": 5},
    "hunyuan_video_1_5_i2v": {"true_cfg_scale": 6.0, "num_frames": 5},
    # one source image conditioned at the output's area (the stock 1024² is 16k tokens on the tiny 4x VAE)
    "qwen_image_edit": {"true_cfg_scale": 4.0, "model_kwargs": {"condition_area": H * W}},
    # two source images, each also read by the vision tower at the output's area (the stock 384²)
    "qwen_image_edit_plus": {
        "true_cfg_scale": 4.0,
        "model_kwargs": {"condition_area": H * W, "vl_condition_area": H * W},
    },
    # one source image, FLUX's embedded guidance (Kontext refuses true CFG)
    "flux_kontext": {"guidance_scale": 2.5},
}
# the editing models' CFG needs the negative prompt sent (diffusers' Qwen-Image-Edit default " "); the others take
# the empty one when none is sent
NEGATIVE_PROMPT = {"qwen_image_edit": " ", "qwen_image_edit_plus": " "}
# max |rollout log-prob − actor replay| with both sides in bf16: the Qwen-Image bf16 trainer run measured
# 5.4e-3 (benchmarks/results/gpu_tests.md) and its test allows 10 × max(step 1's difference, 1e-3); the floor's
# 10 × 1e-3 here
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
    from verl_omni.pipelines.model_base import get_model_adapter

    return get_model_adapter(tiny_path)


@pytest.fixture(scope="module")
def gpu_engine(tiny_path, loop):
    rollout = start_engine(loop, tiny_path, "bfloat16", (H, W))
    yield rollout
    rollout.shutdown()


@pytest.fixture(scope="module")
def ids(tiny_path, adapter, model_name):
    negative = NEGATIVE_PROMPT.get(model_name)
    return {
        "prompt": tokenized_prompt(tiny_path, adapter, "a red cat on a chair"),
        "negative": None if negative is None else tokenized_prompt(tiny_path, adapter, negative),
    }


def sampling(model_name):
    base = {"height": H, "width": W, "num_inference_steps": STEPS, "noise_level": NOISE, "sde_window_size": WINDOW}
    return {**base, **MODELS[model_name], "seed": 5}


@pytest.fixture(scope="module")
def outputs(loop, gpu_engine, model_name, ids, adapter):
    """``SAMPLES`` samples of one request (the batched path; an editing model's with its source images, sent once);
    with CFG the negative prompt is the empty one (none sent, as the authors' SD3.5 recipe samples) unless the model
    needs one sent."""
    call = gpu_engine.engine_call(
        ids["prompt"],
        sampling(model_name),
        f"gpu-{model_name}",
        SAMPLES,
        ids["negative"],
        image_data=source_images(adapter),
    )
    return loop.run(call)


def test_bf16_rollout_gives_distinct_images_and_finite_log_probs(model_name, outputs):
    assert len(outputs) == SAMPLES
    frames = MODELS[model_name].get("num_frames", 1)
    # an image [3, H, W]; a video [F, 3, H, W]
    expected = (3, H, W) if frames == 1 else (frames, 3, H, W)
    for out in outputs:
        assert out.diffusion_output.dtype == torch.uint8 and out.diffusion_output.shape == expected
        assert out.rollout_log_probs.shape == (WINDOW,) and bool(torch.isfinite(out.rollout_log_probs).all())
        assert out.extra_fields["all_latents"].shape[0] == WINDOW + 1
    assert not torch.equal(outputs[0].diffusion_output, outputs[1].diffusion_output)
    print(f"{model_name} cuda bf16 rollout log-probs: {torch.stack([o.rollout_log_probs for o in outputs]).tolist()}")


def test_bf16_actor_replay_matches_the_rollout(model_name, adapter, tiny_path, outputs):
    replayed = replay_log_probs(adapter, tiny_path, outputs, sampling(model_name), "cuda", torch.bfloat16)
    rollout = torch.stack([o.rollout_log_probs for o in outputs]).float()
    assert replayed.shape == rollout.shape == (SAMPLES, WINDOW)
    diff = float((replayed - rollout).abs().max())
    # bf16 rollout vs bf16 actor replay on CUDA
    figure("logprob_diff_rollout_vs_replay", diff)
    assert diff <= REPLAY_BOUND_BF16
