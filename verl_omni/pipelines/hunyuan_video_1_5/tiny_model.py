"""Tiny random HunyuanVideo-1.5 (text-to-video, and image-to-video with its SigLIP encoder) in diffusers format.

Laid out like the released ``hunyuanvideo-community/HunyuanVideo-1.5-480p_t2v`` / ``-480p_i2v`` checkpoints: a
Qwen2.5-VL text model (``text_encoder``, ChatML template), the glyph encoder (ByT5 tokenizer + T5 encoder,
``text_encoder_2``), the 16x spatial / 4x temporal HunyuanVideo-1.5 VAE, a flow-match Euler scheduler with the
480p flow shift, diffusers' CFG guider config and a transformer whose input is the noise latents, the condition
latents and their 1-channel mask stacked on channels (the released 32 + 32 + 1 = 65). The image-to-video layout adds
a SigLIP vision model and its processor. Only widths and depths are tiny; the text-to-video transformer keeps the
released image width (1152): both pipelines hand it zero image tokens of that width.
"""

from __future__ import annotations

import logging
from pathlib import Path

from verl_omni.utils.tiny_models import components as parts

logger = logging.getLogger(__name__)

LATENT_CHANNELS = 4
QWEN_HIDDEN = 32
BYT5_D_MODEL = 32
# the released transformer's image_embed_dim: what both pipelines' zero (text-to-video) image tokens are wide
RELEASED_IMAGE_EMBED_DIM = 1152
SIGLIP_HIDDEN = 32
# the released 480p checkpoints' scheduler config: flow matching with a static shift of 5
SCHEDULER_CONFIG = {"num_train_timesteps": 1000, "shift": 5.0}
# the released guider config's guidance_scale (classic CFG)
GUIDANCE_SCALE = 6.0


def _transformer(image_embed_dim: int):
    from diffusers import HunyuanVideo15Transformer3DModel

    return HunyuanVideo15Transformer3DModel(
        in_channels=2 * LATENT_CHANNELS + 1,
        out_channels=LATENT_CHANNELS,
        num_attention_heads=2,
        attention_head_dim=24,
        num_layers=2,
        num_refiner_layers=1,
        mlp_ratio=2.0,
        patch_size=1,
        patch_size_t=1,
        text_embed_dim=QWEN_HIDDEN,
        text_embed_2_dim=BYT5_D_MODEL,
        image_embed_dim=image_embed_dim,
        # time, height, width parts of a head's rotary embedding (the released 16 + 56 + 56 of 128)
        rope_axes_dim=(8, 8, 8),
        # the side of the size buckets diffusers' image-to-video pipeline picks from (the released 480p's 640): a
        # 32-pixel source image samples at 32², not at 640²
        target_size=32,
    )


def _vae():
    from diffusers import AutoencoderKLHunyuanVideo15

    return AutoencoderKLHunyuanVideo15(
        latent_channels=LATENT_CHANNELS,
        block_out_channels=(8, 8, 16, 16, 16),
        layers_per_block=1,
        spatial_compression_ratio=16,
        temporal_compression_ratio=4,
    ).eval()


def _text_encoder(tokenizer):
    from transformers import Qwen2_5_VLTextConfig, Qwen2_5_VLTextModel

    ids = tokenizer.convert_tokens_to_ids
    config = Qwen2_5_VLTextConfig(
        vocab_size=len(tokenizer),
        hidden_size=QWEN_HIDDEN,
        intermediate_size=2 * QWEN_HIDDEN,
        # the pipelines read the hidden states 3 from the end
        num_hidden_layers=3,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]},
        bos_token_id=ids("<|endoftext|>"),
        eos_token_id=ids("<|im_end|>"),
        pad_token_id=ids("<|endoftext|>"),
    )
    return Qwen2_5_VLTextModel(config).eval()


def _glyph_encoder(tokenizer):
    from transformers import T5Config, T5EncoderModel

    config = T5Config(
        vocab_size=len(tokenizer),
        d_model=BYT5_D_MODEL,
        d_kv=16,
        d_ff=2 * BYT5_D_MODEL,
        num_layers=1,
        num_heads=2,
        relative_attention_num_buckets=8,
        feed_forward_proj="gated-gelu",
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.pad_token_id,
    )
    return T5EncoderModel(config).eval()


def _components(image_embed_dim: int) -> tuple[dict, dict]:
    """The modules to build (name -> factory) and the fixed parts (tokenizers, scheduler, guider)."""
    from diffusers import ClassifierFreeGuidance, FlowMatchEulerDiscreteScheduler
    from transformers import ByT5Tokenizer

    tokenizer, glyph_tokenizer = parts.qwen3_tokenizer(), ByT5Tokenizer()
    makers = {
        "transformer": lambda: _transformer(image_embed_dim),
        "vae": _vae,
        "text_encoder": lambda: _text_encoder(tokenizer),
        "text_encoder_2": lambda: _glyph_encoder(glyph_tokenizer),
    }
    fixed = {
        "tokenizer": tokenizer,
        "tokenizer_2": glyph_tokenizer,
        "scheduler": FlowMatchEulerDiscreteScheduler(**SCHEDULER_CONFIG),
        "guider": ClassifierFreeGuidance(guidance_scale=GUIDANCE_SCALE),
    }
    return makers, fixed


def build_tiny_hunyuan_video_1_5(out_dir: Path, seed: int = 0, dtype: str = "float32") -> Path:
    """Write a tiny random HunyuanVideo-1.5 text-to-video pipeline to ``out_dir`` (the same seed gives the same
    files); loadable with ``HunyuanVideo15Pipeline.from_pretrained(out_dir)`` (sides multiples of 16, frames 4k + 1)."""
    from diffusers import HunyuanVideo15Pipeline

    makers, fixed = _components(RELEASED_IMAGE_EMBED_DIM)
    out = parts.save_pipeline(HunyuanVideo15Pipeline, Path(out_dir), seed, dtype, makers, **fixed)
    logger.info("tiny HunyuanVideo-1.5 T2V written to %s", out)
    return out


def _siglip():
    from transformers import SiglipVisionConfig, SiglipVisionModel

    config = SiglipVisionConfig(
        hidden_size=SIGLIP_HIDDEN,
        intermediate_size=2 * SIGLIP_HIDDEN,
        num_hidden_layers=1,
        num_attention_heads=2,
        image_size=28,
        patch_size=14,
    )
    return SiglipVisionModel(config).eval()


def build_tiny_i2v(out_dir: Path, seed: int = 0, dtype: str = "float32") -> Path:
    """A tiny random HunyuanVideo-1.5 image-to-video pipeline (``HunyuanVideo15ImageToVideoPipeline``: the T2V
    components, a SigLIP vision model of 4 tokens and its processor at 28 px); ``python -m
    verl_omni.utils.tiny_models hunyuan_video_1_5_i2v`` names it."""
    from diffusers import HunyuanVideo15ImageToVideoPipeline
    from transformers import SiglipImageProcessor

    makers, fixed = _components(SIGLIP_HIDDEN)
    makers["image_encoder"] = _siglip
    fixed["feature_extractor"] = SiglipImageProcessor(size={"height": 28, "width": 28})
    out = parts.save_pipeline(HunyuanVideo15ImageToVideoPipeline, Path(out_dir), seed, dtype, makers, **fixed)
    logger.info("tiny HunyuanVideo-1.5 I2V written to %s", out)
    return out
