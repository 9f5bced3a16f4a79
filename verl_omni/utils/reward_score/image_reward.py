"""``image_reward``: ImageReward (Xu et al. 2023), a BLIP image-text encoder with a regression head.

Architecture (the published ``THUDM/ImageReward`` checkpoint): BLIP's ViT (ViT-L/16 at 224 pixels)
encodes the image; BLIP's BERT text encoder reads the prompt with cross-attention to every image
token; an MLP (``d → 1024 → 128 → 64 → 16 → 1``, linear layers only) maps the ``[CLS]`` state to
a raw reward, standardized with the authors' constants: ``(raw − 0.16717362830052426) /
1.0333394966054072``. Range: unbounded, about [−2, 2] for the real model.

We run the two encoders on transformers' BLIP modules (``BlipVisionModel``, ``BlipTextModel``,
the same layers as BLIP's own code); the published state dict is renamed to them on load
(:func:`convert_image_reward_state_dict`). Checkpoint directory (``params.model_path``):

- ``ImageReward.pt``: the published state dict;
- ``med_config.json``: the published BERT config of the text encoder;
- ``tokenizer/``: a ``bert-base-uncased`` tokenizer (``BertTokenizer.save_pretrained``), which
  the authors' code loads from the Hub;
- ``vision_config.json`` (optional): ``image_size``, ``patch_size``, ``hidden_size``,
  ``num_hidden_layers``, ``num_attention_heads``, ``intermediate_size`` of another ViT (the tiny
  test model); absent means ViT-L/16 at 224.

Preprocessing is the authors': resize the shorter side to the ViT's input size (bicubic), centre
crop, OpenAI CLIP mean/std; prompts are padded/truncated to 35 tokens.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from dataclasses import dataclass

import torch
from verl.base_config import BaseConfig

from verl_omni.utils.reward_score.base import ScoreBatch, ThreadedScorer
from verl_omni.utils.reward_score.clip_constants import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD
from verl_omni.utils.reward_score.local_files import require_dir, require_file
from verl_omni.utils.reward_score.registry import register_scorer

logger = logging.getLogger(__name__)

CHECKPOINT_FILE = "ImageReward.pt"
REWARD_MEAN = 0.16717362830052426
REWARD_STD = 1.0333394966054072
PROMPT_TOKENS = 35
# BLIP's ViT-L as ImageReward builds it (create_vit('large', 224)): patch 16, 24 blocks, mlp ratio 4
VIT_LARGE = dict(
    image_size=224,
    patch_size=16,
    hidden_size=1024,
    num_hidden_layers=24,
    num_attention_heads=16,
    intermediate_size=4096,
)
_CACHE: dict[tuple[str, str], ImageRewardModel] = {}
_CACHE_LOCK = threading.Lock()


@dataclass
class ImageRewardParams(BaseConfig):
    """Args:
    model_path (str): local directory with ``ImageReward.pt``, ``med_config.json`` and ``tokenizer/`` (required).
    batch_size (int): images per forward pass. Default 16.
    device (str): torch device of the model. Default ``"cpu"``.
    """

    model_path: str = ""
    batch_size: int = 16
    device: str = "cpu"

    def __post_init__(self):
        if not self.model_path:
            raise ValueError("model_path must name a local ImageReward directory, got ''")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")


def reward_head(width: int) -> torch.nn.Sequential:
    """ImageReward's MLP: linear layers only, dropouts at the published indices (keys ``layers.{0,2,4,6,7}``)."""
    nn = torch.nn
    return nn.Sequential(
        nn.Linear(width, 1024),
        nn.Dropout(0.2),
        nn.Linear(1024, 128),
        nn.Dropout(0.2),
        nn.Linear(128, 64),
        nn.Dropout(0.1),
        nn.Linear(64, 16),
        nn.Linear(16, 1),
    )


