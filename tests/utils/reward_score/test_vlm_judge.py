"""The ``vlm_judge`` scorer against a real local OpenAI-compatible HTTP server (tests/utils/conftest.py).

The server plays a VLM judge: it reads the images out of the request's data URLs and answers with
a grade computed from them, so a scorer that mixed up samples or images would get wrong scores.
"""

import asyncio
import base64
import io
import math
import threading

import numpy as np
import pytest
import torch
from PIL import Image

from verl_omni.utils.reward_score import MultiReward, ScoreBatch, ScorerError, build_params, get_scorer_cls
from verl_omni.utils.reward_score.judge_parse import ScoreParseError, parse_score
from verl_omni.utils.reward_score.multi import WeightedScorer


def make_judge(url, **overrides):
    params = dict(url=url + "/v1", model="tiny-judge", max_retries=1, backoff_s=0.01, max_backoff_s=0.02, timeout_s=10)
    params.update(overrides)
    cls = get_scorer_cls("vlm_judge")
    return cls(build_params(cls.params_cls, params, "test"))


def flat(value, h=8, w=12):
    return torch.full((3, h, w), value, dtype=torch.uint8)


def decode_data_url(url: str) -> torch.Tensor:
    assert url.startswith("data:image/png;base64,")
    png = base64.b64decode(url.removeprefix("data:image/png;base64,"))
    return torch.from_numpy(np.array(Image.open(io.BytesIO(png)))).permute(2, 0, 1)


def request_images(body) -> list[torch.Tensor]:
    parts = body["messages"][-1]["content"]
    return [decode_data_url(p["image_url"]["url"]) for p in parts if p["type"] == "image_url"]


def request_text(body) -> str:
    return body["messages"][-1]["content"][-1]["text"]


def brightness_judge(body) -> str:
    """Grade = mean pixel of the last (judged) image / 25.5, i.e. 0..10, after some reasoning."""
    grade = float(request_images(body)[-1].float().mean()) / 25.5
    return f"The edit mostly follows the instruction.\nScore: {grade:.4f}"


def test_vlm_judge_sends_sources_then_the_image_as_data_urls_with_the_instruction(scoring_server):
    scoring_server.chat_reply = brightness_judge
    sources = [[flat(10, 6, 6), flat(20, 10, 4)], []]
    batch = ScoreBatch(torch.stack([flat(51), flat(204)]), ["make it red", "a cat"], sources=sources)
    judge = make_judge(scoring_server.url, system_prompt="You are strict.", extra_body={"top_p": 0.5})
    assert asyncio.run(judge.score(batch)) == pytest.approx([0.2, 0.8])
    by_prompt = {request_text(r).split("Instruction: ")[1].split("\n")[0]: r for r in scoring_server.requests}
    edit, t2i = by_prompt["make it red"], by_prompt["a cat"]
    assert [img.tolist() for img in request_images(edit)] == [
        flat(10, 6, 6).tolist(),
        flat(20, 10, 4).tolist(),
        flat(51).tolist(),
    ]
    assert [img.tolist() for img in request_images(t2i)] == [flat(204).tolist()]
    assert edit["messages"][0] == {"role": "system", "content": "You are strict."}
    assert (edit["model"], edit["temperature"], edit["max_tokens"], edit["top_p"]) == ("tiny-judge", 0.0, 512, 0.5)
    # the text follows the images
    assert edit["messages"][-1]["content"][-1]["type"] == "text"


def test_vlm_judge_template_replaces_only_the_prompt_placeholder(scoring_server):
    scoring_server.reply_text = '{"reason": "ok", "score": [4, 5]}'
    template = 'Edit: {prompt}. Answer as JSON: {"reason": str, "score": [sc, pq]}'
    judge = make_judge(scoring_server.url, prompt_template=template, parser="json", score_min=0, score_max=5)
    scores = asyncio.run(judge.score(ScoreBatch(flat(0)[None], ["add a hat"])))
    assert scores == [pytest.approx(0.9)]
    assert (
        request_text(scoring_server.requests[0])
        == 'Edit: add a hat. Answer as JSON: {"reason": str, "score": [sc, pq]}'
    )


PARSE_CASES = [
    ("Reasoning... Score: 3\nFinal Score: 8", "regex", {}, 8.0),
    (
        "Alignment Score (1-5): 4\nCoherence Score (1-5): 3\nStyle Score (1-5): 5",
        "regex",
        {"pattern": r"(?s)Alignment Score \(1-5\): (\d).*Coherence Score \(1-5\): (\d).*Style Score \(1-5\): (\d)"},
        4.0,
    ),
    ("I would give it 7 out of 10, so 6.5", "last_number", {}, 6.5),
    ('Here:\n```json\n{"result": {"overall": 7.5}}\n```', "json", {"field": "result.overall"}, 7.5),
    ('Sure! {"score": [8, 6], "reasoning": "fine"} Done.', "json", {}, 7.0),
]


@pytest.mark.parametrize("text,parser,kwargs,expected", PARSE_CASES)
def test_parsers_read_the_documented_forms(text, parser, kwargs, expected):
    pattern = kwargs.get("pattern", r"(?i)score\s*[:=]\s*([-+]?\d+(?:\.\d+)?)")
    assert parse_score(text, parser, pattern, kwargs.get("field", "score")) == pytest.approx(expected)


