"""CLIP-based scorers (``pickscore``, ``clip_score``) from a local model directory.

The directory is what ``transformers.CLIPModel.from_pretrained`` and ``CLIPProcessor.from_pretrained``
load (e.g. a PickScore checkpoint with its processor saved beside it). Models are loaded once per
process and device and shared by every scorer instance that names the same directory.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

import torch
from verl.base_config import BaseConfig

from verl_omni.utils.reward_score.base import ScoreBatch, ThreadedScorer
from verl_omni.utils.reward_score.registry import register_scorer

logger = logging.getLogger(__name__)

_CACHE: dict[tuple[str, str], tuple[object, object]] = {}
_CACHE_LOCK = threading.Lock()


@dataclass
class ClipParams(BaseConfig):
    """Args:
    model_path (str): local directory with the CLIP model and processor (required).
    batch_size (int): images per forward pass. Default 32.
    device (str): torch device for the model. Default ``"cpu"``.
    """

    model_path: str = ""
    batch_size: int = 32
    device: str = "cpu"

    def __post_init__(self):
        if not self.model_path:
            raise ValueError("model_path must name a local CLIP directory, got ''")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")


def load_clip(model_path: str, device: str):
    """Return ``(model, processor)`` for ``model_path`` on ``device``, loading it on first use."""
    from transformers import CLIPModel, CLIPProcessor

    key = (model_path, device)
    with _CACHE_LOCK:
        if key not in _CACHE:
            logger.info("loading CLIP scorer model from %s on %s", model_path, device)
            model = CLIPModel.from_pretrained(model_path).to(device).eval()
            _CACHE[key] = (model, CLIPProcessor.from_pretrained(model_path))
        return _CACHE[key]


class ClipScorerBase(ThreadedScorer):
    """Batched CLIP embeddings; subclasses turn them into scores in :meth:`scores_from_embeddings`."""

    params_cls = ClipParams

    @torch.no_grad()
    def score_sync(self, batch: ScoreBatch) -> list[float]:
        model, processor = load_clip(self.params.model_path, self.params.device)
        scores: list[float] = []
        for start in range(0, len(batch), self.params.batch_size):
            stop = start + self.params.batch_size
            images = list(batch.images[start:stop])
            inputs = processor(
                text=batch.prompts[start:stop], images=images, return_tensors="pt", padding=True, truncation=True
            ).to(self.params.device)
            image_emb = model.get_image_features(pixel_values=inputs["pixel_values"]).pooler_output
            text_emb = model.get_text_features(
                input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"]
            ).pooler_output
            image_emb = torch.nn.functional.normalize(image_emb.float(), dim=-1)
            text_emb = torch.nn.functional.normalize(text_emb.float(), dim=-1)
            scores.extend(self.scores_from_embeddings(model, image_emb, text_emb).cpu().tolist())
        return scores

    def scores_from_embeddings(self, model, image_emb: torch.Tensor, text_emb: torch.Tensor) -> torch.Tensor:
        """Per-sample scores from unit-norm image and text embeddings ``[B, D]``."""
        return (image_emb * text_emb).sum(dim=-1)


@register_scorer("clip_score")
class ClipScorer(ClipScorerBase):
    """Cosine similarity of the CLIP image and prompt embeddings. Range [-1, 1]."""


@register_scorer("pickscore")
class PickScorer(ClipScorerBase):
    """PickScore: ``exp(logit_scale)`` × cosine similarity (a PickScore checkpoint scales by 100).

    Range [−exp(logit_scale), exp(logit_scale)], about [15, 25] in practice for the real model.
    """

    def scores_from_embeddings(self, model, image_emb: torch.Tensor, text_emb: torch.Tensor) -> torch.Tensor:
        return model.logit_scale.exp().float() * super().scores_from_embeddings(model, image_emb, text_emb)
