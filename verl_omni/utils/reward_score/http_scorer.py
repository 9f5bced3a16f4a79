"""``http``: a generic client for a user's scoring service.

Request, ``POST <url>`` with JSON::

    {"prompts": ["...", ...], "targets": ["..." | null, ...], "images": ["<base64 PNG>", ...]}

Answer, HTTP 200 with JSON ``{"scores": [<float>, ...]}``, one finite number per image, in order.
Range: whatever the service returns. Retries, timeout and concurrency follow :class:`HttpParams`;
a batch larger than ``batch_size`` is sent as several requests.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import ClassVar

from verl_omni.utils.reward_score.base import ScoreBatch, Scorer, ScorerError
from verl_omni.utils.reward_score.http_client import HttpClient, HttpParams, image_to_png_base64
from verl_omni.utils.reward_score.registry import register_scorer

logger = logging.getLogger(__name__)


@dataclass
class HttpScorerParams(HttpParams):
    """Args (besides :class:`HttpParams`):
    batch_size (int): images per request. Default 16.
    """

    batch_size: int = 16

    def __post_init__(self):
        super().__post_init__()
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")


@register_scorer("http")
class HttpScorer(Scorer):
    """Scores from a user's HTTP service (schema in the module docstring). Range: the service's.

    Subclasses (``http_video``) change what a request carries by overriding :meth:`media_payload`.
    """

    params_cls = HttpScorerParams
    scorer_name: ClassVar[str] = "http"

    def __init__(self, params: HttpScorerParams):
        super().__init__(params)
        self.client = HttpClient(params, scorer=self.scorer_name)

    async def score(self, batch: ScoreBatch) -> list[float]:
        size = self.params.batch_size
        chunks = [range(start, min(start + size, len(batch))) for start in range(0, len(batch), size)]
        results = await asyncio.gather(*(self._score_chunk(batch, chunk) for chunk in chunks))
        return [score for chunk_scores in results for score in chunk_scores]

    def media_payload(self, batch: ScoreBatch, indices: range) -> dict:
        """The request's media entries for samples ``indices``: ``{"images": [<base64 PNG>, ...]}``."""
        return {"images": [image_to_png_base64(batch.images[i]) for i in indices]}

    async def _score_chunk(self, batch: ScoreBatch, indices: range) -> list[float]:
        targets = batch.targets or [None] * len(batch)
        payload = {
            "prompts": [batch.prompts[i] for i in indices],
            "targets": [targets[i] for i in indices],
            # encoding (PNG, mp4) is CPU work: off the event loop that serves the other requests
            **(await asyncio.to_thread(self.media_payload, batch, indices)),
        }
        answer = await self.client.post_json(self.params.url, payload)
        scores = answer.get("scores") if isinstance(answer, dict) else None
        if not isinstance(scores, list) or len(scores) != len(indices):
            raise ScorerError(
                f"scorer {self.scorer_name!r}: {self.params.url} must answer "
                f'{{"scores": [{len(indices)} numbers]}}, got {answer!r:.200}'
            )
        return scores
