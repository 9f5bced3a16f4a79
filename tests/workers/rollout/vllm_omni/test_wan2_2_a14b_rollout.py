"""The two-expert Wan2.2 (A14B layout) on the real engine (CPU platform plugin, tiny random model, fp32).

vLLM-Omni's ``diffuse`` hands the steps with t >= 1000 · boundary_ratio to ``transformer`` and the rest to
``transformer_2``; the replay must use the expert that sampled each recorded step. The windows here are pinned to
steps 1 and 2 (timesteps 937.5 and 833.3 with shift 5 and 4 steps, boundary 875), so every sample's window has one
step of each expert; the tiny experts differ in depth, so replaying with them swapped must fail the bound.
"""

from __future__ import annotations

import pytest
import torch
from diffusers_helpers import replay_log_probs, start_engine, tokenized_prompt

H = W = 32
PARAMS = {
    "height": H,
    "width": W,
    "num_frames": 5,
    "num_inference_steps": 4,
    "noise_level": 0.7,
    "sde_window_size": 2,
    "sde_window_range": [1, 3],
    "true_cfg_scale": 4.0,
    "seed": 7,
}

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny_path(tiny_model):
    return tiny_model("wan2_2_a14b")


@pytest.fixture(scope="module")
def adapter(tiny_path):
    from verl_omni.pipelines.model_base import get_training_adapter

    return get_training_adapter(tiny_path)


@pytest.fixture(scope="module")
def outputs(tiny_path, adapter, loop):
    rollout = start_engine(loop, tiny_path, "float32", (H, W))
    try:
        prompt = tokenized_prompt(tiny_path, adapter, "a red cat on a chair")
        negative = tokenized_prompt(tiny_path, adapter, "blurry")
        return loop.run(rollout.engine_call(prompt, PARAMS, "a14b", 3, negative))
    finally:
        rollout.shutdown()


def test_the_checkpoint_resolves_to_the_two_expert_adapter(adapter, tiny_path):
    from verl_omni.pipelines.wan2_2.training_adapter import Wan22A14BTrainingAdapter

    assert adapter is Wan22A14BTrainingAdapter and adapter.vae_scale_factor(tiny_path) == 8
    assert adapter.latent_multiple == 16


def test_videos_and_windows_cover_both_experts(outputs, adapter):
    for out in outputs:
        assert out.diffusion_output.shape == (5, 3, H, W) and out.diffusion_output.dtype == torch.uint8
        assert out.extra_fields["window_start"] == 1 and bool(torch.isfinite(out.rollout_log_probs).all())
        assert adapter.high_noise(out.extra_fields["all_timesteps"]).tolist() == [True, False]


def test_each_step_is_replayed_by_the_expert_that_sampled_it(outputs, adapter, tiny_path):
    from verl_omni.pipelines.wan2_2.training_adapter import WanExperts

    rollout = torch.stack([o.rollout_log_probs for o in outputs])
    module = adapter.build_module(tiny_path).eval()
    diff = float((replay_log_probs(adapter, tiny_path, outputs, PARAMS, module=module) - rollout).abs().max())
    print(f"wan2_2_a14b: rollout vs actor replay max |log_prob diff| = {diff:.3e}")
    assert diff <= 1e-5
    swapped = WanExperts(module.transformer_2, module.transformer)
    wrong = (replay_log_probs(adapter, tiny_path, outputs, PARAMS, module=swapped) - rollout).abs()
    print(f"wan2_2_a14b: with the experts swapped, max |log_prob diff| = {float(wrong.max()):.3e}")
    # both columns fail: the high-noise step and the low-noise step each go to the wrong expert
    assert bool((wrong.max(dim=0).values > 1e-3).all())
