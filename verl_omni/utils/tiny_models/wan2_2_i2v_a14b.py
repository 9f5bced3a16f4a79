"""Tiny random Wan2.2 I2V-A14B: the builder of the ``wan2_2_i2v`` package, under the model's name.

A model package's own builder is named after the package; this one is named after the checkpoint it imitates
(``python -m verl_omni.utils.tiny_models wan2_2_i2v_a14b --out DIR``), as ``wan2_2_a14b`` is.
"""

from __future__ import annotations

from pathlib import Path


def build_tiny_wan2_2_i2v_a14b(out_dir: Path, seed: int = 0, dtype: str = "float32") -> Path:
    """Write a tiny random Wan2.2 I2V-A14B (``WanImageToVideoPipeline`` with ``transformer_2``, no image encoder)."""
    from verl_omni.pipelines.wan2_2_i2v.tiny_model import build_i2v_a14b

    return build_i2v_a14b(out_dir, seed, dtype)
