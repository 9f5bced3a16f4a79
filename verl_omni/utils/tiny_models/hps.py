"""Tiny random HPSv2 checkpoint: OpenCLIP's ``CLIP`` class at small widths, in HPSv2's file layout.

The directory holds ``open_clip_config.json`` (OpenCLIP's ``{"model_cfg": ...}`` format, here a
ViT of the ViT-H-14 family at 32 pixels and 2 layers) and ``HPS_v2.1_compressed.pt`` (``{"state_dict":
...}``, as the authors publish it; tensors drawn by :mod:`.seeded`), so the ``hpsv2`` scorer loads it by the same code as the real
one. The text vocabulary keeps OpenCLIP's 49408 tokens: the tokenizer is OpenCLIP's bundled BPE.
Needs ``open_clip_torch`` (the ``rewards`` extra).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

logger = logging.getLogger(__name__)

TINY_HPS_CFG = {
    "embed_dim": 16,
    "vision_cfg": {"image_size": 32, "layers": 2, "width": 32, "head_width": 16, "patch_size": 8},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 2},
}


def build_tiny_hps(out_dir: Path, seed: int = 0, dtype: str = "float32") -> Path:
    """Write a tiny random HPSv2 checkpoint to ``out_dir``; the same seed gives the same weights."""
    import torch

    from verl_omni.utils.reward_score.local_files import import_extra
    from verl_omni.utils.tiny_models.seeded import seeded_state_dict

    open_clip = import_extra("open_clip", "hpsv2")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    shapes = {k: tuple(v.shape) for k, v in open_clip.model.CLIP(**TINY_HPS_CFG).state_dict().items()}
    state = seeded_state_dict(shapes, seed, getattr(torch, dtype))
    torch.save({"state_dict": state}, out_dir / "HPS_v2.1_compressed.pt")
    (out_dir / "open_clip_config.json").write_text(json.dumps({"model_cfg": TINY_HPS_CFG}, indent=2))
    logger.info("tiny HPSv2 written to %s", out_dir)
    return out_dir
