"""Tiny random Stable Diffusion 3.5 in diffusers format (MMDiT, VAE, two CLIP + one T5 encoder, scheduler).

Laid out like the released SD3.5 checkpoints (``StableDiffusion3Pipeline``, three tokenizers and
text encoders), with SD3.5's transformer features (dual attention in the first block, RMS q/k
norm) and its scheduler config (static shift 3.0), so diffusers, vLLM-Omni and the trainer load it
through the code paths of the real model.
"""

from __future__ import annotations

import logging
from pathlib import Path

from verl_omni.utils.tiny_models import components as parts

logger = logging.getLogger(__name__)

# scheduler/scheduler_config.json of the released SD3.5 Medium and Large checkpoints
SD3_SCHEDULER_CONFIG = {"num_train_timesteps": 1000, "shift": 3.0}
LATENT_CHANNELS = 4
CLIP_HIDDEN_SIZE = 32
T5_D_MODEL = 64


def _transformer():
    from diffusers import SD3Transformer2DModel

    return SD3Transformer2DModel(
        sample_size=16,
        patch_size=2,
        in_channels=LATENT_CHANNELS,
        out_channels=LATENT_CHANNELS,
        num_layers=2,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=T5_D_MODEL,
        caption_projection_dim=32,
        pooled_projection_dim=2 * CLIP_HIDDEN_SIZE,
        # vLLM-Omni's engine warms up with a 512² image: 64 patches per side with the tiny 4x VAE
        pos_embed_max_size=64,
        dual_attention_layers=(0,),
        qk_norm="rms_norm",
    )


def build_tiny_sd3(out_dir: Path, seed: int = 0, dtype: str = "float32") -> Path:
    """Write a tiny random SD3.5 pipeline to ``out_dir``; the same seed gives the same files.

    Returns ``out_dir``, loadable with ``StableDiffusion3Pipeline.from_pretrained(out_dir)``.
    """
    from diffusers import FlowMatchEulerDiscreteScheduler, StableDiffusion3Pipeline

    clip, t5 = parts.clip_tokenizer(), parts.t5_tokenizer()
    out = parts.save_pipeline(
        StableDiffusion3Pipeline,
        Path(out_dir),
        seed,
        dtype,
        {
            "transformer": _transformer,
            "vae": lambda: parts.autoencoder_kl(LATENT_CHANNELS, scaling_factor=1.5305, shift_factor=0.0609),
            "text_encoder": lambda: parts.clip_text_encoder(clip, CLIP_HIDDEN_SIZE, with_projection=True),
            "text_encoder_2": lambda: parts.clip_text_encoder(clip, CLIP_HIDDEN_SIZE, with_projection=True),
            "text_encoder_3": lambda: parts.t5_text_encoder(t5, T5_D_MODEL),
        },
        scheduler=FlowMatchEulerDiscreteScheduler(**SD3_SCHEDULER_CONFIG),
        tokenizer=clip,
        tokenizer_2=clip,
        tokenizer_3=t5,
    )
    logger.info("tiny SD3.5 written to %s", out)
    return out
