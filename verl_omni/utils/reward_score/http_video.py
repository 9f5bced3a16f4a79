"""``http_video``: a client for a served video reward model (VideoAlign-style), one score per video.

Request, ``POST <url>`` with JSON (one request per ``batch_size`` videos)::

    {"prompts": ["...", ...], "targets": ["..." | null, ...], "format": "mp4", "fps": 8,
     "videos": ["<base64 mp4>", ...]}

or, with ``video_format: frames``, ``"videos": [["<base64 PNG>", ...], ...]`` (each video's frames in
order). Answer, HTTP 200 with JSON ``{"scores": [<float>, ...]}``, one finite number per video, in
order. Retries, timeout and concurrency follow :class:`HttpParams`, as for the ``http`` scorer.
"""

from __future__ import annotations

import base64
import logging
from dataclasses import dataclass

from verl_omni.utils.reward_score.base import ScoreBatch
from verl_omni.utils.reward_score.http_client import image_to_png_base64
from verl_omni.utils.reward_score.http_scorer import HttpScorer, HttpScorerParams
from verl_omni.utils.reward_score.registry import register_scorer

logger = logging.getLogger(__name__)

VIDEO_FORMATS = ("mp4", "frames")


@dataclass
class HttpVideoParams(HttpScorerParams):
    """Args (besides :class:`HttpScorerParams`; ``batch_size`` counts videos, default 4):
    video_format (str): ``mp4`` (an H.264 mp4 per video, base64) or ``frames`` (base64 PNGs). Default ``mp4``.
    fps (int): frame rate written into the mp4 and sent as ``fps``. Default 8.
    """

    batch_size: int = 4
    video_format: str = "mp4"
    fps: int = 8

    def __post_init__(self):
        super().__post_init__()
        if self.video_format not in VIDEO_FORMATS:
            raise ValueError(f"video_format must be one of {VIDEO_FORMATS}, got {self.video_format!r}")
        if self.fps < 1:
            raise ValueError(f"fps must be >= 1, got {self.fps}")


@register_scorer("http_video")
class HttpVideoScorer(HttpScorer):
    """Scores whole videos from a user's HTTP service (schema in the module docstring). Range: the service's."""

    params_cls = HttpVideoParams
    scorer_name = "http_video"
    video_input = True

    def media_payload(self, batch: ScoreBatch, indices: range) -> dict:
        p = self.params
        if p.video_format == "mp4":
            from verl_omni.utils.video import encode_mp4

            videos = [base64.b64encode(encode_mp4(batch.images[i], p.fps)).decode("ascii") for i in indices]
        else:
            videos = [[image_to_png_base64(frame) for frame in batch.images[i]] for i in indices]
        return {"format": p.video_format, "fps": p.fps, "videos": videos}
