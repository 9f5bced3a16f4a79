"""Tiny random FLUX.2-klein in diffusers format (FLUX.2 transformer, FLUX.2 VAE, Qwen3 text encoder, scheduler).

Laid out like the released FLUX.2-klein checkpoints (``Flux2KleinPipeline``): a Qwen3 language model of
which the pipelines stack the hidden states of layers 9, 18 and 27 (so the tiny one has 28 layers, and
both pipelines run their default layer choice), the FLUX.2 autoencoder with its latent batch norm, a
transformer without a guidance embedding (those two and the scheduler written by FLUX.2-dev's builder's
:func:`~verl_omni.pipelines.flux2.tiny_model.save_flux2_pipeline`), and
``is_distilled`` in ``model_index.json``. So diffusers, vLLM-Omni and the trainer load it through the code paths
of the real model.
"""

from __future__ import annotations

import logging
from pathlib import Path

from verl_omni.pipelines.flux2.tiny_model import save_flux2_pipeline
from verl_omni.utils.tiny_models import components as parts

logger = logging.getLogger(__name__)

TEXT_HIDDEN_SIZE = 32
# the pipelines' default ``text_encoder_out_layers`` is (9, 18, 27): hidden_states[27] needs 27 layers
TEXT_LAYERS = 28


def build_tiny_flux2_klein(out_dir: Path, seed: int = 0, dtype: str = "float32", distilled: bool = False) -> Path:
    """Write a tiny random FLUX.2-klein pipeline to ``out_dir``; the same seed gives the same files.

    ``distilled``: written as the step-distilled klein (``is_distilled: true``, no CFG) instead of the base model.
    Returns ``out_dir``, loadable with ``Flux2KleinPipeline.from_pretrained(out_dir)``.
    """
    from diffusers import Flux2KleinPipeline

    tokenizer = parts.qwen3_tokenizer()
    out = save_flux2_pipeline(
        Flux2KleinPipeline,
        out_dir,
        seed,
        dtype,
        lambda: parts.qwen3_text_encoder(tokenizer, TEXT_HIDDEN_SIZE, TEXT_LAYERS),
        TEXT_HIDDEN_SIZE,
        guidance_embeds=False,
        tokenizer=tokenizer,
        is_distilled=distilled,
    )
    logger.info("tiny FLUX.2-klein (distilled=%s) written to %s", distilled, out)
    return out