@pytest.mark.parametrize(
    "text,parser,message",
    [
        ("no grade here", "regex", "no match of score_pattern"),
        ("no digits", "last_number", "no number"),
        ("not json {", "json", "no JSON object"),
        ('{"grade": 3}', "json", "no field 'score'"),
        ('{"score": "high"}', "json", "not a number"),
        ('{"score": true}', "json", "not a number"),
    ],
)
def test_parsers_raise_on_answers_without_a_score(text, parser, message):
    with pytest.raises(ScoreParseError, match=message):
        parse_score(text, parser, r"(?i)score\s*[:=]\s*(\d+)", "score")


@pytest.mark.parametrize(
    "answer,reply,message",
    [
        ({"error": "no choices"}, None, "unexpected chat answer"),
        (None, "", "empty answer"),
        (None, "A lovely image, I like it.", "no match of score_pattern"),
        (None, "Score: 11", r"score 11.0 is outside \[score_min, score_max\] = \[0.0, 10.0\]"),
        (None, "Score: -1", "outside"),
    ],
)
def test_malformed_or_out_of_range_answers_raise_and_are_not_retried(scoring_server, answer, reply, message):
    scoring_server.answer, scoring_server.reply_text = answer, reply
    with pytest.raises(ScorerError, match=message):
        asyncio.run(make_judge(scoring_server.url, max_retries=3).score(ScoreBatch(flat(0)[None], ["p"])))
    assert len(scoring_server.requests) == 1


def test_raw_scores_are_kept_without_normalize(scoring_server):
    scoring_server.reply_text = "Score: 3.5"
    judge = make_judge(scoring_server.url, normalize=False, score_min=1, score_max=5)
    assert asyncio.run(judge.score(ScoreBatch(flat(0)[None], ["p"]))) == [3.5]


def test_server_errors_are_retried_with_backoff_then_succeed(scoring_server):
    scoring_server.reply_text = "Score: 5"
    refused = []
    scoring_server.fail_when = lambda body: len(refused) < 2 and not refused.append(1)
    judge = make_judge(scoring_server.url, max_retries=2)
    assert asyncio.run(judge.score(ScoreBatch(flat(0)[None], ["p"]))) == [0.5]
    assert len(scoring_server.requests) == 3


def test_timeout_is_retried_then_raised(scoring_server):
    scoring_server.hold = threading.Event()  # never answers while the test runs
    with pytest.raises(ScorerError, match="after 2 attempts") as info:
        asyncio.run(make_judge(scoring_server.url, timeout_s=0.2).score(ScoreBatch(flat(0)[None], ["p"])))
    assert isinstance(info.value.__cause__, TimeoutError)
    assert len(scoring_server.wait_for_requests(2)) == 2


def test_samples_are_judged_concurrently_up_to_max_concurrency(scoring_server):
    """The server holds each request until two are in flight: sequential requests would break the
    barrier (HTTP 500, not retried here), and the semaphore must never let a third one in."""
    scoring_server.chat_reply = brightness_judge
    scoring_server.barrier = threading.Barrier(2)
    images = torch.stack([flat(v) for v in (0, 51, 102, 153, 204, 255)])
    judge = make_judge(scoring_server.url, max_concurrency=2, max_retries=0)
    scores = asyncio.run(judge.score(ScoreBatch(images, ["p"] * 6)))
    assert scores == pytest.approx([0.0, 0.2, 0.4, 0.6, 0.8, 1.0])
    assert scoring_server.max_inflight == 2


def test_optional_judge_failing_on_one_sample_leaves_it_out_never_zero(scoring_server):
    scoring_server.chat_reply = lambda body: "Score: 20" if request_images(body)[-1][0, 0, 0] == 0 else "Score: 10"
    brightness = get_scorer_cls("brightness")()
    entries = [
        WeightedScorer("judge", make_judge(scoring_server.url), 1.0, False),
        WeightedScorer("brightness", brightness, 1.0, True),
    ]
    batch = ScoreBatch(torch.stack([flat(255), flat(0)]), ["a", "b"])
    result = asyncio.run(MultiReward(entries).score(batch))
    assert result.per_scorer["judge"] == [1.0, None]
    assert result.rewards == pytest.approx([1.0, 0.0])
    assert math.isnan(result.extra_infos()[1]["reward/judge"])


@pytest.mark.parametrize(
    "overrides,message",
    [
        ({"model": ""}, "model must name the served VLM"),
        ({"prompt_template": "Rate this."}, r"prompt_template must contain '\{prompt\}'"),
        ({"parser": "yaml"}, r"parser must be one of \('regex', 'last_number', 'json'\)"),
        ({"score_pattern": "Score: ("}, "score_pattern is not a valid regular expression"),
        ({"score_min": 5, "score_max": 5}, "score_min must be < score_max"),
        ({"extra_body": {"model": "other"}}, r"extra_body may not set \['model'\]"),
        ({"url": "host:8000/v1"}, "url must be an http"),
    ],
)
def test_params_errors_name_the_dotted_key(overrides, message):
    cls = get_scorer_cls("vlm_judge")
    params = {"url": "http://127.0.0.1:1/v1", "model": "m", **overrides}
    with pytest.raises(ValueError, match=rf"^reward\.diffusion\.scorers\[0\]\.params\.{message}"):
        build_params(cls.params_cls, params, "reward.diffusion.scorers[0].params")
