"""Tiny random step-distilled FLUX.2-klein: the ``flux2_klein`` package's builder with ``is_distilled: true``.

A model package holds one builder named after it; the variant is built here and named ``flux2_klein_distilled``
(``python -m verl_omni.utils.tiny_models flux2_klein_distilled --out DIR``).
"""

from __future__ import annotations

from pathlib import Path


def build_tiny_flux2_klein_distilled(out_dir: Path, seed: int = 0, dtype: str = "float32") -> Path:
    """Write a tiny random step-distilled FLUX.2-klein (``Flux2KleinPipeline`` with ``is_distilled: true``)."""
    from verl_omni.pipelines.flux2_klein.tiny_model import build_tiny_flux2_klein

    return build_tiny_flux2_klein(out_dir, seed, dtype, distilled=True)
