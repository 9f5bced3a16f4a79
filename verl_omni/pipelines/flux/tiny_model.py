"""Tiny random FLUX.1-dev in diffusers format (MMDiT with guidance embedding, VAE, CLIP + T5, scheduler).

Laid out like the released FLUX.1-dev checkpoint (``FluxPipeline``: CLIP-L for the pooled vector,
T5 for the token embeddings, a guidance-distilled transformer with ``guidance_embeds``) with its
scheduler config (resolution-dependent shift), so diffusers, vLLM-Omni and the trainer load it
through the code paths of the real model.
"""

from __future__ import annotations

import logging
from pathlib import Path

from verl_omni.utils.tiny_models import components as parts

logger = logging.getLogger(__name__)

# scheduler/scheduler_config.json of the released FLUX.1-dev checkpoint
FLUX_SCHEDULER_CONFIG = {
    "base_image_seq_len": 256,
    "base_shift": 0.5,
    "max_image_seq_len": 4096,
    "max_shift": 1.15,
    "num_train_timesteps": 1000,
    "shift": 3.0,
    "use_dynamic_shifting": True,
}
LATENT_CHANNELS = 4
CLIP_HIDDEN_SIZE = 32
T5_D_MODEL = 64


def _transformer():
    from diffusers import FluxTransformer2DModel

    return FluxTransformer2DModel(
        patch_size=1,
        in_channels=LATENT_CHANNELS * 4,
        out_channels=LATENT_CHANNELS * 4,
        num_layers=1,
        num_single_layers=1,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=T5_D_MODEL,
        pooled_projection_dim=CLIP_HIDDEN_SIZE,
        guidance_embeds=True,
        axes_dims_rope=(4, 6, 6),
    )


def build_tiny_flux(out_dir: Path, seed: int = 0, dtype: str = "float32", pipeline_class=None) -> Path:
    """Write a tiny random FLUX.1-dev pipeline to ``out_dir``; the same seed gives the same files.

    ``pipeline_class``: the diffusers pipeline saved (default ``FluxPipeline``; FLUX.1-Kontext's builder passes
    ``FluxKontextPipeline``, same components). Returns ``out_dir``, loadable with its ``from_pretrained(out_dir)``.
    """
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline

    pipeline_class = pipeline_class or FluxPipeline
    clip, t5 = parts.clip_tokenizer(), parts.t5_tokenizer()
    out = parts.save_pipeline(
        pipeline_class,
        Path(out_dir),
        seed,
        dtype,
        {
            "transformer": _transformer,
            "vae": lambda: parts.autoencoder_kl(LATENT_CHANNELS, scaling_factor=0.3611, shift_factor=0.1159),
            "text_encoder": lambda: parts.clip_text_encoder(clip, CLIP_HIDDEN_SIZE),
            "text_encoder_2": lambda: parts.t5_text_encoder(t5, T5_D_MODEL),
        },
        scheduler=FlowMatchEulerDiscreteScheduler(**FLUX_SCHEDULER_CONFIG),
        tokenizer=clip,
        tokenizer_2=t5,
    )
    logger.info("tiny %s written to %s", pipeline_class.__name__, out)
    return out
