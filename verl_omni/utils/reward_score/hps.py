"""``hpsv2``: Human Preference Score v2.1, an OpenCLIP ViT-H/14 fine-tuned on human preferences.

The score is the cosine similarity of the unit-norm OpenCLIP image and prompt embeddings (HPSv2's
``img_score.score`` multiplies the two feature matrices without the logit scale), so the range is
[-1, 1]; the real HPSv2.1 gives about 0.2-0.35 on generated images.

Checkpoint directory (``params.model_path``): ``HPS_v2.1_compressed.pt`` as published by the
authors (a dict with ``state_dict`` for OpenCLIP's ``ViT-H-14``), and optionally
``open_clip_config.json`` (``{"model_cfg": {...}}``, OpenCLIP's own format) for another
architecture of the same family (the tiny test model). The tokenizer is OpenCLIP's bundled BPE.
Needs ``open_clip_torch`` (the ``rewards`` extra).

Preprocessing follows HPSv2's evaluation transform: the longer side is resized to the model's
input size (bicubic, antialiased), the shorter one padded with zeros on both sides, then the
OpenAI CLIP mean/std normalization.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from dataclasses import dataclass

import torch
from verl.base_config import BaseConfig

from verl_omni.utils.reward_score.base import ScoreBatch, ThreadedScorer
from verl_omni.utils.reward_score.local_files import import_extra, require_dir, require_file
from verl_omni.utils.reward_score.registry import register_scorer

logger = logging.getLogger(__name__)

HPS_ARCH = "ViT-H-14"
CONFIG_FILE = "open_clip_config.json"
_CACHE: dict[tuple[str, str, str], tuple[torch.nn.Module, object]] = {}
_CACHE_LOCK = threading.Lock()


@dataclass
class HpsParams(BaseConfig):
    """Args:
    model_path (str): local directory with the HPSv2.1 checkpoint (required).
    checkpoint_file (str): checkpoint file name inside ``model_path``. Default ``HPS_v2.1_compressed.pt``.
    batch_size (int): images per forward pass. Default 16.
    device (str): torch device of the model. Default ``"cpu"``.
    """

    model_path: str = ""
    checkpoint_file: str = "HPS_v2.1_compressed.pt"
    batch_size: int = 16
    device: str = "cpu"

    def __post_init__(self):
        if not self.model_path:
            raise ValueError("model_path must name a local directory holding HPS_v2.1_compressed.pt, got ''")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")


def load_hps(params: HpsParams) -> tuple[torch.nn.Module, object]:
    """``(model, tokenizer)`` for ``params``, built and loaded once per process, file and device."""
    key = (params.model_path, params.checkpoint_file, params.device)
    with _CACHE_LOCK:
        if key not in _CACHE:
            _CACHE[key] = _build_hps(params)
        return _CACHE[key]


def _build_hps(params: HpsParams) -> tuple[torch.nn.Module, object]:
    directory = require_dir(params.model_path, "model_path", "the HPSv2.1 checkpoint (HPS_v2.1_compressed.pt)")
    checkpoint = require_file(
        directory, params.checkpoint_file, "model_path", "HPSv2.1's checkpoint (xswu/HPSv2 on the Hugging Face Hub)"
    )
    open_clip = import_extra("open_clip", "hpsv2")
    config_path = os.path.join(directory, CONFIG_FILE)
    if os.path.isfile(config_path):
        with open(config_path) as f:
            model_cfg = json.load(f)["model_cfg"]
    else:
        model_cfg = open_clip.get_model_config(HPS_ARCH)
    logger.info("loading HPSv2 scorer from %s on %s", checkpoint, params.device)
    model = open_clip.model.CLIP(**model_cfg)
    state = torch.load(checkpoint, map_location="cpu", weights_only=True)
    model.load_state_dict(state.get("state_dict", state))
    tokenizer = open_clip.tokenizer.SimpleTokenizer(context_length=model_cfg["text_cfg"]["context_length"])
    return model.to(params.device).eval(), tokenizer


def hps_preprocess(images: torch.Tensor, size: int) -> torch.Tensor:
    """uint8 ``[B, 3, H, W]`` → normalized float ``[B, 3, size, size]`` (resize longer side, zero pad)."""
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms import functional as F

    from verl_omni.utils.reward_score.clip_constants import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD

    out = []
    for image in images:
        x = image.float() / 255.0
        height, width = x.shape[1:]
        scale = size / max(height, width)
        new_h, new_w = round(height * scale), round(width * scale)
        if scale != 1.0:
            x = F.resize(x, [new_h, new_w], InterpolationMode.BICUBIC, antialias=True)
        # HPSv2 pads only when it resized; padding here too keeps a batch square (the model needs it)
        pad_h, pad_w = size - new_h, size - new_w
        x = F.pad(x, [pad_w // 2, pad_h // 2, pad_w - pad_w // 2, pad_h - pad_h // 2], fill=0)
        out.append(F.normalize(x, OPENAI_CLIP_MEAN, OPENAI_CLIP_STD))
    return torch.stack(out)


@register_scorer("hpsv2")
class HpsScorer(ThreadedScorer):
    """HPSv2.1: cosine of the OpenCLIP image and prompt embeddings. Range [-1, 1] (~0.2-0.35 real)."""

    params_cls = HpsParams
    extra = "rewards"

    @torch.no_grad()
    def score_sync(self, batch: ScoreBatch) -> list[float]:
        model, tokenizer = load_hps(self.params)
        size = model.visual.image_size
        size = size[0] if isinstance(size, tuple | list) else size
        scores: list[float] = []
        for start in range(0, len(batch), self.params.batch_size):
            stop = start + self.params.batch_size
            pixels = hps_preprocess(batch.images[start:stop], size).to(self.params.device)
            text = tokenizer(batch.prompts[start:stop]).to(self.params.device)
            image_emb = model.encode_image(pixels, normalize=True).float()
            text_emb = model.encode_text(text, normalize=True).float()
            scores.extend((image_emb * text_emb).sum(dim=-1).cpu().tolist())
        return scores
