"""Tiny random HunyuanVideo-1.5 image-to-video: the ``hunyuan_video_1_5`` package's I2V builder.

A model package's own builder is named after the package (``hunyuan_video_1_5``, text to video); the image-to-video
checkpoint of the same package is built under its own name here
(``python -m verl_omni.utils.tiny_models hunyuan_video_1_5_i2v --out DIR``), as ``wan2_2_i2v_a14b`` names Wan's.
"""

from __future__ import annotations

from pathlib import Path


def build_tiny_hunyuan_video_1_5_i2v(out_dir: Path, seed: int = 0, dtype: str = "float32") -> Path:
    """Write a tiny random HunyuanVideo-1.5 I2V (``HunyuanVideo15ImageToVideoPipeline``, SigLIP image encoder)."""
    from verl_omni.pipelines.hunyuan_video_1_5.tiny_model import build_tiny_i2v

    return build_tiny_i2v(out_dir, seed, dtype)
