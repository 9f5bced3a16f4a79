"""Parsing of rollout requests: token ids required, one seed and one SDE window per sample."""

from types import SimpleNamespace

import pytest

from verl_omni.pipelines.qwen_image.rollout_request import parse_rollout_request

IDS = list(range(40))


def params(n=1, seed=3, **extra):
    return SimpleNamespace(num_outputs_per_prompt=n, seed=seed, extra_args=extra)


def test_samples_get_consecutive_seeds_and_windows_inside_the_range():
    req = parse_rollout_request({"prompt_token_ids": IDS}, params(n=4, sde_window_size=2, sde_window_range=[1, 5]), 10)
    assert req.seeds == [3, 4, 5, 6]
    assert all(1 <= s <= 3 for s in req.window_starts)
    again = parse_rollout_request(
        {"prompt_token_ids": IDS}, params(n=4, sde_window_size=2, sde_window_range=[1, 5]), 10
    )
    assert again.window_starts == req.window_starts
    levels = [req.noise_levels_at(step) for step in range(10)]
    assert [sum(1 for row in levels if row[i] > 0) for i in range(4)] == [2, 2, 2, 2]


def test_text_prompt_is_rejected_with_the_expected_format():
    with pytest.raises(ValueError, match="prompt_token_ids"):
        parse_rollout_request({"prompt": "a cat"}, params(), 4)


def test_seed_count_must_match_num_outputs_per_prompt():
    with pytest.raises(ValueError, match="seeds"):
        parse_rollout_request({"prompt_token_ids": IDS}, params(n=2, seeds=[1, 2, 3]), 4)


def test_unseeded_request_is_rejected():
    with pytest.raises(ValueError, match="seed"):
        parse_rollout_request({"prompt_token_ids": IDS}, params(seed=None), 4)


def test_unknown_sde_type_is_rejected():
    with pytest.raises(ValueError, match="sde_type"):
        parse_rollout_request({"prompt_token_ids": IDS}, params(sde_type="ode"), 4)


def test_noise_level_zero_is_the_ode_with_no_stochastic_step_and_negative_is_rejected():
    req = parse_rollout_request({"prompt_token_ids": IDS}, params(n=2, noise_level=0.0), 4)
    assert all(level == 0.0 for step in range(4) for level in req.noise_levels_at(step))
    with pytest.raises(ValueError, match="noise_level"):
        parse_rollout_request({"prompt_token_ids": IDS}, params(noise_level=-0.1), 4)
