"""Tiny random DETR object detector for the GenEval reference server (``examples/reward_servers/``).

A ``DetrForObjectDetection`` with a 2-stage ResNet backbone built from its config (no timm, nothing
downloaded) and 8 queries over four COCO class names, saved with its ``DetrImageProcessor``, so it
loads with ``AutoModelForObjectDetection`` / ``AutoImageProcessor`` like a real detector. The query
embeddings and both prediction heads are redrawn at a larger scale, so that boxes are not the
degenerate ones of the library's initial values; a random 1-layer decoder still gives nearly the
same box for every query (the wire test does not rely on more).
"""

from __future__ import annotations

import logging
from pathlib import Path

logger = logging.getLogger(__name__)

TINY_DETR_CLASSES = ("dog", "cat", "car", "bench")


def build_tiny_detr(out_dir: Path, seed: int = 0, dtype: str = "float32") -> Path:
    """Write a tiny random DETR (model + image processor) to ``out_dir``; the same seed gives the same files."""
    import torch
    from transformers import DetrConfig, DetrForObjectDetection, DetrImageProcessor, ResNetConfig

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    backbone = ResNetConfig(
        embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic", out_features=["stage2"]
    )
    config = DetrConfig(
        backbone_config=backbone,
        d_model=16,
        encoder_layers=1,
        decoder_layers=1,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        num_queries=8,
        id2label=dict(enumerate(TINY_DETR_CLASSES)),
        label2id={name: i for i, name in enumerate(TINY_DETR_CLASSES)},
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = DetrForObjectDetection(config).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.startswith(("model.query_position_embeddings", "class_labels_classifier", "bbox_predictor")):
                param.copy_(torch.randn(param.shape, generator=generator) * (1.0 if "query" in name else 0.5))
    model.to(getattr(torch, dtype)).save_pretrained(out_dir)
    DetrImageProcessor(size={"shortest_edge": 64, "longest_edge": 64}).save_pretrained(out_dir)
    logger.info("tiny DETR written to %s", out_dir)
    return out_dir
