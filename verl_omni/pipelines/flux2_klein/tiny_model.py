"""Tiny random FLUX.2-klein in diffusers format (FLUX.2 transformer, FLUX.2 VAE, Qwen3 text encoder, scheduler).

Laid out like the released FLUX.2-klein checkpoints (``Flux2KleinPipeline``): a Qwen3 language model of
which the pipelines stack the hidden states of layers 9, 18 and 27 (so the tiny one has 28 layers, and
both pipelines run their default layer choice), the FLUX.2 autoencoder with its latent batch norm, a
transformer without a guidance embedding, and ``is_distilled`` in ``model_index.json``. So diffusers,
vLLM-Omni and the trainer load it through the code paths of the real model.
"""

from __future__ import annotations

import logging
from pathlib import Path

from verl_omni.utils.tiny_models import components as parts

logger = logging.getLogger(__name__)

# the released checkpoints' scheduler: dynamic shifting on, so the μ the pipelines compute
# (FLUX.2's empirical μ of the token count and step count) sets the shift
FLUX2_KLEIN_SCHEDULER_CONFIG = {
    "base_image_seq_len": 256,
    "base_shift": 0.5,
    "max_image_seq_len": 4096,
    "max_shift": 1.15,
    "num_train_timesteps": 1000,
    "shift": 3.0,
    "use_dynamic_shifting": True,
}
LATENT_CHANNELS = 4
TEXT_HIDDEN_SIZE = 32
# the pipelines' default ``text_encoder_out_layers`` is (9, 18, 27): hidden_states[27] needs 27 layers
TEXT_LAYERS = 28
# the pipelines stack three layers' states along the feature axis
TEXT_STACKED_LAYERS = 3


def _transformer():
    from diffusers import Flux2Transformer2DModel

    return Flux2Transformer2DModel(
        patch_size=1,
        in_channels=LATENT_CHANNELS * 4,
        num_layers=1,
        num_single_layers=1,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=TEXT_HIDDEN_SIZE * TEXT_STACKED_LAYERS,
        timestep_guidance_channels=32,
        axes_dims_rope=(4, 4, 4, 4),
        guidance_embeds=False,
    )


def _vae():
    from diffusers import AutoencoderKLFlux2

    return AutoencoderKLFlux2(
        down_block_types=("DownEncoderBlock2D",) * 3,
        up_block_types=("UpDecoderBlock2D",) * 3,
        block_out_channels=(8, 16, 16),
        layers_per_block=1,
        latent_channels=LATENT_CHANNELS,
        norm_num_groups=8,
        sample_size=32,
    ).eval()


def build_tiny_flux2_klein(out_dir: Path, seed: int = 0, dtype: str = "float32", distilled: bool = False) -> Path:
    """Write a tiny random FLUX.2-klein pipeline to ``out_dir``; the same seed gives the same files.

    ``distilled``: written as the step-distilled klein (``is_distilled: true``, no CFG) instead of the base model.
    Returns ``out_dir``, loadable with ``Flux2KleinPipeline.from_pretrained(out_dir)``.
    """
    from diffusers import FlowMatchEulerDiscreteScheduler, Flux2KleinPipeline

    tokenizer = parts.qwen3_tokenizer()
    out = parts.save_pipeline(
        Flux2KleinPipeline,
        Path(out_dir),
        seed,
        dtype,
        {
            "transformer": _transformer,
            "vae": _vae,
            "text_encoder": lambda: parts.qwen3_text_encoder(tokenizer, TEXT_HIDDEN_SIZE, TEXT_LAYERS),
        },
        scheduler=FlowMatchEulerDiscreteScheduler(**FLUX2_KLEIN_SCHEDULER_CONFIG),
        tokenizer=tokenizer,
        is_distilled=distilled,
    )
    logger.info("tiny FLUX.2-klein (distilled=%s) written to %s", distilled, out)
    return out
