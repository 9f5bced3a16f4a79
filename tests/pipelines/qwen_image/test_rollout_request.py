"""Parsing of rollout requests: token ids required, one seed and one SDE window per sample.

Requests are built by the engine's own ``build_sampling_params`` (the client the pipeline reads from).
"""

import pytest

from verl_omni.pipelines.qwen_image.rollout_request import parse_rollout_request
from verl_omni.workers.rollout.vllm_omni.engine import build_sampling_params

IDS = list(range(40))


def params(n=1, seed=3, **spec):
    request = {"num_inference_steps": 10, "height": 32, "width": 32, **spec}
    if seed is not None:
        request["seed"] = seed
    return build_sampling_params(request, n)


def test_samples_get_consecutive_seeds_and_windows_inside_the_range():
    req = parse_rollout_request({"prompt_token_ids": IDS}, params(n=4, sde_window_size=2, sde_window_range=[1, 5]))
    assert req.seeds == (3, 4, 5, 6)
    assert all(1 <= s <= 3 for s in req.window_starts)
    again = parse_rollout_request({"prompt_token_ids": IDS}, params(n=4, sde_window_size=2, sde_window_range=[1, 5]))
    assert again.window_starts == req.window_starts
    assert req.spec.sde_window_range == (1, 5) and req.window_size == 2


def test_text_prompt_is_rejected_with_the_expected_format():
    with pytest.raises(ValueError, match="prompt_token_ids"):
        parse_rollout_request({"prompt": "a cat"}, params())


def test_seed_count_must_match_num_outputs_per_prompt():
    with pytest.raises(ValueError, match="seeds"):
        parse_rollout_request({"prompt_token_ids": IDS}, params(n=2, seeds=[1, 2, 3]))


def test_unseeded_request_is_rejected():
    with pytest.raises(ValueError, match="seed"):
        parse_rollout_request({"prompt_token_ids": IDS}, params(seed=None))


def test_unknown_sde_type_is_rejected_before_the_engine():
    with pytest.raises(ValueError, match="sde_type"):
        params(sde_type="ode")


def test_noise_level_zero_is_the_ode_and_negative_is_rejected():
    req = parse_rollout_request({"prompt_token_ids": IDS}, params(n=2, noise_level=0.0))
    assert req.noise_level == 0.0
    with pytest.raises(ValueError, match="noise_level"):
        params(noise_level=-0.1)


def test_request_without_the_spec_names_how_to_build_one():
    from vllm_omni.inputs.data import OmniDiffusionSamplingParams

    with pytest.raises(ValueError, match="build_sampling_params"):
        parse_rollout_request({"prompt_token_ids": IDS}, OmniDiffusionSamplingParams(seed=1))
