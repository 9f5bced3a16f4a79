"""The ``ocr`` scorer against a real local OpenAI-compatible HTTP server (tests/utils/conftest.py)."""

import asyncio
import base64
import io
import logging
import math
import threading

import numpy as np
import pytest
import torch
from PIL import Image

from verl_omni.utils.reward_score import MultiReward, ScoreBatch, ScorerError, build_params, get_scorer_cls
from verl_omni.utils.reward_score.http_client import image_to_png_base64
from verl_omni.utils.reward_score.multi import WeightedScorer
from verl_omni.utils.reward_score.ocr import edit_distance, find_target, ocr_similarity


def make_ocr(url, **overrides):
    params = dict(url=url + "/v1", model="tiny-vlm", max_retries=2, backoff_s=0.01, max_backoff_s=0.02, timeout_s=10)
    params.update(overrides)
    cls = get_scorer_cls("ocr")
    return cls(build_params(cls.params_cls, params, "test"))


def images(n, h=16, w=24):
    return torch.randint(0, 256, (n, 3, h, w), dtype=torch.uint8, generator=torch.Generator().manual_seed(n))


def test_edit_distance_and_similarity():
    assert edit_distance("kitten", "sitting") == 3
    assert edit_distance("", "abc") == 3
    assert ocr_similarity("Hello  World", "hello world") == 1.0
    assert ocr_similarity("hellp world", "hello world") == pytest.approx(1 - 1 / 10)
    assert ocr_similarity("something much longer than the target", "ab") == 0.0


def test_a_contained_target_is_exact_only_when_asked():
    """Flow-GRPO's PaddleOCR reward (``paddle_ocr``) does not penalize text around the target; ``ocr`` does."""
    assert ocr_similarity("Open 24 hours daily", "24 HOURS", contained_is_exact=True) == 1.0
    assert ocr_similarity("Open 24 hours daily", "24 HOURS") == 0.0  # 9 extra characters, capped at the length 7
    assert ocr_similarity("24 hour", "24 HOURS", contained_is_exact=True) == pytest.approx(1 - 1 / 7)
    assert ocr_similarity("", "", contained_is_exact=True) == 1.0
    assert ocr_similarity("abc", " ", contained_is_exact=True) == 0.0


def test_target_comes_from_ground_truth_else_first_quoted_span():
    assert find_target('a sign that reads "OPEN 24H" and "CLOSED"', None) == "OPEN 24H"
    assert find_target("a poster saying “Summer Sale”", None) == "Summer Sale"
    assert find_target('a sign reading "A"', "override") == "override"
    with pytest.raises(ValueError, match="no quoted target"):
        find_target("a sign without quotes", None)


def test_ocr_exact_text_scores_one_and_sends_the_image(scoring_server):
    scoring_server.reply_text = "OPEN 24H"
    batch = ScoreBatch(images(1), ['a shop sign that reads "open 24h"'])
    assert asyncio.run(make_ocr(scoring_server.url).score(batch)) == [1.0]
    request = scoring_server.requests[0]
    assert request["model"] == "tiny-vlm"
    image_part = request["messages"][0]["content"][0]["image_url"]["url"]
    png = base64.b64decode(image_part.removeprefix("data:image/png;base64,"))
    decoded = torch.from_numpy(np.array(Image.open(io.BytesIO(png)))).permute(2, 0, 1)
    assert torch.equal(decoded, batch.images[0])


def test_ocr_wrong_text_scores_below_one(scoring_server):
    scoring_server.reply_text = "OPEN 2AH"
    batch = ScoreBatch(images(2), ['sign "OPEN 24H"', 'sign "nothing alike"'], targets=[None, "zzzz"])
    scores = asyncio.run(make_ocr(scoring_server.url).score(batch))
    assert scores[0] == pytest.approx(1 - 1 / 7)
    assert scores[1] == 0.0


def test_required_ocr_raises_after_configured_retries_on_server_error(scoring_server):
    scoring_server.status = 503
    batch = ScoreBatch(images(1), ['sign "x"'])
    reward = MultiReward([WeightedScorer("ocr", make_ocr(scoring_server.url, max_retries=2), 1.0, True)])
    with pytest.raises(ScorerError, match=r"required scorer 'ocr' failed.*after 3 attempts.*HTTP 503"):
        asyncio.run(reward.score(batch))
    assert len(scoring_server.requests) == 3


