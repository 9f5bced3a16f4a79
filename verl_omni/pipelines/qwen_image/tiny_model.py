"""Tiny random Qwen-Image in diffusers format (transformer, VAE, Qwen2.5-VL text encoder, tokenizer, scheduler).

The directory it writes has the layout of the real checkpoint (``model_index.json`` and one
subfolder per component), so ``diffusers.QwenImagePipeline.from_pretrained``, vLLM-Omni and the
trainer load it through the same code paths as the real model. Sizes follow diffusers' own
dummy Qwen-Image components, a little wider so that a reward is learnable in minutes on a CPU.
The scheduler carries the real Qwen-Image scheduler config (dynamic exponential shift, terminal
shift 0.02).
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from verl_omni.utils.tiny_models.tokenizer import build_qwen2_tokenizer

logger = logging.getLogger(__name__)

# scheduler/scheduler_config.json of the released Qwen-Image checkpoint.
QWEN_IMAGE_SCHEDULER_CONFIG = {
    "base_image_seq_len": 256,
    "base_shift": 0.5,
    "invert_sigmas": False,
    "max_image_seq_len": 8192,
    "max_shift": 0.9,
    "num_train_timesteps": 1000,
    "shift": 1.0,
    "shift_terminal": 0.02,
    "stochastic_sampling": False,
    "time_shift_type": "exponential",
    "use_beta_sigmas": False,
    "use_dynamic_shifting": True,
    "use_exponential_sigmas": False,
    "use_karras_sigmas": False,
}

TEXT_HIDDEN_SIZE = 32
LATENT_CHANNELS = 4


def _transformer():
    from diffusers import QwenImageTransformer2DModel

    return QwenImageTransformer2DModel(
        patch_size=2,
        in_channels=LATENT_CHANNELS * 4,
        out_channels=LATENT_CHANNELS,
        num_layers=2,
        attention_head_dim=32,
        num_attention_heads=2,
        joint_attention_dim=TEXT_HIDDEN_SIZE,
        guidance_embeds=False,
        axes_dims_rope=(8, 12, 12),
    )


def _vae():
    from diffusers import AutoencoderKLQwenImage

    return AutoencoderKLQwenImage(
        base_dim=LATENT_CHANNELS * 4,
        z_dim=LATENT_CHANNELS,
        dim_mult=[1, 2, 2],
        num_res_blocks=1,
        temperal_downsample=[False, True],
        latents_mean=[0.0] * LATENT_CHANNELS,
        latents_std=[1.0] * LATENT_CHANNELS,
    )


def _text_encoder(tokenizer):
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    ids = tokenizer.convert_tokens_to_ids
    config = Qwen2_5_VLConfig(
        text_config={
            "hidden_size": TEXT_HIDDEN_SIZE,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "num_key_value_heads": 2,
            "vocab_size": len(tokenizer),
            "rope_scaling": {"mrope_section": [2, 2, 4], "rope_type": "default", "type": "default"},
            "rope_theta": 1000000.0,
            "bos_token_id": ids("<|endoftext|>"),
            "eos_token_id": ids("<|im_end|>"),
            "pad_token_id": ids("<|endoftext|>"),
        },
        vision_config={"depth": 1, "hidden_size": 16, "intermediate_size": 16, "num_heads": 2, "out_hidden_size": 16},
        hidden_size=TEXT_HIDDEN_SIZE,
        vocab_size=len(tokenizer),
        vision_start_token_id=ids("<|vision_start|>"),
        vision_end_token_id=ids("<|vision_end|>"),
        vision_token_id=ids("<|vision_pad|>"),
        image_token_id=ids("<|image_pad|>"),
        video_token_id=ids("<|video_pad|>"),
        bos_token_id=ids("<|endoftext|>"),
        eos_token_id=ids("<|im_end|>"),
        pad_token_id=ids("<|endoftext|>"),
    )
    return Qwen2_5_VLForConditionalGeneration(config).eval()


def build_tiny_qwen_image(out_dir: Path, seed: int = 0, dtype: str = "float32") -> Path:
    """Write a tiny random Qwen-Image pipeline to ``out_dir``; the same seed gives the same weights.

    Args:
        out_dir: target directory (created; existing files are overwritten).
        seed: seeds every component's random init.
        dtype: dtype the weights are saved in. ``float32`` for CPU runs; ``bfloat16`` mirrors the
            released checkpoint, whose components load in bf16 (what a bf16 engine on GPU expects).

    Returns:
        ``out_dir``, loadable with ``QwenImagePipeline.from_pretrained(out_dir)``.
    """
    from diffusers import FlowMatchEulerDiscreteScheduler, QwenImagePipeline

    out_dir = Path(out_dir)
    tokenizer = build_qwen2_tokenizer()
    components = {}
    for offset, (name, make) in enumerate(
        [("transformer", _transformer), ("vae", _vae), ("text_encoder", lambda: _text_encoder(tokenizer))]
    ):
        torch.manual_seed(seed + offset)
        components[name] = make().to(getattr(torch, dtype))
    pipe = QwenImagePipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(**QWEN_IMAGE_SCHEDULER_CONFIG),
        tokenizer=tokenizer,
        **components,
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    pipe.save_pretrained(out_dir, safe_serialization=True)
    logger.info("tiny Qwen-Image written to %s", out_dir)
    return out_dir
