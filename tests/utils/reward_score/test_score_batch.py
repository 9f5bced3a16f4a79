"""Input checks of the scorer contract: bad images, prompts, scores and params are named errors."""

import math

import pytest
import torch

from verl_omni.utils.reward_score import ScoreBatch, build_params, check_scores, get_scorer_cls


def test_score_batch_rejects_float_images():
    with pytest.raises(ValueError, match="uint8.*float32"):
        ScoreBatch(torch.zeros(1, 3, 4, 4), ["p"])


@pytest.mark.parametrize("shape", [(3, 4, 4), (1, 4, 4, 4), (1, 1, 4, 4), (1, 3, 0, 4)])
def test_score_batch_rejects_wrong_shapes(shape):
    with pytest.raises(ValueError, match=r"\[B, 3, H, W\]"):
        ScoreBatch(torch.zeros(shape, dtype=torch.uint8), ["p"])


def test_score_batch_rejects_non_tensor_and_prompt_count_mismatch():
    with pytest.raises(TypeError, match="torch.Tensor"):
        ScoreBatch([[0]], ["p"])
    with pytest.raises(ValueError, match="prompts must be 2 strings"):
        ScoreBatch(torch.zeros(2, 3, 4, 4, dtype=torch.uint8), ["only one"])
    with pytest.raises(ValueError, match="targets must have one entry per image"):
        ScoreBatch(torch.zeros(2, 3, 4, 4, dtype=torch.uint8), ["a", "b"], targets=["x"])


def test_check_scores_names_scorer_and_sample_for_nan():
    with pytest.raises(ValueError, match=r"scorer 'demo' returned a non-finite score nan for sample 1"):
        check_scores([0.5, math.nan], 2, "demo")
    with pytest.raises(ValueError, match="returned 1 scores for 2 images"):
        check_scores([0.5], 2, "demo")


def test_build_params_names_the_dotted_key():
    ocr = get_scorer_cls("ocr")
    with pytest.raises(ValueError, match=r"^a\.b\.params\.max_retries must be >= 0"):
        build_params(ocr.params_cls, {"url": "http://127.0.0.1:1", "model": "m", "max_retries": -1}, "a.b.params")
    with pytest.raises(ValueError, match=r"a\.params: unknown parameter\(s\) \['retries'\]"):
        build_params(ocr.params_cls, {"url": "http://127.0.0.1:1", "model": "m", "retries": 1}, "a.params")


def test_score_batch_takes_videos_and_selects_one_sample_with_its_sources():
    videos = torch.zeros(2, 5, 3, 4, 4, dtype=torch.uint8)
    sources = [[torch.zeros(3, 2, 6, dtype=torch.uint8)], []]
    batch = ScoreBatch(videos, ["a", "b"], sources=sources)
    assert batch.is_video and len(batch) == 2
    one = batch.select(0)
    assert one.images.shape == (1, 5, 3, 4, 4) and one.sources == [sources[0]] and one.prompts == ["a"]
    with pytest.raises(ValueError, match=r"\[B, F, 3, H, W\] \(videos\), got \(2, 5, 1, 4, 4\)"):
        ScoreBatch(torch.zeros(2, 5, 1, 4, 4, dtype=torch.uint8), ["a", "b"])


@pytest.mark.parametrize(
    "sources,message",
    [
        ([[]], "sources must have one list per image"),
        ([[torch.zeros(3, 4, 4)], []], r"sources\[0\]\[0\] must be a uint8 tensor"),
        ([[], [torch.zeros(4, 4, 3, dtype=torch.uint8)]], r"sources\[1\]\[0\] must have shape \[3, h, w\]"),
    ],
)
def test_score_batch_rejects_bad_source_images(sources, message):
    with pytest.raises(ValueError, match=message):
        ScoreBatch(torch.zeros(2, 3, 4, 4, dtype=torch.uint8), ["a", "b"], sources=sources)
