"""``temporal_consistency``: how little a video changes from one (kept) frame to the next.

For frames ``x_0 .. x_{F-1}`` (after the entry's ``frame_stride``), with ``features``:

* ``pixels`` (default, no model): ``1 − mean_t mean|x_{t+1} − x_t| / 255``, the mean absolute
  pixel difference of consecutive frames over all pixels and channels. Range [0, 1]; 1 = a still video.
* ``clip``: ``mean_t cos(e_t, e_{t+1})`` of consecutive frames' unit CLIP image embeddings
  (a CLIP directory as for ``clip_score``). Range [−1, 1]; robust to small shifts that the pixel
  measure punishes.

A still video scores highest, so use it as a regularizer beside a quality or alignment reward,
never alone. A video needs at least two kept frames.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from verl.base_config import BaseConfig

from verl_omni.utils.reward_score.base import ScoreBatch, ThreadedScorer
from verl_omni.utils.reward_score.registry import register_scorer

logger = logging.getLogger(__name__)

FEATURES = ("pixels", "clip")


@dataclass
class TemporalParams(BaseConfig):
    """Args:
    features (str): ``pixels`` (mean absolute difference) or ``clip`` (embedding cosine). Default ``pixels``.
    model_path (str): local CLIP directory; required with ``features: clip``.
    batch_size (int): frames per CLIP forward pass. Default 32.
    device (str): torch device for the CLIP model. Default ``"cpu"``.
    """

    features: str = "pixels"
    model_path: str = ""
    batch_size: int = 32
    device: str = "cpu"

    def __post_init__(self):
        if self.features not in FEATURES:
            raise ValueError(f"features must be one of {FEATURES}, got {self.features!r}")
        if self.features == "clip" and not self.model_path:
            raise ValueError("model_path must name a local CLIP directory when features is 'clip', got ''")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")


def pixel_consistency(video: torch.Tensor) -> float:
    """``1 − mean |x_{t+1} − x_t| / 255`` over consecutive frames of uint8 ``[F, 3, H, W]``."""
    frames = video.float()
    return 1.0 - (frames[1:] - frames[:-1]).abs().mean().item() / 255.0


@register_scorer("temporal_consistency")
class TemporalConsistencyScorer(ThreadedScorer):
    """Consecutive-frame similarity of a video (definition in the module docstring). Range [0, 1] or [−1, 1]."""

    params_cls = TemporalParams
    video_input = True

    def score_sync(self, batch: ScoreBatch) -> list[float]:
        frames = batch.images.shape[1]
        if frames < 2:
            raise ValueError(
                f"scorer 'temporal_consistency' needs videos of at least 2 frames (after frame_stride), got {frames}"
            )
        if self.params.features == "pixels":
            return [pixel_consistency(video) for video in batch.images]
        return [self._clip_consistency(video) for video in batch.images]

    @torch.no_grad()
    def _clip_consistency(self, video: torch.Tensor) -> float:
        from verl_omni.utils.reward_score.clip import load_clip

        model, processor = load_clip(self.params.model_path, self.params.device)
        embeddings = []
        for start in range(0, video.shape[0], self.params.batch_size):
            frames = list(video[start : start + self.params.batch_size])
            pixels = processor(images=frames, return_tensors="pt")["pixel_values"].to(self.params.device)
            embeddings.append(model.get_image_features(pixel_values=pixels).pooler_output.float())
        unit = torch.nn.functional.normalize(torch.cat(embeddings), dim=-1)
        return (unit[1:] * unit[:-1]).sum(dim=-1).mean().item()
