"""Tiny random Wan2.2 T2V-A14B (two experts): the two-expert variant of the ``wan2_2`` package's builder.

A model package holds one builder named after it; the variant is built here and named ``wan2_2_a14b``
(``python -m verl_omni.utils.tiny_models wan2_2_a14b --out DIR``).
"""

from __future__ import annotations

from pathlib import Path


def build_tiny_wan2_2_a14b(out_dir: Path, seed: int = 0, dtype: str = "float32") -> Path:
    """Write a tiny random two-expert Wan2.2 (``WanPipeline`` with ``transformer_2`` and ``boundary_ratio``)."""
    from verl_omni.pipelines.wan2_2.tiny_model import build_two_expert_wan

    return build_two_expert_wan(out_dir, seed, dtype)
