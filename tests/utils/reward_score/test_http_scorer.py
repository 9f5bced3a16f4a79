"""The generic ``http`` scorer against a real local scoring service (tests/utils/conftest.py)."""

import asyncio
import base64
import io

import numpy as np
import pytest
import torch
from PIL import Image

from verl_omni.utils.reward_score import ScoreBatch, ScorerError, build_params, get_scorer_cls


def make_http(url, **overrides):
    cls = get_scorer_cls("http")
    params = {"url": url + "/score", "max_retries": 1, "backoff_s": 0.01, "max_backoff_s": 0.02, **overrides}
    return cls(build_params(cls.params_cls, params, "test"))


def mean_pixel_service(body):
    """Score = mean pixel / 255 of the decoded PNG, plus 1 when the target equals the prompt."""
    scores = []
    for image, prompt, target in zip(body["images"], body["prompts"], body["targets"], strict=True):
        pixels = np.array(Image.open(io.BytesIO(base64.b64decode(image))))
        scores.append(float(pixels.mean()) / 255 + (1.0 if target == prompt else 0.0))
    return {"scores": scores}


def test_http_scorer_follows_the_documented_schema_in_chunks(scoring_server):
    scoring_server.scores_from_payload = mean_pixel_service
    images = torch.stack([torch.full((3, 8, 8), v, dtype=torch.uint8) for v in (0, 51, 102, 255, 204)])
    batch = ScoreBatch(images, ["a", "b", "c", "d", "e"], targets=["a", None, "x", "d", None])
    scores = asyncio.run(make_http(scoring_server.url, batch_size=2).score(batch))
    assert scores == pytest.approx([1.0, 0.2, 0.4, 2.0, 0.8])
    # chunks are sent concurrently, so they may arrive in any order
    chunks = sorted((r["prompts"], r["targets"], len(r["images"])) for r in scoring_server.requests)
    assert chunks == [(["a", "b"], ["a", None], 2), (["c", "d"], ["x", "d"], 2), (["e"], [None], 1)]


def test_http_scorer_rejects_a_malformed_answer(scoring_server):
    scoring_server.scores_from_payload = lambda body: {"scores": [0.5]}
    batch = ScoreBatch(torch.zeros(2, 3, 4, 4, dtype=torch.uint8), ["a", "b"])
    with pytest.raises(ScorerError, match=r"must answer \{\"scores\": \[2 numbers\]\}"):
        asyncio.run(make_http(scoring_server.url).score(batch))


def test_http_scorer_does_not_retry_client_errors(scoring_server):
    scoring_server.status = 400
    batch = ScoreBatch(torch.zeros(1, 3, 4, 4, dtype=torch.uint8), ["a"])
    with pytest.raises(ScorerError, match="HTTP 400"):
        asyncio.run(make_http(scoring_server.url, max_retries=3).score(batch))
    assert len(scoring_server.requests) == 1
