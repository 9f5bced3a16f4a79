"""Tiny random Qwen-Image-Edit Plus: Qwen-Image-Edit's tiny components under ``QwenImageEditPlusPipeline``."""

from __future__ import annotations

from pathlib import Path


def build_tiny_qwen_image_edit_plus(out_dir: Path, seed: int = 0, dtype: str = "float32") -> Path:
    """Write a tiny random Qwen-Image-Edit Plus pipeline to ``out_dir``; loadable with
    ``QwenImageEditPlusPipeline.from_pretrained(out_dir)``."""
    from diffusers import QwenImageEditPlusPipeline

    from verl_omni.pipelines.qwen_image_edit.tiny_model import build_tiny_qwen_image_edit

    return build_tiny_qwen_image_edit(out_dir, seed, dtype, pipeline_class=QwenImageEditPlusPipeline)
