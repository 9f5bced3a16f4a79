"""Tiny random Wan2.2 TI2V-5B in diffusers format (3-D DiT, Wan VAE, UMT5 text encoder, tokenizer, scheduler).

Laid out like the released ``Wan-AI/Wan2.2-TI2V-5B-Diffusers`` checkpoint (``WanPipeline`` with
``expand_timesteps``, one transformer, no ``transformer_2``): its VAE is the 5B's residual Wan VAE
with 2×2 pixel patchify (12 input channels), 8× spatial down-sampling (so 16 pixels per latent
cell) and 4× temporal compression (``num_frames = 4k + 1``), and its scheduler config is the
released UniPC one (``flow_shift`` 5.0), so diffusers, vLLM-Omni and the trainer read the same
facts from it as from the real model. Only the widths and depths are tiny.
"""

from __future__ import annotations

import logging
from pathlib import Path

from verl_omni.utils.tiny_models import components as parts

logger = logging.getLogger(__name__)

# scheduler/scheduler_config.json of the released TI2V-5B checkpoint (UniPC, flow sigmas, shift 5)
WAN_SCHEDULER_CONFIG = {
    "num_train_timesteps": 1000,
    "prediction_type": "flow_prediction",
    "use_flow_sigmas": True,
    "flow_shift": 5.0,
}
LATENT_CHANNELS = 4
UMT5_D_MODEL = 32
# the 5B VAE: pixels patchified 2×2 before the encoder, three spatial and two temporal down-samplings
VAE_PATCH_SIZE = 2
VAE_SCALE_FACTOR_SPATIAL = 16
VAE_SCALE_FACTOR_TEMPORAL = 4


def _transformer(num_layers: int = 2, in_channels: int = LATENT_CHANNELS):
    from diffusers import WanTransformer3DModel

    return WanTransformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=2,
        # the rotary embedding splits a head into time, height and width parts: diffusers builds them as
        # d - 2·2⌊d/6⌋, 2⌊d/6⌋, 2⌊d/6⌋ and vLLM-Omni 0.26 slices them as d - 2⌊d/3⌋, ⌊d/3⌋, ⌊d/3⌋, which agree only
        # when 2⌊d/6⌋ = ⌊d/3⌋ (the released 128: 44 + 42 + 42; 16 would give 8 + 4 + 4 against 6 + 5 + 5)
        attention_head_dim=24,
        in_channels=in_channels,
        out_channels=LATENT_CHANNELS,
        text_dim=UMT5_D_MODEL,
        freq_dim=16,
        ffn_dim=64,
        num_layers=num_layers,
        cross_attn_norm=True,
        qk_norm="rms_norm_across_heads",
        eps=1e-6,
        rope_max_seq_len=1024,
    )


def _vae():
    from diffusers import AutoencoderKLWan

    return AutoencoderKLWan(
        base_dim=8,
        decoder_base_dim=8,
        z_dim=LATENT_CHANNELS,
        dim_mult=[1, 2, 2, 2],
        num_res_blocks=1,
        temperal_downsample=[False, True, True],
        is_residual=True,
        in_channels=3 * VAE_PATCH_SIZE**2,
        out_channels=3 * VAE_PATCH_SIZE**2,
        patch_size=VAE_PATCH_SIZE,
        scale_factor_spatial=VAE_SCALE_FACTOR_SPATIAL,
        scale_factor_temporal=VAE_SCALE_FACTOR_TEMPORAL,
        latents_mean=[0.1, -0.2, 0.05, 0.0][:LATENT_CHANNELS],
        latents_std=[1.5, 2.0, 1.2, 1.8][:LATENT_CHANNELS],
    ).eval()


def _umt5_encoder(tokenizer):
    return parts.t5_text_encoder(tokenizer, UMT5_D_MODEL, num_heads=2, umt5=True)


def build_tiny_wan2_2(out_dir: Path, seed: int = 0, dtype: str = "float32") -> Path:
    """Write a tiny random Wan2.2 TI2V-5B pipeline to ``out_dir``; the same seed gives the same files.

    Returns ``out_dir``, loadable with ``WanPipeline.from_pretrained(out_dir)`` (smallest size 32², frames 4k + 1).
    """
    from diffusers import UniPCMultistepScheduler, WanPipeline

    tokenizer = parts.t5_tokenizer()
    out = parts.save_pipeline(
        WanPipeline,
        Path(out_dir),
        seed,
        dtype,
        {"transformer": _transformer, "vae": _vae, "text_encoder": lambda: _umt5_encoder(tokenizer)},
        scheduler=UniPCMultistepScheduler(**WAN_SCHEDULER_CONFIG),
        tokenizer=tokenizer,
        expand_timesteps=True,
    )
    logger.info("tiny Wan2.2 TI2V-5B written to %s", out)
    return out


# the two-expert A14B: its boundary (the high-noise expert takes t >= 875) and Wan2.1's VAE (8x, no patchify)
A14B_BOUNDARY_RATIO = 0.875


def _wan21_vae():
    from diffusers import AutoencoderKLWan

    return AutoencoderKLWan(
        base_dim=8,
        z_dim=LATENT_CHANNELS,
        dim_mult=[1, 2, 2, 2],
        num_res_blocks=1,
        temperal_downsample=[False, True, True],
        latents_mean=[0.1, -0.2, 0.05, 0.0][:LATENT_CHANNELS],
        latents_std=[1.5, 2.0, 1.2, 1.8][:LATENT_CHANNELS],
    ).eval()


def build_two_expert_wan(out_dir: Path, seed: int = 0, dtype: str = "float32") -> Path:
    """A tiny random Wan2.2 T2V-A14B (``transformer`` for the high-noise steps, ``transformer_2`` below the boundary,
    Wan2.1's 8x VAE): the layout of ``Wan-AI/Wan2.2-T2V-A14B-Diffusers``, loadable with ``WanPipeline``. The two
    experts have different depths so that swapping them is visible in any output."""
    from diffusers import UniPCMultistepScheduler, WanPipeline

    tokenizer = parts.t5_tokenizer()
    out = parts.save_pipeline(
        WanPipeline,
        Path(out_dir),
        seed,
        dtype,
        {
            "transformer": _transformer,
            "transformer_2": lambda: _transformer(num_layers=1),
            "vae": _wan21_vae,
            "text_encoder": lambda: _umt5_encoder(tokenizer),
        },
        scheduler=UniPCMultistepScheduler(**WAN_SCHEDULER_CONFIG),
        tokenizer=tokenizer,
        boundary_ratio=A14B_BOUNDARY_RATIO,
    )
    logger.info("tiny Wan2.2 T2V-A14B written to %s", out)
    return out
