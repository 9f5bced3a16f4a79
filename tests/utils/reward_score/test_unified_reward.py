"""The ``unified_reward`` scorer against a real local OpenAI-compatible HTTP server (tests/utils/conftest.py).

The server answers as UnifiedReward does for its pointwise image-generation prompt: a short assessment, then
``Final Score: N`` with N in 1..5, here computed from the image it received, so a scorer that mixed up samples
would get wrong scores.
"""

import asyncio
import base64
import io
import math

import numpy as np
import pytest
import torch
from PIL import Image

from verl_omni.utils.reward_score import MultiReward, ScoreBatch, ScorerError, build_params, get_scorer_cls
from verl_omni.utils.reward_score.multi import WeightedScorer


def make_scorer(url, **overrides):
    params = dict(url=url + "/v1", model="UnifiedReward", max_retries=0, timeout_s=10, **overrides)
    cls = get_scorer_cls("unified_reward")
    return cls(build_params(cls.params_cls, params, "test"))


def flat(value):
    return torch.full((3, 8, 8), value, dtype=torch.uint8)


def judged_pixel(body) -> int:
    """The first pixel of the one image in the request."""
    (image,) = [p for p in body["messages"][-1]["content"] if p["type"] == "image_url"]
    png = base64.b64decode(image["image_url"]["url"].removeprefix("data:image/png;base64,"))
    return int(np.array(Image.open(io.BytesIO(png)))[0, 0, 0])


def unified_reward_answer(body) -> str:
    """1 for black, 5 for white, as the model writes it."""
    grade = 1 + 4 * judged_pixel(body) / 255
    return f"The image matches the caption and its quality is fair.\nFinal Score: {grade:.2f}"


def test_sends_the_image_then_the_caption_and_maps_final_score_1_to_5_onto_0_to_1(scoring_server):
    scoring_server.chat_reply = unified_reward_answer
    batch = ScoreBatch(torch.stack([flat(0), flat(255), flat(51)]), ["a cat", "a dog", "a red car"])
    assert asyncio.run(make_scorer(scoring_server.url).score(batch)) == pytest.approx([0.0, 1.0, 0.2])
    (body,) = [r for r in scoring_server.requests if judged_pixel(r) == 51]
    (message,) = body["messages"]
    assert [p["type"] for p in message["content"]] == ["image_url", "text"]
    text = message["content"][-1]["text"]
    assert text.endswith("Text Caption: [a red car]")
    assert "assign a score from 1 to 5 after 'Final Score:'" in text
    assert (body["model"], body["temperature"]) == ("UnifiedReward", 0.0)


def test_raw_grade_is_kept_without_normalize(scoring_server):
    scoring_server.reply_text = "Final Score: 3.5"
    scorer = make_scorer(scoring_server.url, normalize=False)
    assert asyncio.run(scorer.score(ScoreBatch(flat(0)[None], ["p"]))) == [3.5]


@pytest.mark.parametrize(
    "reply,message",
    [
        ("A pleasant picture of a cat, I rate it highly.", r"scorer 'unified_reward': no match of score_pattern"),
        ("Final Score: 7", r"score 7.0 is outside \[score_min, score_max\] = \[1.0, 5.0\]"),
        ("Final Score: 0", "outside"),
    ],
)
def test_an_answer_without_a_grade_in_1_to_5_raises_naming_the_scorer(scoring_server, reply, message):
    scoring_server.reply_text = reply
    with pytest.raises(ScorerError, match=message):
        asyncio.run(make_scorer(scoring_server.url).score(ScoreBatch(flat(0)[None], ["p"])))


def test_optional_scorer_leaves_a_malformed_answer_out_of_that_sample_never_zero(scoring_server):
    scoring_server.chat_reply = lambda body: "Final Score: 5" if judged_pixel(body) else "I cannot grade this."
    entries = [
        WeightedScorer("unified_reward", make_scorer(scoring_server.url), 1.0, False),
        WeightedScorer("brightness", get_scorer_cls("brightness")(), 1.0, True),
    ]
    result = asyncio.run(MultiReward(entries).score(ScoreBatch(torch.stack([flat(255), flat(0)]), ["a", "b"])))
    assert result.per_scorer["unified_reward"] == [1.0, None]
    assert result.rewards == pytest.approx([1.0, 0.0])
    assert math.isnan(result.extra_infos()[1]["reward/unified_reward"])


def test_model_is_required_and_the_error_names_the_key():
    cls = get_scorer_cls("unified_reward")
    with pytest.raises(ValueError, match=r"^reward\.diffusion\.scorers\[0\]\.params\.model must name the served VLM"):
        build_params(cls.params_cls, {"url": "http://127.0.0.1:1/v1"}, "reward.diffusion.scorers[0].params")
