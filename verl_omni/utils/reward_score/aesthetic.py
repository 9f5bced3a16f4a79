"""``aesthetic``: a linear head on CLIP image embeddings, both from a local directory.

The directory holds the CLIP model and processor (as for ``clip_score``) and a head file,
``aesthetic_head.safetensors`` by default, with ``weight`` ``[1, D]`` and ``bias`` ``[1]`` applied
to the unit-norm CLIP image embedding (``D`` = the model's projection dim).
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass

import torch

from verl_omni.utils.reward_score.base import ScoreBatch, ThreadedScorer
from verl_omni.utils.reward_score.clip import ClipParams, load_clip
from verl_omni.utils.reward_score.registry import register_scorer

logger = logging.getLogger(__name__)

_HEADS: dict[str, torch.nn.Linear] = {}
_HEADS_LOCK = threading.Lock()


@dataclass
class AestheticParams(ClipParams):
    """Args (besides :class:`ClipParams`):
    head_file (str): head file name inside ``model_path`` (or an absolute path).
    """

    head_file: str = "aesthetic_head.safetensors"


def load_head(path: str, device: str) -> torch.nn.Linear:
    """The linear head stored at ``path`` (``weight`` [1, D], ``bias`` [1]), loaded once per process."""
    from safetensors.torch import load_file

    with _HEADS_LOCK:
        if path not in _HEADS:
            tensors = load_file(path)
            weight, bias = tensors["weight"], tensors["bias"]
            if weight.ndim != 2 or weight.shape[0] != 1 or bias.shape != (1,):
                raise ValueError(
                    f"aesthetic head {path}: need weight [1, D] and bias [1], got "
                    f"{tuple(weight.shape)} and {tuple(bias.shape)}"
                )
            head = torch.nn.Linear(weight.shape[1], 1)
            head.load_state_dict({"weight": weight, "bias": bias})
            _HEADS[path] = head.to(device).eval()
        return _HEADS[path]


@register_scorer("aesthetic")
class AestheticScorer(ThreadedScorer):
    """Linear aesthetic head on the CLIP image embedding. Range: unbounded (the head's output)."""

    params_cls = AestheticParams

    @torch.no_grad()
    def score_sync(self, batch: ScoreBatch) -> list[float]:
        model, processor = load_clip(self.params.model_path, self.params.device)
        head = load_head(os.path.join(self.params.model_path, self.params.head_file), self.params.device)
        scores: list[float] = []
        for start in range(0, len(batch), self.params.batch_size):
            images = list(batch.images[start : start + self.params.batch_size])
            pixels = processor(images=images, return_tensors="pt")["pixel_values"].to(self.params.device)
            embedding = model.get_image_features(pixel_values=pixels).pooler_output.float()
            scores.extend(head(torch.nn.functional.normalize(embedding, dim=-1)).squeeze(-1).cpu().tolist())
        return scores
