"""JPEG (in)compressibility: a model-free reward for image complexity (CPU only)."""

from __future__ import annotations

import io
import logging
from dataclasses import dataclass

from PIL import Image
from verl.base_config import BaseConfig

from verl_omni.utils.reward_score.base import ScoreBatch, ThreadedScorer
from verl_omni.utils.reward_score.registry import register_scorer

logger = logging.getLogger(__name__)


@dataclass
class JpegParams(BaseConfig):
    """Args:
    quality (int): JPEG quality used for the encoding, 1..95. Default 95.
    """

    quality: int = 95

    def __post_init__(self):
        if not 1 <= self.quality <= 95:
            raise ValueError(f"quality must be in 1..95, got {self.quality}")


def jpeg_size_ratio(image, quality: int) -> float:
    """Size of the JPEG encoding of a uint8 ``[3, H, W]`` tensor divided by its raw size ``3*H*W``."""
    array = image.permute(1, 2, 0).contiguous().numpy()
    buffer = io.BytesIO()
    Image.fromarray(array, mode="RGB").save(buffer, format="JPEG", quality=quality)
    return buffer.tell() / array.size


@register_scorer("jpeg_incompressibility")
class JpegIncompressibilityScorer(ThreadedScorer):
    """JPEG size / raw size. Range (0, ~1]: near 0 for flat images, highest for noise."""

    params_cls = JpegParams
    sign = 1.0

    def score_sync(self, batch: ScoreBatch) -> list[float]:
        return [self.sign * jpeg_size_ratio(image, self.params.quality) for image in batch.images]


@register_scorer("jpeg_compressibility")
class JpegCompressibilityScorer(JpegIncompressibilityScorer):
    """−(JPEG size / raw size). Range [~−1, 0): highest (near 0) for flat images."""

    sign = -1.0
