"""Tiny random FLUX.1-Kontext: FLUX.1-dev's tiny components under ``FluxKontextPipeline``.

The released FLUX.1-Kontext-dev checkpoint has FLUX.1-dev's layout and configs (CLIP-L + T5, the guidance-
embedding transformer, the 16-channel VAE, the dynamic-shift scheduler), so diffusers' ``FluxKontextPipeline``,
vLLM-Omni's and the trainer load the tiny one through the real model's code paths.
"""

from __future__ import annotations

from pathlib import Path


def build_tiny_flux_kontext(out_dir: Path, seed: int = 0, dtype: str = "float32") -> Path:
    """Write a tiny random FLUX.1-Kontext pipeline to ``out_dir``; loadable with
    ``FluxKontextPipeline.from_pretrained(out_dir)``."""
    from diffusers import FluxKontextPipeline

    from verl_omni.pipelines.flux.tiny_model import build_tiny_flux

    return build_tiny_flux(out_dir, seed, dtype, pipeline_class=FluxKontextPipeline)
