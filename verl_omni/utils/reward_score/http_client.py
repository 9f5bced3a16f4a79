"""HTTP plumbing shared by the remote scorers (``ocr``, ``http``): retries, timeouts, concurrency.

A request is retried on connection/transport errors, timeouts, HTTP 429 and 5xx, with exponential backoff
(``backoff_s * 2**attempt``, capped at ``max_backoff_s``); other 4xx answers are not retried. After
``1 + max_retries`` failed attempts a :class:`ScorerError` is raised with the last cause chained.
"""

from __future__ import annotations

import asyncio
import base64
import io
import logging
import weakref
from dataclasses import dataclass
from typing import Any

import aiohttp
import torch
from PIL import Image
from verl.base_config import BaseConfig

from verl_omni.utils.reward_score.base import ScorerError

logger = logging.getLogger(__name__)


@dataclass
class HttpParams(BaseConfig):
    """Args:
    url (str): endpoint URL (required).
    timeout_s (float): total timeout of one attempt, seconds. Default 60.
    max_retries (int): retries after the first attempt. Default 3.
    backoff_s (float): first backoff, doubled at each retry. Default 1.
    max_backoff_s (float): backoff cap. Default 16.
    max_concurrency (int): requests in flight at once per scorer and event loop. Default 16.
    api_key (str | None): sent as ``Authorization: Bearer <api_key>`` when set.
    """

    url: str = ""
    timeout_s: float = 60.0
    max_retries: int = 3
    backoff_s: float = 1.0
    max_backoff_s: float = 16.0
    max_concurrency: int = 16
    api_key: str | None = None

    def __post_init__(self):
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"url must be an http(s) URL, got {self.url!r}")
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")
        if self.max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {self.max_retries}")
        if self.backoff_s < 0 or self.max_backoff_s < self.backoff_s:
            raise ValueError(f"backoff_s must be in [0, max_backoff_s], got {self.backoff_s} / {self.max_backoff_s}")
        if self.max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {self.max_concurrency}")


def image_to_png_base64(image: torch.Tensor) -> str:
    """Base64 of the PNG encoding of a uint8 ``[3, H, W]`` tensor."""
    buffer = io.BytesIO()
    Image.fromarray(image.permute(1, 2, 0).contiguous().numpy(), mode="RGB").save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


class _RetryableStatus(Exception):
    def __init__(self, status: int, body: str):
        super().__init__(f"HTTP {status}: {body[:200]}")


class HttpClient:
    """POSTs JSON with the retry policy of :class:`HttpParams`; one instance per scorer."""

    def __init__(self, params: HttpParams, scorer: str):
        self.params = params
        self.scorer = scorer
        # asyncio primitives bind to one event loop; a worker may run several loops over its life.
        self._semaphores: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def _semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if loop not in self._semaphores:
            self._semaphores[loop] = asyncio.Semaphore(self.params.max_concurrency)
        return self._semaphores[loop]

    async def post_json(self, url: str, payload: dict[str, Any]) -> Any:
        """POST ``payload`` to ``url`` and return the decoded JSON answer, retrying per the policy."""
        p = self.params
        headers = {"Authorization": f"Bearer {p.api_key}"} if p.api_key else None
        timeout = aiohttp.ClientTimeout(total=p.timeout_s)
        last_error: BaseException | None = None
        async with self._semaphore():
            for attempt in range(p.max_retries + 1):
                if attempt > 0:
                    await asyncio.sleep(min(p.backoff_s * 2 ** (attempt - 1), p.max_backoff_s))
                try:
                    return await self._post_once(url, payload, headers, timeout)
                except (TimeoutError, aiohttp.ClientError, _RetryableStatus) as e:
                    last_error = e
                    logger.warning(
                        "scorer %s: attempt %d/%d to %s failed: %r",
                        self.scorer,
                        attempt + 1,
                        p.max_retries + 1,
                        url,
                        e,
                    )
        raise ScorerError(
            f"scorer {self.scorer!r}: POST {url} failed after {p.max_retries + 1} attempts: {last_error!r}"
        ) from last_error

    @staticmethod
    async def _post_once(url, payload, headers, timeout) -> Any:
        async with aiohttp.ClientSession(timeout=timeout) as session:
            async with session.post(url, json=payload, headers=headers) as resp:
                if resp.status == 429 or resp.status >= 500:
                    raise _RetryableStatus(resp.status, await resp.text())
                if resp.status >= 400:
                    raise ScorerError(f"POST {url} answered HTTP {resp.status}: {(await resp.text())[:200]}")
                try:
                    return await resp.json(content_type=None)
                except ValueError as e:
                    raise ScorerError(f"POST {url} answered invalid JSON: {(await resp.text())[:200]!r}") from e