def test_required_ocr_raises_with_cause_when_server_is_down(closed_port_url, caplog):
    batch = ScoreBatch(images(1), ['sign "x"'])
    reward = MultiReward([WeightedScorer("ocr", make_ocr(closed_port_url, max_retries=1), 1.0, True)])
    with caplog.at_level(logging.WARNING), pytest.raises(ScorerError, match="'ocr'") as info:
        asyncio.run(reward.score(batch))
    assert "ClientConnectorError" in str(info.value) or "Connect" in str(info.value)
    assert sum("attempt" in r.getMessage() for r in caplog.records) == 2


def test_optional_ocr_failure_is_excluded_not_zero(closed_port_url, caplog):
    jpeg_cls = get_scorer_cls("jpeg_incompressibility")
    entries = [
        WeightedScorer("jpeg", jpeg_cls(), 2.0, True),
        WeightedScorer("ocr", make_ocr(closed_port_url, max_retries=0), 5.0, False),
    ]
    batch = ScoreBatch(images(2), ['sign "a"', 'sign "b"'])
    with caplog.at_level(logging.WARNING):
        result = asyncio.run(MultiReward(entries).score(batch))
    jpeg_only = asyncio.run(jpeg_cls().score(batch))
    assert result.rewards == pytest.approx(jpeg_only)
    assert result.per_scorer["ocr"] == [None, None]
    assert all(math.isnan(info["reward/ocr"]) for info in result.extra_infos())
    assert any("optional scorer 'ocr' failed" in r.getMessage() for r in caplog.records)


def test_optional_ocr_excludes_only_the_failing_sample(scoring_server):
    """Samples are requested separately, so a request the server keeps refusing (here: the one
    carrying the all-black image) excludes only its own sample."""
    scoring_server.reply_text = "hello"
    black = ScoreBatch(torch.zeros(1, 3, 8, 8, dtype=torch.uint8), ["x"])
    black_url = "data:image/png;base64," + image_to_png_base64(black.images[0])
    scoring_server.fail_when = lambda body: body["messages"][0]["content"][0]["image_url"]["url"] == black_url
    batch = ScoreBatch(torch.cat([images(1, 8, 8), black.images, images(1, 8, 8)]), ['"hello"'] * 3)
    jpeg = get_scorer_cls("jpeg_compressibility")()
    entries = [
        WeightedScorer("ocr", make_ocr(scoring_server.url, max_retries=0), 1.0, False),
        WeightedScorer("jpeg", jpeg, 1.0, True),
    ]
    result = asyncio.run(MultiReward(entries).score(batch))
    jpeg_scores = asyncio.run(jpeg.score(batch))
    assert result.per_scorer["ocr"] == [1.0, None, 1.0]
    assert result.rewards[1] == pytest.approx(jpeg_scores[1])
    assert result.rewards[0] == pytest.approx((1.0 + jpeg_scores[0]) / 2)


def test_ocr_keeps_at_most_max_concurrency_requests_in_flight(scoring_server):
    """The server holds each request until two are in flight: a client that sent them one at a time
    would break the barrier (HTTP 500 → error); the semaphore must never let a third one in."""
    scoring_server.reply_text = "x"
    scoring_server.barrier = threading.Barrier(2)
    batch = ScoreBatch(images(6), ['"x"'] * 6)
    scores = asyncio.run(make_ocr(scoring_server.url, max_concurrency=2, max_retries=0).score(batch))
    assert scores == [1.0] * 6
    assert scoring_server.max_inflight == 2


def test_ocr_timeout_is_retried_then_raised(scoring_server):
    scoring_server.hold = threading.Event()  # never answers while the test runs
    batch = ScoreBatch(images(1), ['"x"'])
    with pytest.raises(ScorerError, match="after 2 attempts") as info:
        asyncio.run(make_ocr(scoring_server.url, timeout_s=0.2, max_retries=1).score(batch))
    assert isinstance(info.value.__cause__, TimeoutError)
    assert len(scoring_server.wait_for_requests(2)) == 2
