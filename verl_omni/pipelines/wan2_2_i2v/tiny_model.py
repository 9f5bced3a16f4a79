"""Tiny random Wan2.2 I2V-A14B in diffusers format: ``WanImageToVideoPipeline`` with two experts and no image encoder.

Laid out like the released ``Wan-AI/Wan2.2-I2V-A14B-Diffusers`` checkpoint: the T2V A14B's components (UMT5,
Wan2.1's 8x VAE, the UniPC scheduler config with flow shift 5) with ``boundary_ratio`` 0.9, no CLIP image encoder
(``image_dim`` unset) and transformers whose input takes the noise latents, the 4-channel first-frame mask and the
image's latent condition stacked on channels (the released 16 + 4 + 16 = 36). Only the widths and depths are tiny;
the two experts have different depths so that swapping them shows in any output.
"""

from __future__ import annotations

import logging
from pathlib import Path

from verl_omni.pipelines.wan2_2 import tiny_model as wan
from verl_omni.utils.tiny_models import components as parts

logger = logging.getLogger(__name__)

# the released I2V-A14B's model_index.json: the high-noise expert takes t >= 900
I2V_BOUNDARY_RATIO = 0.9
# the condition's mask channels: one per frame of a latent frame (the VAE's temporal compression)
MASK_CHANNELS = 4
IN_CHANNELS = wan.LATENT_CHANNELS + MASK_CHANNELS + wan.LATENT_CHANNELS


def build_tiny_wan2_2_i2v(out_dir: Path, seed: int = 0, dtype: str = "float32") -> Path:
    """Write a tiny random Wan2.2 I2V-A14B to ``out_dir`` (the same seed gives the same files); loadable with
    ``WanImageToVideoPipeline.from_pretrained(out_dir)`` (sides multiples of 16, frames 4k + 1)."""
    from diffusers import UniPCMultistepScheduler, WanImageToVideoPipeline

    tokenizer = parts.t5_tokenizer()
    out = parts.save_pipeline(
        WanImageToVideoPipeline,
        Path(out_dir),
        seed,
        dtype,
        {
            "transformer": lambda: wan._transformer(in_channels=IN_CHANNELS),
            "transformer_2": lambda: wan._transformer(num_layers=1, in_channels=IN_CHANNELS),
            "vae": wan._wan21_vae,
            "text_encoder": lambda: wan._umt5_encoder(tokenizer),
        },
        scheduler=UniPCMultistepScheduler(**wan.WAN_SCHEDULER_CONFIG),
        tokenizer=tokenizer,
        boundary_ratio=I2V_BOUNDARY_RATIO,
    )
    logger.info("tiny Wan2.2 I2V-A14B written to %s", out)
    return out
