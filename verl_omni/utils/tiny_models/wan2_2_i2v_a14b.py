"""Tiny random Wan2.2 I2V-A14B under the checkpoint's name: the ``wan2_2_i2v`` package's builder.

A model package's own builder is named after the package (``wan2_2_i2v``); the tests and docs name the tiny model
after the checkpoint it imitates (``python -m verl_omni.utils.tiny_models wan2_2_i2v_a14b --out DIR``), as
``wan2_2_a14b`` names the T2V A14B. Both names build the same files.
"""

from __future__ import annotations

from pathlib import Path


def build_tiny_wan2_2_i2v_a14b(out_dir: Path, seed: int = 0, dtype: str = "float32") -> Path:
    """Write a tiny random Wan2.2 I2V-A14B (``WanImageToVideoPipeline`` with ``transformer_2``, no image encoder)."""
    from verl_omni.pipelines.wan2_2_i2v.tiny_model import build_tiny_wan2_2_i2v

    return build_tiny_wan2_2_i2v(out_dir, seed, dtype)