_VISION_RENAMES = [
    (r"^cls_token$", "embeddings.class_embedding"),
    (r"^pos_embed$", "embeddings.position_embedding"),
    (r"^patch_embed\.proj\.", "embeddings.patch_embedding."),
    (r"^blocks\.(\d+)\.norm1\.", r"encoder.layers.\1.layer_norm1."),
    (r"^blocks\.(\d+)\.norm2\.", r"encoder.layers.\1.layer_norm2."),
    (r"^blocks\.(\d+)\.attn\.qkv\.", r"encoder.layers.\1.self_attn.qkv."),
    (r"^blocks\.(\d+)\.attn\.proj\.", r"encoder.layers.\1.self_attn.projection."),
    (r"^blocks\.(\d+)\.mlp\.", r"encoder.layers.\1.mlp."),
    (r"^norm\.", "post_layernorm."),
]


def convert_image_reward_state_dict(state: dict[str, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
    """Split the published state dict into ``vision`` / ``text`` / ``head`` dicts under our module names.

    BLIP's ViT names (timm's) become ``BlipVisionModel``'s; BLIP's BERT already uses the names of
    ``BlipTextModel`` (a port of it); the MLP keeps its indices. Other entries (BLIP's projection
    and matching heads, buffers) are not used by the score and are dropped.
    """
    out: dict[str, dict[str, torch.Tensor]] = {"vision": {}, "text": {}, "head": {}}
    for key, value in state.items():
        if key.startswith("blip.visual_encoder."):
            name = key[len("blip.visual_encoder.") :]
            for pattern, repl in _VISION_RENAMES:
                name, hits = re.subn(pattern, repl, name)
                if hits:
                    out["vision"][name] = value
                    break
        elif key.startswith("blip.text_encoder.") and not key.endswith("position_ids"):
            out["text"][key[len("blip.text_encoder.") :]] = value
        elif key.startswith("mlp.layers."):
            out["head"][key[len("mlp.layers.") :]] = value
    return out


class ImageRewardModel(torch.nn.Module):
    """BLIP vision + text encoders and the reward head, built from a checkpoint directory's configs."""

    def __init__(self, vision: dict, med: dict):
        super().__init__()
        from transformers import BlipTextConfig, BlipVisionConfig
        from transformers.models.blip.modeling_blip import BlipVisionModel
        from transformers.models.blip.modeling_blip_text import BlipTextModel

        # BLIP's ViT: exact GELU, LayerNorm eps 1e-6, qkv bias (vit.py defaults)
        self.vision = BlipVisionModel(BlipVisionConfig(hidden_act="gelu", layer_norm_eps=1e-6, **vision))
        text_config = BlipTextConfig(
            vocab_size=med["vocab_size"],
            hidden_size=med["hidden_size"],
            encoder_hidden_size=vision["hidden_size"],
            intermediate_size=med["intermediate_size"],
            num_hidden_layers=med["num_hidden_layers"],
            num_attention_heads=med["num_attention_heads"],
            max_position_embeddings=med["max_position_embeddings"],
            hidden_act=med.get("hidden_act", "gelu"),
            layer_norm_eps=med.get("layer_norm_eps", 1e-12),
            pad_token_id=med.get("pad_token_id", 0),
            bos_token_id=None,
            eos_token_id=None,
            sep_token_id=None,
            # the cross-attention layers exist only in decoder configs; the forward runs bidirectionally
            is_decoder=True,
        )
        self.text = BlipTextModel(text_config, add_pooling_layer=False)
        self.head = reward_head(med["hidden_size"])
        self.image_size = vision["image_size"]

    def load_published(self, state: dict[str, torch.Tensor], path: str) -> None:
        """Load the published layout; a missing or misshapen tensor is an error naming ``path``."""
        parts = convert_image_reward_state_dict(state)
        for name, module in (("vision", self.vision), ("text", self.text), ("head", self.head)):
            try:
                module.load_state_dict(parts[name], strict=True)
            except RuntimeError as e:
                raise ValueError(f"{path}: the {name} tensors do not match the configured architecture: {e}") from e

    def forward(self, pixels: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Standardized rewards ``[B]`` for normalized pixels ``[B, 3, S, S]`` and tokenized prompts."""
        image_states = self.vision(pixel_values=pixels).last_hidden_state
        image_mask = torch.ones(image_states.shape[:-1], dtype=torch.long, device=image_states.device)
        text_states = self.text(
            input_ids=input_ids,
            attention_mask=attention_mask,
            encoder_hidden_states=image_states,
            encoder_attention_mask=image_mask,
            is_decoder=False,
        ).last_hidden_state
        raw = self.head(text_states[:, 0, :].float()).squeeze(-1)
        return (raw - REWARD_MEAN) / REWARD_STD


def load_image_reward(model_path: str, device: str) -> tuple[ImageRewardModel, object]:
    """``(model, tokenizer)`` from ``model_path``, loaded once per process and device."""
    key = (model_path, device)
    with _CACHE_LOCK:
        if key not in _CACHE:
            _CACHE[key] = _build_image_reward(model_path, device)
        return _CACHE[key]


def _build_image_reward(model_path: str, device: str) -> tuple[ImageRewardModel, object]:
    from transformers import BertTokenizer

    what = "ImageReward.pt, med_config.json (THUDM/ImageReward) and tokenizer/ (bert-base-uncased)"
    directory = require_dir(model_path, "model_path", what)
    checkpoint = require_file(directory, CHECKPOINT_FILE, "model_path", "ImageReward's state dict (THUDM/ImageReward)")
    with open(require_file(directory, "med_config.json", "model_path", "ImageReward's med_config.json")) as f:
        med = json.load(f)
    vision = dict(VIT_LARGE)
    vision_path = os.path.join(directory, "vision_config.json")
    if os.path.isfile(vision_path):
        with open(vision_path) as f:
            vision.update(json.load(f))
    tokenizer_dir = os.path.join(directory, "tokenizer")
    require_file(tokenizer_dir, "vocab.txt", "model_path", "a bert-base-uncased tokenizer saved in tokenizer/")
    logger.info("loading ImageReward scorer from %s on %s", checkpoint, device)
    model = ImageRewardModel(vision, med)
    model.load_published(torch.load(checkpoint, map_location="cpu", weights_only=True), checkpoint)
    return model.to(device).eval(), BertTokenizer.from_pretrained(tokenizer_dir)


def image_reward_preprocess(images: torch.Tensor, size: int) -> torch.Tensor:
    """uint8 ``[B, 3, H, W]`` → normalized ``[B, 3, size, size]``, the authors' transform on PIL images."""
    from PIL import Image
    from torchvision import transforms as T

    transform = T.Compose(
        [
            T.Resize(size, interpolation=T.InterpolationMode.BICUBIC),
            T.CenterCrop(size),
            T.ToTensor(),
            T.Normalize(OPENAI_CLIP_MEAN, OPENAI_CLIP_STD),
        ]
    )
    return torch.stack([transform(Image.fromarray(im.permute(1, 2, 0).contiguous().numpy())) for im in images])


@register_scorer("image_reward")
class ImageRewardScorer(ThreadedScorer):
    """ImageReward: BLIP cross-attention features → MLP, standardized. Range unbounded (~[−2, 2] real)."""

    params_cls = ImageRewardParams

    @torch.no_grad()
    def score_sync(self, batch: ScoreBatch) -> list[float]:
        model, tokenizer = load_image_reward(self.params.model_path, self.params.device)
        scores: list[float] = []
        for start in range(0, len(batch), self.params.batch_size):
            stop = start + self.params.batch_size
            pixels = image_reward_preprocess(batch.images[start:stop], model.image_size).to(self.params.device)
            tokens = tokenizer(
                batch.prompts[start:stop],
                padding="max_length",
                truncation=True,
                max_length=PROMPT_TOKENS,
                return_tensors="pt",
            ).to(self.params.device)
            scores.extend(model(pixels, tokens["input_ids"], tokens["attention_mask"]).cpu().tolist())
        return scores
