"""The README's main job end to end on the tiny model: consistency, update direction, files written."""

import json

import pytest

from verl_omni.trainer import sanity_step


@pytest.mark.slow  # sampling, a replay and four optimizer steps: a trainer run, in this process
def test_sanity_step_replays_exactly_and_favours_positive_advantages(tiny_qwen_image_path, tmp_path):
    out = tmp_path / "run"
    args = sanity_step.parse_args(
        ["--model-path", str(tiny_qwen_image_path), "--out", str(out), "--n", "3", "--steps", "4", "--size", "32"]
    )
    result = sanity_step.run(args)

    assert result["logprob_consistency_max_abs"] <= 1e-6
    assert result["advantage_abs_mean"] > 0
    assert result["logprob_delta_positive_adv"] > result["logprob_delta_negative_adv"]
    assert json.loads((out / "metrics.json").read_text()) == result
    assert (out / "samples.png").stat().st_size > 0


def test_sanity_step_names_a_bad_model_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="model_index.json"):
        sanity_step.resolve_model_path(str(tmp_path / "missing"), tmp_path)
