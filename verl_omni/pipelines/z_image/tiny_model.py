"""Tiny random Z-Image in diffusers format (single-stream DiT, VAE, Qwen3 text encoder, tokenizer, scheduler).

Laid out like the released Z-Image checkpoints (``ZImagePipeline``: a Qwen3 language model whose
second-to-last hidden states condition the transformer, FLUX's 16-channel VAE family, static shift
3.0), so diffusers, vLLM-Omni and the trainer load it through the code paths of the real model.
The tokenizer carries a Qwen3-style chat template (the pipeline renders every prompt with it).
"""

from __future__ import annotations

import logging
from pathlib import Path

from verl_omni.utils.tiny_models import components as parts

logger = logging.getLogger(__name__)

# scheduler/scheduler_config.json of the released Z-Image-Turbo checkpoint
Z_IMAGE_SCHEDULER_CONFIG = {"num_train_timesteps": 1000, "shift": 3.0, "use_dynamic_shifting": False}
LATENT_CHANNELS = 4
TEXT_HIDDEN_SIZE = 32


def _transformer():
    import torch
    from diffusers import ZImageTransformer2DModel

    model = ZImageTransformer2DModel(
        all_patch_size=(2,),
        all_f_patch_size=(1,),
        in_channels=LATENT_CHANNELS,
        dim=32,
        n_layers=2,
        n_refiner_layers=1,
        n_heads=2,
        n_kv_heads=2,
        cap_feat_dim=TEXT_HIDDEN_SIZE,
        axes_dims=[4, 6, 6],
        axes_lens=[1024, 64, 64],
    )
    # the padding tokens are created with torch.empty (the released ones are trained): uninitialised memory
    # would make the builder non-deterministic and now and then put NaN into the sequence
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("pad_token"):
                torch.nn.init.normal_(param, std=0.02)
    return model


def build_tiny_z_image(out_dir: Path, seed: int = 0, dtype: str = "float32") -> Path:
    """Write a tiny random Z-Image pipeline to ``out_dir``; the same seed gives the same files.

    Returns ``out_dir``, loadable with ``ZImagePipeline.from_pretrained(out_dir)``.
    """
    from diffusers import FlowMatchEulerDiscreteScheduler, ZImagePipeline

    tokenizer = parts.qwen3_tokenizer()
    out = parts.save_pipeline(
        ZImagePipeline,
        Path(out_dir),
        seed,
        dtype,
        {
            "transformer": _transformer,
            "vae": lambda: parts.autoencoder_kl(LATENT_CHANNELS, scaling_factor=0.3611, shift_factor=0.1159),
            "text_encoder": lambda: parts.qwen3_text_encoder(tokenizer, TEXT_HIDDEN_SIZE),
        },
        scheduler=FlowMatchEulerDiscreteScheduler(**Z_IMAGE_SCHEDULER_CONFIG),
        tokenizer=tokenizer,
    )
    logger.info("tiny Z-Image written to %s", out)
    return out
